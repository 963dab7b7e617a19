package node

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
)

// TestFrontendReservationOneStateAcrossNodes: the hosts' reservations of
// an array's frontend namespace are one state in the cluster store. A
// registration through the owner's path and one through another node's
// (inaccessible) path show in the Reservation Report of every path; the
// reservation conflicts from the other path; after the array moves to
// another node the report is unchanged and the new owner enforces it; a
// preempt-and-abort through the new owner fences the old holder on every
// path.
func TestFrontendReservationOneStateAcrossNodes(t *testing.T) {
	s := newTestSite(t)
	members := []string{"C1", "D1", "E1"}
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: members})
	s.wantReport("A", "fence-done")
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	if st := s.node("A").served("x").anaState(); st != nvme.ANAOptimized {
		t.Fatalf("A's path to x is %v, want optimized", st)
	}
	nqn := s.cfg.SubsystemNQN("x")
	id1, id2 := derive16("resv-test-host", "1"), derive16("resv-test-host", "2")
	dial := func(node string, id [16]byte) *host.Namespace {
		t.Helper()
		n := s.node(node)
		c, err := host.Dial(t.Context(), n.me.AdvertiseAddr(n.me.Frontend), host.Options{SubNQN: nqn,
			HostNQN: fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%x", id), HostID: id, IOQueues: 1, QueueDepth: 16, DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("host %x to %s's frontend: %v", id[:2], node, err)
		}
		t.Cleanup(func() { c.Close() })
		ns, err := c.Namespace(frontendNSID)
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	h1A, h1B, h2A, h2B := dial("A", id1), dial("B", id1), dial("A", id2), dial("B", id2)
	blk := make([]byte, 4096)

	if err := h1A.Register(nvme.ResvRegister, 0, 0x11, false); err != nil {
		t.Fatalf("host 1 registers through the owner: %v", err)
	}
	if err := h1A.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, 0x11, 0); err != nil {
		t.Fatalf("host 1 acquires through the owner: %v", err)
	}
	if err := h2B.Register(nvme.ResvRegister, 0, 0x22, false); err != nil {
		t.Fatalf("host 2 registers through B (not the owner): %v", err)
	}
	report := func(ns *host.Namespace, path string) nvme.ResvStatus {
		t.Helper()
		rs, err := ns.Report()
		if err != nil {
			t.Fatalf("report through %s: %v", path, err)
		}
		return rs
	}
	want := report(h1A, "host 1 on A")
	if want.Type != nvme.ResvWriteExclusive || len(want.Registrants) != 2 || !want.PTPLS {
		t.Fatalf("report %+v: want write exclusive, two registrants, PTPLS", want)
	}
	for path, ns := range map[string]*host.Namespace{"host 1 on B": h1B, "host 2 on A": h2A, "host 2 on B": h2B} {
		if got := report(ns, path); !reflect.DeepEqual(got, want) {
			t.Errorf("report through %s: %+v, want the owner's %+v", path, got, want)
		}
	}
	if err := h2B.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, 0x22, 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("host 2 acquires through B while host 1 holds: %v, want a reservation conflict", err)
	}
	if _, err := h2A.WriteAt(blk, 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("host 2 writes through the owner: %v, want a reservation conflict", err)
	}
	if _, err := h1A.WriteAt(blk, 0); err != nil {
		t.Fatalf("the holder writes through the owner: %v", err)
	}

	// x moves to B (A stopped serving it): the state is the store's
	s.node("A").served("x").stop(false)
	_ = s.node("A").served("x").setANA(nvme.ANAInaccessible)
	s.do("B", "fence", cluster.Fence{Array: "x", Node: "B", OldOwner: "A", OldEpoch: 1, NewEpoch: 2, Members: members})
	s.wantReport("B", "fence-done")
	s.do("B", "assemble", cluster.Assemble{Array: "x", Node: "B", Epoch: 2})
	s.wantReport("B", "assembled")
	s.do("B", "setana", cluster.SetANA{Array: "x", Node: "B", State: cluster.ANAOptimized, Epoch: 2})
	if st := s.node("B").served("x").anaState(); st != nvme.ANAOptimized {
		t.Fatalf("B's path to x is %v, want optimized", st)
	}
	if got := report(h2B, "host 2 on the new owner"); !reflect.DeepEqual(got, want) {
		t.Fatalf("report after the owner change: %+v, want %+v", got, want)
	}
	if _, err := h2B.WriteAt(blk, 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("host 2 writes through the new owner: %v, want a reservation conflict", err)
	}
	if _, err := h1B.WriteAt(blk, 0); err != nil {
		t.Fatalf("the holder writes through the new owner: %v", err)
	}
	// host 2 fences host 1 through the new owner; host 1 is refused there,
	// and every path reports the same
	if err := h2B.Acquire(nvme.ResvPreemptAndAbort, nvme.ResvWriteExclusive, 0x22, 0x11); err != nil {
		t.Fatalf("host 2 preempts and aborts host 1: %v", err)
	}
	if _, err := h1B.WriteAt(blk, 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("fenced host 1 writes through the new owner: %v, want a reservation conflict", err)
	}
	if _, err := h2B.WriteAt(blk, 0); err != nil {
		t.Fatalf("the new holder writes: %v", err)
	}
	after := report(h2B, "host 2 on B")
	if len(after.Registrants) != 1 || after.Registrants[0].HostID != id2 || !after.Registrants[0].Holder {
		t.Fatalf("report after the preempt: %+v, want host 2 alone, holding", after)
	}
	if got := report(h1A, "host 1 on A (now inaccessible)"); !reflect.DeepEqual(got, after) {
		t.Fatalf("report through A: %+v, want %+v", got, after)
	}
}
