package node

import (
	"errors"
	"testing"
	"time"

	"tier0/daemon/cluster"
	"tier0/daemon/store"
)

// unserve (an online array's delete) takes volMu, then the array's mu,
// then volIDs; the volume reconcile takes volMu, then volIDs, and the
// owner's zeroing holds the gate while it writes. With the owner's
// zeroing of a new volume stuck on a member's read, unserve waits for it
// (it never pulls the array from under a write); once the read goes on,
// both end (no lock cycle), race-free under -race, with the array gone
// from the node's served list and its subsystem from the frontend, and a
// later reconcile skips it.
func TestUnserveWhileVolumesReconcile(t *testing.T) {
	s := newTestSite(t)
	members := []string{"C1", "D1", "E1"}
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: members})
	s.wantReport("A", "fence-done")
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	a := s.node("A")
	sa := a.served("x")
	ctx := t.Context()
	nqn := s.cfg.SubsystemNQN("x")
	vs := a.volumesStore()
	if _, err := vs.ReleaseImplicit(ctx, "x", nqn, sa.gate.size, sa.gate.bs); err != nil {
		t.Fatal(err)
	}
	if err := a.reconcileVolumes(ctx); err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{"B", "C", "D", "E"} {
		// (not found: the implicit volume's record went once every node
		// had let go, A's own watcher included)
		if _, err := vs.Removed(ctx, "x", "x", other, a.nodeNames()); err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
	}
	// a one-block volume first: its zeroing is a partial-stripe write,
	// which reads some of the members (which ones depends on the block's
	// chunk and the write's plan), and every member's reads are held
	if _, err := vs.Create(ctx, "x", "small", int64(sa.gate.bs), nil); err != nil {
		t.Fatal(err)
	}
	var hds []*holdDev
	for _, m := range members {
		hd := s.holds[m]
		hd.hold()
		defer hd.release()
		hds = append(hds, hd)
	}
	releaseAll := func() {
		for _, hd := range hds {
			hd.release()
		}
	}
	recDone := make(chan error, 1)
	go func() { recDone <- a.reconcileVolumes(ctx) }() // the owner zeroes small
	select {                                           // ... and waits on a member, under volMu and the gate
	case <-hds[0].entered:
	case <-hds[1].entered:
	case <-hds[2].entered:
	}
	done := make(chan struct{})
	go func() {
		a.unserve(sa)
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("unserve finished while the owner's zeroing was still writing to the array")
	case <-recDone:
		t.Fatal("the volume reconcile finished while the members' reads were held")
	default:
	}
	releaseAll()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("unserve did not return within a minute of the zeroing's release: a lock cycle")
	}
	<-recDone
	if a.served("x") != nil {
		t.Fatal("x is still served on A after unserve")
	}
	for _, s := range a.servedAll() {
		if s == sa {
			t.Fatal("x is still in A's served list after unserve")
		}
	}
	if err := a.frontend.RemoveSubsystem(nqn); err == nil {
		t.Fatalf("A's frontend still had subsystem %s after unserve", nqn)
	}
	if err := a.reconcileVolumes(ctx); err != nil {
		t.Fatalf("a volume reconcile after unserve: %v", err)
	}
}
