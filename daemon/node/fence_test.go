package node

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/nvme"
)

// notReturning is how long a call may take before the test calls it
// stuck. It is no speed goal: a call that waits on a lock the test holds
// never returns at all.
const notReturning = 20 * time.Second

// Self-fencing is bounded by itself (issue 12, hole 4): while an action
// holds the array's task lock and a read is in flight, selfFence returns,
// the frontend's ANA state is inaccessible, new reads and writes are
// refused, and the read in flight completes with an error, not data.
func TestSelfFenceWhileActionHoldsLock(t *testing.T) {
	s := newTestSite(t)
	a := s.node("A")
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: []string{"C1", "D1", "E1"}})
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	s.wantReport("A", "assembled")
	x := a.served("x")
	if st, err := a.frontend.ANAState(x.nqn, anaGroup); err != nil || st != nvme.ANAOptimized {
		t.Fatalf("before fencing: ANA %v (%v), want optimized", st, err)
	}
	data := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := x.gate.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}

	// A read in flight, held in the members.
	for _, h := range s.holds {
		h.hold()
	}
	type result struct {
		n   int
		err error
		buf []byte
	}
	inflight := make(chan result, 1)
	go func() {
		buf := make([]byte, 4096)
		n, err := x.gate.ReadAt(buf, 0)
		inflight <- result{n, err, buf}
	}()
	waitEntered(t, s)

	// An action stuck with the array's lock (a 3 s dial, an assembly).
	x.mu.Lock()
	fenced := make(chan struct{})
	go func() {
		a.selfFence("test: lease lost")
		close(fenced)
	}()
	select {
	case <-fenced:
	case <-time.After(notReturning):
		x.mu.Unlock()
		t.Fatalf("selfFence has not returned after %s while an action holds the array's lock: it must not wait for it", notReturning)
	}
	if st, err := a.frontend.ANAState(x.nqn, anaGroup); err != nil || st != nvme.ANAInaccessible {
		t.Errorf("after selfFence returned (array lock still held): ANA %v (%v), want inaccessible", st, err)
	}
	done := make(chan error, 2)
	go func() { _, err := x.gate.ReadAt(make([]byte, 4096), 0); done <- err }()
	go func() { _, err := x.gate.WriteAt(data, 4096); done <- err }()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, blockdev.ErrNoPath) {
				t.Errorf("I/O after selfFence returned: %v, want an error wrapping ErrNoPath (ANA inaccessible)", err)
			}
		case <-time.After(notReturning):
			t.Fatalf("I/O after selfFence has not returned after %s: the gate must refuse at once, not wait on a lock", notReturning)
		}
	}
	for _, h := range s.holds {
		h.release()
	}
	select {
	case r := <-inflight:
		if !errors.Is(r.err, blockdev.ErrNoPath) {
			t.Errorf("the read in flight at selfFence returned %d bytes (err %v): a fenced node must not complete reads", r.n, r.err)
		}
	case <-time.After(notReturning):
		t.Fatal("the read in flight did not finish after its members answered")
	}
	x.mu.Unlock()
}

// waitEntered waits until a read waits in one of the held drives.
func waitEntered(t *testing.T, s *testSite) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), notReturning)
	defer cancel()
	cases := make(chan struct{}, len(s.holds))
	for _, h := range s.holds {
		h.mu.Lock()
		e := h.entered
		h.mu.Unlock()
		go func() {
			select {
			case <-e:
				cases <- struct{}{}
			case <-ctx.Done():
			}
		}()
	}
	select {
	case <-cases:
	case <-ctx.Done():
		t.Fatal("the read never reached a member")
	}
}
