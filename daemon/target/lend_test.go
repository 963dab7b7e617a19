package target

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/local"
	"tier0/daemon/nvme"
)

// lendCounter is a memory device that counts copies (ReadAt), loans and
// loans not yet returned.
type lendCounter struct {
	*local.Memory
	copies, loans, out atomic.Int64
}

type countedLoan struct {
	blockdev.Loan
	d *lendCounter
}

func (l countedLoan) Return() { l.d.out.Add(-1); l.Loan.Return() }

func (d *lendCounter) ReadAt(p []byte, off int64) (int, error) {
	d.copies.Add(1)
	return d.Memory.ReadAt(p, off)
}

func (d *lendCounter) LendAt(iov [][]byte, off, length int64) (blockdev.Loan, [][]byte, error) {
	l, iov, err := d.Memory.LendAt(iov, off, length)
	if err != nil {
		return nil, iov, err
	}
	d.loans.Add(1)
	d.out.Add(1)
	return countedLoan{l, d}, iov, nil
}

// TestReadsBorrowALendersMemory: a large read of a device that lends its
// memory (blockdev.Lender) is sent from the device's own memory, with and
// without data digests, and its loan is returned once the data is written
// (before the next response goes out); small reads still copy.
func TestReadsBorrowALendersMemory(t *testing.T) {
	mem, err := local.NewMemory(testSize, testBS)
	if err != nil {
		t.Fatal(err)
	}
	dev := &lendCounter{Memory: mem}
	was := lendReads
	lendReads = true
	t.Cleanup(func() { lendReads = was })
	_, addr := newTarget(t, Config{}, dev)
	for _, digest := range []uint8{0, nvme.DigestHeader | nvme.DigestData} {
		_, id := adminConnect(t, addr, digest, testHostNQN, testHostID)
		q := ioConnect(t, addr, digest, testHostNQN, testHostID, id, 1)
		data := make([]byte, 128<<10)
		for i := range data {
			data[i] = byte(i*7 + int(digest))
		}
		const slba = 64 // 32 KiB: the read spans three 64 KiB chunks
		if r := q.writeBlocks(1, slba, data, testBS, false); !r.cqe.Status.OK() {
			t.Fatalf("write: %v", r.cqe.Status)
		}
		copies, loans := dev.copies.Load(), dev.loans.Load()
		r := q.read(1, slba, uint32(len(data)/testBS), testBS)
		if !r.cqe.Status.OK() || !bytes.Equal(r.data, data) {
			t.Fatalf("digest %d: 128 KiB read of a lending device: %v, data equal %v", digest, r.cqe.Status, bytes.Equal(r.data, data))
		}
		if c, l := dev.copies.Load()-copies, dev.loans.Load()-loans; c != 0 || l != 1 {
			t.Fatalf("digest %d: a 128 KiB read made %d copies and %d loans, want 0 and 1", digest, c, l)
		}
		// The writer returns a round's loans before it writes the next
		// round, so once this response is here the read's loan is back.
		if r := q.read(1, slba, 8, testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, data[:8*testBS]) {
			t.Fatalf("digest %d: 4 KiB read: %v", digest, r.cqe.Status)
		}
		if n := dev.out.Load(); n != 0 {
			t.Fatalf("digest %d: %d loans outstanding after the next response, want 0", digest, n)
		}
		if c, l := dev.copies.Load()-copies, dev.loans.Load()-loans; c != 1 || l != 1 {
			t.Fatalf("digest %d: a 4 KiB read made %d copies and %d loans, want 1 copy (below lendMin)", digest, c, l)
		}
		q.nc.Close()
	}
}

// holdLender is a memory device that holds its first write of more than
// 4 KiB until released.
type holdLender struct {
	*local.Memory
	entered, gate chan struct{}
	once          sync.Once
	held          atomic.Bool
	fromBuf       bool // the held write's data was a slice of a larger buffer (the read buffer)
}

func (h *holdLender) WriteAt(p []byte, off int64) (int, error) {
	if len(p) > 4096 && h.held.CompareAndSwap(false, true) {
		h.fromBuf = cap(p) > len(p) // a request buffer is exactly 16 KiB
		close(h.entered)
		<-h.gate
	}
	return h.Memory.WriteAt(p, off)
}

func (h *holdLender) release() { h.once.Do(func() { close(h.gate) }) }

// TestWriteFromReadBufferSurvivesAStall: a 16 KiB write to a memory
// namespace whose data is written from the connection's read buffer
// (dataInBuffer) and is held in the device past the inline watchdog is
// not handed over to a new reader, which would read the next PDUs over
// its data: what the device writes is what the host sent.
func TestWriteFromReadBufferSurvivesAStall(t *testing.T) {
	mem, err := local.NewMemory(testSize, testBS)
	if err != nil {
		t.Fatal(err)
	}
	dev := &holdLender{Memory: mem, entered: make(chan struct{}), gate: make(chan struct{})}
	_, addr := newTarget(t, Config{}, dev)
	t.Cleanup(dev.release)
	_, id := adminConnect(t, addr, 0, testHostNQN, testHostID)
	q := ioConnect(t, addr, 0, testHostNQN, testHostID, id, 1)
	_ = q.nc.SetDeadline(time.Now().Add(20 * time.Second))
	a := bytes.Repeat([]byte{0xA5}, 16<<10) // one segment: all buffered at once
	s := rwSQE(nvme.CmdWrite, 1, 0, uint32(len(a)/testBS))
	s.CID, s.Flags = 1, nvme.SQEFlagSGLMeta
	s.DPTR = nvme.SGL{Length: uint32(len(a)), Type: nvme.SGLTypeTransport}
	q.sendCapsule(&s, nil)
	p, err := q.readPDU()
	if err != nil || p.h.Type != nvme.PDUR2T {
		t.Fatalf("R2T for the 16 KiB write: %v %v", p.h.Type, err)
	}
	r2t, _ := nvme.ParseR2T(p.hdr)
	q.sendH2C(1, r2t, a) // one PDU: all of it lands in the read buffer
	select {
	case <-dev.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the 16 KiB write never reached the device")
	}
	if !dev.fromBuf {
		t.Fatal("the 16 KiB write's data did not come from the read buffer: the test tests nothing")
	}
	// More PDUs, which a reader would read over the held write's data.
	c := bytes.Repeat([]byte{0x3C}, 4096)
	for i := 0; i < 4; i++ {
		s := rwSQE(nvme.CmdWrite, 1, uint64(1024+8*i), 8)
		s.CID, s.Flags = uint16(10+i), nvme.SQEFlagSGLMeta
		s.DPTR = nvme.SGL{Length: 4096, Type: nvme.SGLTypeInCapsule}
		q.sendCapsule(&s, c)
	}
	time.Sleep(20 * time.Millisecond) // the watchdog (1-2 ms) looks several times
	dev.release()
	for n := 0; n < 5; n++ {
		p, err := q.readPDU()
		if err != nil {
			t.Fatalf("response %d: %v", n, err)
		}
		if cqe, err := nvme.ParseCapsuleResp(p.hdr); err != nil || !cqe.Status.OK() {
			t.Fatalf("response %d: %+v %v, want success", n, cqe, err)
		}
	}
	if r := q.read(1, 0, uint32(len(a)/testBS), testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, a) {
		t.Fatalf("the held write's blocks: %v, data equal %v: its data was overwritten in the read buffer", r.cqe.Status, bytes.Equal(r.data, a))
	}
	if r := q.read(1, 1024, 8, testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, c) {
		t.Fatalf("a 4 KiB write after it: %v", r.cqe.Status)
	}
}
