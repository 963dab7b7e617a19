package target

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// ioQueue returns the target's connection of I/O queue qid of controller id.
func ioQueue(t *testing.T, tg *Target, id, qid uint16) *conn {
	t.Helper()
	tg.mu.Lock()
	ctrl := tg.ctrls[id]
	tg.mu.Unlock()
	if ctrl == nil {
		t.Fatalf("controller %d not found", id)
	}
	ctrl.mu.Lock()
	defer ctrl.mu.Unlock()
	return ctrl.ioq[qid]
}

// judgeFast makes every namespace count as fast (see nsLat.fast) until the
// test ends: on a loaded machine, under -race, even memory reads can
// average over inlineLimit and go to the workers instead of running inline.
func judgeFast(t *testing.T) {
	old := inlineLimit.Load()
	t.Cleanup(func() { inlineLimit.Store(old) })
	inlineLimit.Store(int64(time.Hour))
}

// TestInlineStallHandsOffReader: reads and writes of a fast namespace run
// inline on the connection's reader; when one of them blocks in the
// device, the reader's role passes to a new goroutine, so that the other
// commands of the same connection still complete while it is held, and the
// held one completes once the device lets it go.
func TestInlineStallHandsOffReader(t *testing.T) {
	judgeFast(t)
	mem := blockdev.NewMem(testSize, testBS)
	dev := newHoldFirstWrite(mem)
	tg, addr := newTarget(t, Config{}, dev)
	t.Cleanup(dev.release) // before the target's Close, which waits for the held write
	_, id := adminConnect(t, addr, 0, testHostNQN, testHostID)
	q := ioConnect(t, addr, 0, testHostNQN, testHostID, id, 1)
	for i := 0; i < 4; i++ { // fast reads: the namespace runs inline
		if r := q.read(1, uint64(i), 1, testBS); !r.cqe.Status.OK() {
			t.Fatalf("read %d: %v", i, r.cqe.Status)
		}
	}
	ioq := ioQueue(t, tg, id, 1)
	if n := ioq.stalled.Load(); n != 0 {
		t.Fatalf("%d stalled inline commands before any write", n)
	}

	held := bytes.Repeat([]byte{0xAA}, testBS)
	s := rwSQE(nvme.CmdWrite, 1, 7, 1)
	s.CID, s.Flags = 900, nvme.SQEFlagSGLMeta
	s.DPTR = nvme.SGL{Length: testBS, Type: nvme.SGLTypeInCapsule}
	q.sendCapsule(&s, held)
	select {
	case <-dev.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the held write never reached the device")
	}

	// The reader that executes the held write is stuck in the device:
	// these commands are only read, executed and answered because another
	// goroutine took its role over.
	other := bytes.Repeat([]byte{0x55}, testBS)
	errc := make(chan string, 1)
	go func() {
		for i := 0; i < 3; i++ {
			if r, err := q.try(rwSQE(nvme.CmdWrite, 1, uint64(10+i), 1), other, true); err != nil || !r.cqe.Status.OK() {
				errc <- fmt.Sprintf("write %d while one write is held: %v %v", i, r.cqe.Status, err)
				return
			}
			s := rwSQE(nvme.CmdRead, 1, uint64(10+i), 1)
			s.DPTR = nvme.SGL{Length: testBS, Type: nvme.SGLTypeTransport}
			if r, err := q.try(s, nil, false); err != nil || !r.cqe.Status.OK() || !bytes.Equal(r.data, other) {
				errc <- fmt.Sprintf("read %d while one write is held: %v %v, data equal %v", i, r.cqe.Status, err, bytes.Equal(r.data, other))
				return
			}
		}
		errc <- ""
	}()
	select {
	case e := <-errc:
		if e != "" {
			t.Fatal(e)
		}
	case <-time.After(10 * time.Second):
		q.nc.Close()
		t.Fatal("the other commands of the connection did not complete in 10 s while one write was held in the device: the reader is blocked")
	}
	if n := ioq.stalled.Load(); n != 1 {
		t.Fatalf("%d stalled inline commands while the write is held, want 1 (it ran inline on the reader)", n)
	}

	dev.release()
	_ = q.nc.SetDeadline(time.Now().Add(20 * time.Second))
	p, err := q.readPDU()
	if err != nil {
		t.Fatalf("response of the held write: %v", err)
	}
	cqe, err := nvme.ParseCapsuleResp(p.hdr)
	if err != nil || cqe.CID != 900 || !cqe.Status.OK() {
		t.Fatalf("response of the held write: %+v %v, want CID 900 success", cqe, err)
	}
	if r := q.read(1, 7, 1, testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, held) {
		t.Fatalf("read of the held write's block: %v, data equal %v", r.cqe.Status, bytes.Equal(r.data, held))
	}
	// the old reader counts itself out right after it sent the response
	for end := time.Now().Add(10 * time.Second); ioq.stalled.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d stalled inline commands 10 s after the held write returned, want 0", ioq.stalled.Load())
		}
	}
}

// TestC2HDataSuccessWithoutSQFlowControl: on a queue whose host disabled
// SQ flow control in Connect, a successful read ends with a C2HData PDU
// carrying SUCCESS and no CapsuleResp follows; on other queues the
// CapsuleResp still does.
func TestC2HDataSuccessWithoutSQFlowControl(t *testing.T) {
	mem := blockdev.NewMem(testSize, testBS)
	_, addr := newTarget(t, Config{}, mem)
	_, id := adminConnect(t, addr, 0, testHostNQN, testHostID)
	for _, noFlow := range []bool{true, false} {
		q := dialRaw(t, addr, 0)
		d := nvme.ConnectData{HostID: testHostID, CntlID: id, SubNQN: testSubNQN, HostNQN: testHostNQN}
		cmd := nvme.ConnectCmd{QID: 1, SQSize: 127}
		if noFlow {
			cmd.QID, cmd.CAttr = 2, connectNoSQFlow
		}
		if cqe := q.do(cmd.SQE(0), d.Append(nil), true).cqe; !cqe.Status.OK() {
			t.Fatalf("connect (SQ flow control disabled %v): %v", noFlow, cqe.Status)
		}
		_ = q.nc.SetDeadline(time.Now().Add(20 * time.Second))
		for cid := uint16(50); cid < 53; cid++ {
			s := rwSQE(nvme.CmdRead, 1, uint64(cid), 1)
			s.CID, s.Flags = cid, nvme.SQEFlagSGLMeta
			s.DPTR = nvme.SGL{Length: testBS, Type: nvme.SGLTypeTransport}
			q.sendCapsule(&s, nil)
			p, err := q.readPDU()
			if err != nil || p.h.Type != nvme.PDUC2HData {
				t.Fatalf("read CID %d: %v %v, want C2HData", cid, p.h.Type, err)
			}
			dp, _ := nvme.ParseDataPDU(p.hdr)
			if got := p.h.Flags&nvme.FlagDataSuccess != 0; got != noFlow || dp.CID != cid || p.h.Flags&nvme.FlagDataLast == 0 {
				t.Fatalf("read CID %d with SQ flow control disabled %v: C2HData CID %d flags %#x, want LAST and SUCCESS %v", cid, noFlow, dp.CID, p.h.Flags, noFlow)
			}
			if !noFlow {
				p, err := q.readPDU()
				if err != nil || p.h.Type != nvme.PDUCapsuleResp {
					t.Fatalf("read CID %d: %v %v after the data, want its CapsuleResp", cid, p.h.Type, err)
				}
			}
		}
	}
}
