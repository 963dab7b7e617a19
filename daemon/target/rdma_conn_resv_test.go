package target

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
)

// TestRDMAMemberReservationsAndErrors: what a node needs of a member it
// imports over RDMA (daemon/node's Member), through tier0's RDMA host
// against the target's RDMA transport: register, acquire, report and
// preempt-and-abort; a non-holder's write is fenced (blockdev.ErrFenced,
// not a path error); FUA writes land; and a lost queue is a path error
// (the member is unreachable, not failed).
func TestRDMAMemberReservationsAndErrors(t *testing.T) {
	dev := blockdev.NewMem(testSize, testBS)
	tg, acc := newRDMATarget(t, Config{}, dev)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(hostNQN string, id [16]byte) *rdma.Namespace {
		t.Helper()
		c, err := rdma.Connect(ctx, "10.9.8.7:4420", rdma.Options{SubNQN: testSubNQN, HostNQN: hostNQN, HostID: id, Dial: acc.dial, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("connect %s: %v", hostNQN, err)
		}
		t.Cleanup(func() { c.Close() })
		ns, err := c.Namespace(1)
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	a, b := open(testHostNQN, testHostID), open(testHostNQN2, testHostID2)
	if a.NSID() != 1 {
		t.Errorf("NSID %d, want 1", a.NSID())
	}
	if err := a.Register(nvme.ResvRegister, 0, 5, false); err != nil {
		t.Fatalf("register 5: %v", err)
	}
	if err := a.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, 5, 0); err != nil {
		t.Fatalf("acquire with 5: %v", err)
	}
	w := bytes.Repeat([]byte{0xA5}, 8192)
	if _, err := a.WriteAtFUA(w, 0); err != nil {
		t.Fatalf("holder's FUA write: %v", err)
	}
	got := make([]byte, len(w))
	dev.ReadAt(got, 0)
	if !bytes.Equal(got, w) {
		t.Fatal("the holder's FUA write is not on the device")
	}
	_, err := b.WriteAt(bytes.Repeat([]byte{0x5A}, 4096), 0)
	if !errors.Is(err, blockdev.ErrFenced) || rdma.IsPathError(err) {
		t.Fatalf("a non-holder's write: %v; want blockdev.ErrFenced, not a path error", err)
	}
	st, err := b.Report()
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	var held uint64
	for _, r := range st.Registrants {
		if r.Holder {
			held = r.RKey
			if r.HostID != testHostID {
				t.Errorf("holder host ID %x, want host one's", r.HostID)
			}
		}
	}
	if held != 5 {
		t.Fatalf("report: holder key %d, want 5 (%+v)", held, st)
	}
	// the next epoch takes over: host one is fenced
	if err := b.Register(nvme.ResvRegister, 0, 6, false); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(nvme.ResvPreemptAndAbort, nvme.ResvWriteExclusive, 6, 5); err != nil {
		t.Fatalf("preempt-and-abort of 5 by 6: %v", err)
	}
	if _, err := a.WriteAt(w, 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("the preempted host's write: %v; want blockdev.ErrFenced", err)
	}
	if _, err := b.WriteAtFUA(w[:4096], 4096); err != nil {
		t.Fatalf("new holder's write: %v", err)
	}
	// the target goes away: a path error
	tg.Close()
	_, err = b.ReadAt(got[:4096], 0)
	if err == nil || !rdma.IsPathError(err) || errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("read after the target closed: %v; want a path error (rdma.ErrQueueLost)", err)
	}
}
