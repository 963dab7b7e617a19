package fabric

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
)

// The fabric benchmark: tier0's host against tier0's target over loopback,
// memory-backed namespace, each workload as a ratio to a bare TCP baseline
// measured in the same run with the same number of connections, the same
// payload sizes and queue depth, and the same kind of memory device behind
// the server (ramDev), so that the ratio isolates the NVMe/TCP stack
// (framing, host and target) from TCP and the device.

const (
	benchDevSize = 256 << 20
	benchQueues  = 2
)

// ramDev is a plain memory block device without crash tracking, so that
// allocations per I/O measure the fabric, not the device.
type ramDev struct {
	data []byte
	bs   int
}

func newRAM(size int64, bs int) *ramDev { return &ramDev{data: make([]byte, size), bs: bs} }

func (r *ramDev) ReadAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(off, int64(len(p)), int64(len(r.data)), r.bs); err != nil {
		return 0, err
	}
	return copy(p, r.data[off:]), nil
}

func (r *ramDev) WriteAt(p []byte, off int64) (int, error) {
	if err := blockdev.CheckRange(off, int64(len(p)), int64(len(r.data)), r.bs); err != nil {
		return 0, err
	}
	return copy(r.data[off:], p), nil
}

func (r *ramDev) Flush() error { return nil }
func (r *ramDev) WriteZeroes(off, n int64) error {
	if err := blockdev.CheckRange(off, n, int64(len(r.data)), r.bs); err != nil {
		return err
	}
	clear(r.data[off : off+n])
	return nil
}
func (r *ramDev) Discard(off, n int64) error { return r.WriteZeroes(off, n) }
func (r *ramDev) Size() int64                { return int64(len(r.data)) }
func (r *ramDev) BlockSize() int             { return r.bs }
func (r *ramDev) Close() error               { return nil }

// ---- bare TCP baseline: 16-byte request/response headers, tag-matched,
// pipelined, same batching scheme as the host.

type tcpServer struct {
	l   net.Listener
	dev blockdev.Device
}

func startTCPServer(tb testing.TB, dev blockdev.Device) *tcpServer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &tcpServer{l: l, dev: dev}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	tb.Cleanup(func() { l.Close() })
	return s
}

func (s *tcpServer) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	bw := bufio.NewWriterSize(c, 64<<10)
	buf := make([]byte, 1<<20)
	var h [16]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		n := binary.LittleEndian.Uint32(h[4:])
		off := int64(binary.LittleEndian.Uint64(h[8:]))
		p := buf[:n]
		if h[2] == 1 {
			if _, err := io.ReadFull(br, p); err != nil {
				return
			}
			s.dev.WriteAt(p, off)
			binary.LittleEndian.PutUint32(h[4:], 0)
			bw.Write(h[:])
		} else {
			s.dev.ReadAt(p, off)
			bw.Write(h[:])
			bw.Write(p)
		}
		if br.Buffered() == 0 {
			if bw.Flush() != nil {
				return
			}
		}
	}
}

type tcpConn struct {
	c       net.Conn
	wmu     sync.Mutex
	bw      *bufio.Writer
	pending atomic.Int32
	free    chan uint16
	slots   []tcpSlot
}

type tcpSlot struct {
	rbuf []byte
	done chan struct{}
	hdr  [16]byte
}

type tcpClient struct {
	conns []*tcpConn
	rr    atomic.Uint32
}

func dialTCP(tb testing.TB, addr string, n, depth int) *tcpClient {
	cl := &tcpClient{}
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatal(err)
		}
		c.(*net.TCPConn).SetNoDelay(true)
		tc := &tcpConn{c: c, bw: bufio.NewWriterSize(c, 64<<10), free: make(chan uint16, depth), slots: make([]tcpSlot, depth)}
		for k := range tc.slots {
			tc.slots[k].done = make(chan struct{}, 1)
			tc.free <- uint16(k)
		}
		go tc.read()
		tb.Cleanup(func() { c.Close() })
		cl.conns = append(cl.conns, tc)
	}
	return cl
}

func (t *tcpConn) read() {
	br := bufio.NewReaderSize(t.c, 64<<10)
	var h [16]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return
		}
		tag := binary.LittleEndian.Uint16(h[0:])
		s := &t.slots[tag]
		if n := binary.LittleEndian.Uint32(h[4:]); n > 0 {
			if _, err := io.ReadFull(br, s.rbuf[:n]); err != nil {
				return
			}
		}
		s.done <- struct{}{}
	}
}

