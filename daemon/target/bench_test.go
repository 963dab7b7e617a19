package target

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"sync"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// BenchmarkTarget measures the target's cost per I/O over loopback at
// queue depth 16 on one I/O queue, against a bare TCP server moving the
// same bytes per I/O in the same run (metric "ratio" = bare time / target
// time; 1.0 means the NVMe/TCP target adds nothing).
func BenchmarkTarget(b *testing.B) {
	for _, w := range []struct {
		name  string
		write bool
		size  int
	}{{"read-4k", false, 4096}, {"write-4k", true, 4096}, {"read-128k", false, 128 << 10}, {"write-128k", true, 128 << 10}} {
		b.Run(w.name, func(b *testing.B) {
			dev := newRAM(64<<20, 4096)
			_, addr := newTarget(b, Config{Logger: nil, InlineDataSize: 16 << 10}, dev)
			_, cntlid := adminConnect(b, addr, 0, testHostNQN, testHostID)
			q := ioConnect(b, addr, 0, testHostNQN, testHostID, cntlid, 1)
			bare := startBare(b, w.write, w.size)
			b.SetBytes(int64(w.size))
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			pipeline(b, q.nc, q.br, b.N, 16, w.write, w.size)
			tgt := time.Since(start)
			b.StopTimer()
			nc, err := net.Dial("tcp", bare)
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			start = time.Now()
			bareLoop(b, nc, b.N, 16, w.write, w.size)
			base := time.Since(start)
			b.ReportMetric(float64(base)/float64(tgt), "ratio")
		})
	}
}

// pipeline keeps depth commands in flight until n complete.
func pipeline(b *testing.B, nc net.Conn, br *bufio.Reader, n, depth int, write bool, size int) {
	bs := 4096
	_ = nc.SetDeadline(time.Time{})
	data := make([]byte, size)
	errc := make(chan error, 1)
	credits := make(chan uint16, depth)
	for i := 0; i < depth; i++ {
		credits <- uint16(1000 + i)
	}
	go func() {
		bw := bufio.NewWriterSize(nc, 256<<10)
		var hdr []byte
		for i := 0; i < n; i++ {
			cid := <-credits
			s := rwSQE(nvme.CmdRead, 1, uint64(i*size/bs%(32<<20/bs)), uint32(size/bs))
			s.CID, s.Flags = cid, nvme.SQEFlagSGLMeta
			s.DPTR = nvme.SGL{Length: uint32(size), Type: nvme.SGLTypeTransport}
			inline := write && size <= 16<<10
			if write {
				s.Opcode = nvme.CmdWrite
				if inline {
					s.DPTR.Type = nvme.SGLTypeInCapsule
				}
			}
			dl := 0
			if inline {
				dl = size
			}
			hdr = nvme.AppendCapsuleCmd(hdr[:0], &s, dl, 0)
			bw.Write(hdr)
			if inline {
				bw.Write(data)
			}
			if len(credits) == 0 {
				if err := bw.Flush(); err != nil {
					errc <- err
					return
				}
			}
		}
		errc <- bw.Flush()
	}()
	h := make([]byte, 24)
	buf := make([]byte, size+64)
	h2c := make([]byte, 0, 32)
	var wmu = make(chan struct{}, 1)
	wmu <- struct{}{}
	for done := 0; done < n; {
		if _, err := io.ReadFull(br, h[:8]); err != nil {
			b.Fatal(err)
		}
		plen := int(binary.LittleEndian.Uint32(h[4:]))
		if _, err := io.ReadFull(br, h[8:24]); err != nil {
			b.Fatal(err)
		}
		switch nvme.PDUType(h[0]) {
		case nvme.PDUC2HData:
			if _, err := io.ReadFull(br, buf[:plen-24]); err != nil {
				b.Fatal(err)
			}
		case nvme.PDUR2T:
			r, _ := nvme.ParseR2T(h)
			p := nvme.DataPDU{Type: nvme.PDUH2CData, Flags: nvme.FlagDataLast, CID: r.CID, TTag: r.TTag, Length: r.Length}.Append(h2c[:0], 0)
			<-wmu
			bufs := net.Buffers{p, data[:r.Length]}
			bufs.WriteTo(nc)
			wmu <- struct{}{}
		case nvme.PDUCapsuleResp:
			cqe, _ := nvme.ParseCapsuleResp(h)
			if !cqe.Status.OK() {
				b.Fatalf("I/O failed: %v", cqe.Status)
			}
			done++
			credits <- cqe.CID
		default:
			b.Fatalf("unexpected PDU %v", nvme.PDUType(h[0]))
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// startBare runs a TCP server that answers each 72-byte command (plus
// size bytes for writes) with 24 bytes (plus size bytes for reads),
// backed by the same kind of memory device.
func startBare(b *testing.B, write bool, size int) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	dev := newRAM(64<<20, 4096)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		br := bufio.NewReaderSize(nc, 64<<10)
		bw := bufio.NewWriterSize(nc, 64<<10)
		req := make([]byte, 72)
		data := make([]byte, size)
		resp := make([]byte, 24)
		for i := 0; ; i++ {
			if _, err := io.ReadFull(br, req); err != nil {
				return
			}
			off := int64(i*size) % (32 << 20)
			if write {
				if _, err := io.ReadFull(br, data); err != nil {
					return
				}
				dev.WriteAt(data, off)
			} else {
				dev.ReadAt(data, off)
				bw.Write(resp)
				bw.Write(data)
			}
			bw.Write(resp)
			if br.Buffered() == 0 {
				bw.Flush()
			}
		}
	}()
	return l.Addr().String()
}

func bareLoop(b *testing.B, nc net.Conn, n, depth int, write bool, size int) {
	go func() {
		bw := bufio.NewWriterSize(nc, 256<<10)
		req := make([]byte, 72)
		data := make([]byte, size)
		for i := 0; i < n; i++ {
			bw.Write(req)
			if write {
				bw.Write(data)
			}
			if i%depth == depth-1 {
				bw.Flush()
			}
		}
		bw.Flush()
	}()
	br := bufio.NewReaderSize(nc, 64<<10)
	want := 24
	if !write {
		want += 24 + size
	}
	buf := make([]byte, want)
	for i := 0; i < n; i++ {
		if _, err := io.ReadFull(br, buf); err != nil {
			b.Fatal(fmt.Errorf("bare baseline: %w", err))
		}
	}
}

// ram is a plain memory Device for benchmarks (blockdev.Mem keeps every
// unflushed version of a block for crash simulation, which is not what a
// benchmark should measure).
type ram struct {
	mu   sync.RWMutex
	data []byte
	bs   int
}

func newRAM(size int64, bs int) *ram { return &ram{data: make([]byte, size), bs: bs} }

func (r *ram) ReadAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(off, int64(len(p)), int64(len(r.data)), r.bs); err != nil {
		return 0, err
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return copy(p, r.data[off:]), nil
}

func (r *ram) WriteAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(off, int64(len(p)), int64(len(r.data)), r.bs); err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return copy(r.data[off:], p), nil
}

func (r *ram) WriteZeroes(off, n int64) error {
	if err := blockdev.CheckRange(off, n, int64(len(r.data)), r.bs); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.data[off : off+n])
	return nil
}

func (r *ram) Discard(off, n int64) error { return r.WriteZeroes(off, n) }
func (r *ram) Flush() error               { return nil }
func (r *ram) Size() int64                { return int64(len(r.data)) }
func (r *ram) BlockSize() int             { return r.bs }
func (r *ram) Close() error               { return nil }