func (cl *tcpClient) do(p []byte, off int64, write bool) error {
	t := cl.conns[int(cl.rr.Add(1))%len(cl.conns)]
	tag := <-t.free
	s := &t.slots[tag]
	s.rbuf = p
	binary.LittleEndian.PutUint16(s.hdr[0:], tag)
	s.hdr[2] = 0
	if write {
		s.hdr[2] = 1
	}
	binary.LittleEndian.PutUint32(s.hdr[4:], uint32(len(p)))
	binary.LittleEndian.PutUint64(s.hdr[8:], uint64(off))
	t.pending.Add(1)
	t.wmu.Lock()
	_, err := t.bw.Write(s.hdr[:])
	if write && err == nil {
		_, err = t.bw.Write(p)
	}
	if t.pending.Add(-1) == 0 && err == nil {
		err = t.bw.Flush()
	}
	t.wmu.Unlock()
	if err != nil {
		return err
	}
	<-s.done
	t.free <- tag
	return nil
}

// ---- load runner

type workload struct {
	name   string
	size   int
	qd     int
	write  bool
	random bool
	ios    int // I/Os per measurement
}

// run issues w.ios I/Os of w.size bytes with w.qd in flight through do and
// returns the elapsed time and the heap allocations per I/O (runner, client
// and server together: all live in this process).
func (w workload) run(do func(p []byte, off int64, write bool) error) (time.Duration, float64, error) {
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	start := time.Now()
	for g := 0; g < w.qd; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			buf := blockdev.AlignedBuffer(w.size)
			r := rand.New(rand.NewPCG(uint64(g), 1))
			blocks := int64(benchDevSize / w.size)
			for {
				i := next.Add(1) - 1
				if i >= int64(w.ios) {
					return
				}
				off := (i % blocks) * int64(w.size)
				if w.random {
					off = r.Int64N(blocks) * int64(w.size)
				}
				if err := do(buf, off, w.write); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	el := time.Since(start)
	runtime.ReadMemStats(&ms1)
	if err, _ := firstErr.Load().(error); err != nil {
		return el, 0, err
	}
	return el, float64(ms1.Mallocs-ms0.Mallocs) / float64(w.ios), nil
}

var benchWorkloads = []workload{
	{name: "seqread-128k", size: 128 << 10, qd: 8, ios: 1024},
	{name: "seqwrite-128k", size: 128 << 10, qd: 8, write: true, ios: 1024},
	{name: "randread-4k-qd32", size: 4 << 10, qd: 32, random: true, ios: 20000},
}

// BenchmarkFabric reports, per workload: nvme and tcp throughput, their
// ratio (goal: >= 0.7 for 128 KiB sequential, >= 0.5 for 4 KiB random at QD
// 32) and the allocations per I/O of the NVMe/TCP stack (host + target, both
// in this process) beyond those of the baseline run.
func BenchmarkFabric(b *testing.B) {
	n := startNode(b, newRAM(benchDevSize, 4096), 1, nvme.ANAOptimized)
	ts := startTCPServer(b, newRAM(benchDevSize, 4096))
	c, err := host.Dial(context.Background(), fmt.Sprintf("127.0.0.1:%d", n.port), host.Options{SubNQN: tier0NQN, IOQueues: benchQueues, QueueDepth: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		b.Fatal(err)
	}
	cl := dialTCP(b, ts.l.Addr().String(), benchQueues, 64)
	nvmeDo := func(p []byte, off int64, write bool) error {
		if write {
			_, err := ns.WriteAt(p, off)
			return err
		}
		_, err := ns.ReadAt(p, off)
		return err
	}
	for _, w := range benchWorkloads {
		b.Run(w.name, func(b *testing.B) {
			var tN, tT time.Duration
			var allocs float64
			// baseline and NVMe alternate in short rounds so that load from
			// other processes on a shared machine hits both alike
			const rounds = 8
			part := w
			part.ios = w.ios / rounds
			for i := 0; i < b.N; i++ {
				for r := 0; r < rounds; r++ {
					el, ta, err := part.run(cl.do)
					if err != nil {
						b.Fatal(err)
					}
					tT += el
					el, a, err := part.run(nvmeDo)
					if err != nil {
						b.Fatal(err)
					}
					tN += el
					// the runner's own allocations (goroutines, buffers)
					// are the same in both runs; the baseline allocates
					// nothing per I/O
					allocs += max(a-ta, 0) / rounds
				}
			}
			ios := float64(part.ios * rounds * b.N)
			mib := ios * float64(w.size) / (1 << 20)
			b.ReportMetric(mib/tN.Seconds(), "nvme_MiB/s")
			b.ReportMetric(mib/tT.Seconds(), "tcp_MiB/s")
			b.ReportMetric(ios/tN.Seconds(), "nvme_IOPS")
			b.ReportMetric(tT.Seconds()/tN.Seconds(), "ratio")
			b.ReportMetric(allocs/float64(b.N), "allocs/io")
		})
	}
}
