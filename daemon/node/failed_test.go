package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/nvme"
	"tier0/daemon/store"
)

// awaitReport collects reports until node sends one of kind (the test's
// guard against waiting for ever is scrubTakes; no speed is asserted).
func (s *testSite) awaitReport(node, kind string, poke func()) report {
	s.t.Helper()
	var seen []report
	for deadline := time.Now().Add(scrubTakes); time.Now().Before(deadline); {
		if poke != nil {
			poke()
		}
		for _, r := range s.reports() {
			if r.Node == node && r.Kind == kind {
				return r
			}
			seen = append(seen, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("node %s sent no %q report within %s; reports: %+v", node, kind, scrubTakes, seen)
	return report{}
}

// An array that loses more members than its parity is reported failed,
// its frontend stops serving it with a reason naming the array, and it
// comes back — with the acknowledged data — when the members return and
// the coordinator asks for it again (issue 12, hole 5, node side).
func TestArrayFailedStopsServingAndComesBack(t *testing.T) {
	s := newTestSite(t)
	a := s.node("A")
	x := serveXOnA(s)
	kept := bytes.Repeat([]byte{0x3c}, 4096)
	const keptAt = 1 << 20
	if _, err := x.gate.WriteAtFUA(kept, keptAt); err != nil {
		t.Fatal(err)
	}

	// Nodes C and D go away: two of three members of a raid5.
	closeBackends(t, s, "C", "D")
	stripe := bytes.Repeat([]byte{0x77}, 32<<10) // a full stripe: every member is written
	r := s.awaitReport("A", "array-failed", func() { _, _ = x.gate.WriteAt(stripe, 0) })
	if r.Array != "x" || r.Epoch != 1 || r.Reason == "" {
		t.Errorf("array-failed report %+v: want array x, epoch 1 and a reason", r)
	}
	_, err := x.gate.ReadAt(make([]byte, 4096), keptAt)
	if !errors.Is(err, blockdev.ErrNoPath) || !strings.Contains(err.Error(), "array x failed") {
		t.Errorf("read of the failed array: %v; want an error wrapping ErrNoPath that says array x failed and why", err)
	}
	if st, err := a.frontend.ANAState(x.nqn, anaGroup); err != nil || st != nvme.ANAInaccessible {
		t.Errorf("failed array: ANA %v (%v), want inaccessible", st, err)
	}

	// A resync while the members are still away is refused, with the reason.
	s.do("A", "resync", cluster.Resync{Array: "x", Node: "A", Member: "C1", Epoch: 1})
	if r := s.wantReport("A", "repair-failed"); r.Member != "C1" || r.Epoch != 1 || r.Reason == "" {
		t.Errorf("repair-failed report %+v: want member C1, epoch 1 and a reason", r)
	}

	// C and D return; the coordinator asks for the array again.
	for _, name := range []string{"C", "D"} {
		if err := s.node(name).startBackend(); err != nil {
			t.Fatal(err)
		}
	}
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	got := make([]byte, 4096)
	if _, err := x.gate.ReadAt(got, keptAt); err != nil || !bytes.Equal(got, kept) {
		t.Fatalf("read of the acknowledged write after the members returned: err %v, data %x..., want %x...", err, got[:4], kept[:4])
	}
	if st, err := a.frontend.ANAState(x.nqn, anaGroup); err != nil || st != nvme.ANAOptimized {
		t.Errorf("re-assembled array: ANA %v (%v), want optimized", st, err)
	}

	// Again, but this time nobody asks: the owner sees the members return
	// (its periodic retry) and serves the array again by itself. First let
	// the resync of the members that came back stale finish.
	for deadline := time.Now().Add(scrubTakes); ; time.Sleep(20 * time.Millisecond) {
		st := x.array.Status()
		active := 0
		for _, m := range st.Members {
			if m.State == "active" {
				active++
			}
		}
		if active == len(st.Members) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("members not back in sync within %s: %+v", scrubTakes, st.Members)
		}
	}
	closeBackends(t, s, "C", "D")
	s.awaitReport("A", "array-failed", func() { _, _ = x.gate.WriteAt(stripe, 0) })
	a.retryFailed(t.Context())
	if !x.arrayFailed() {
		t.Fatal("the array came back while two of its three members were still away")
	}
	for _, name := range []string{"C", "D"} {
		if err := s.node(name).startBackend(); err != nil {
			t.Fatal(err)
		}
	}
	s.awaitReport("A", "assembled", func() { a.retryFailed(t.Context()) })
	if _, err := x.gate.ReadAt(got, keptAt); err != nil || !bytes.Equal(got, kept) {
		t.Fatalf("read after the owner re-assembled the array by itself: err %v, data %x..., want %x...", err, got[:4], kept[:4])
	}
}

// The coordinator's re-assembly of a failed array (a fence under a new
// epoch) fails while too few members answer; the array stays failed here
// under the epoch that fence claimed, and the owner's own retry serves it
// again once the members return. Before, the failed fence stopped the
// array and forgot the failure, so nothing but the coordinator's next
// fence (a whole backoff later) brought it back: members cut off on the
// backend alone bring no NodeReturned (docs/RELIABILITY.md known problem
// 9, simulation seeds 111304, 142546, 167673).
func TestFailedFenceOfFailedArrayKeepsItForRetry(t *testing.T) {
	s := newTestSite(t)
	a := s.node("A")
	x := serveXOnA(s)
	kept := bytes.Repeat([]byte{0x5a}, 4096)
	const keptAt = 1 << 20
	if _, err := x.gate.WriteAtFUA(kept, keptAt); err != nil {
		t.Fatal(err)
	}

	closeBackends(t, s, "C", "D")
	stripe := bytes.Repeat([]byte{0x77}, 32<<10)
	s.awaitReport("A", "array-failed", func() { _, _ = x.gate.WriteAt(stripe, 0) })

	// The coordinator's re-assembly: a fence at epoch 2 reaches E1 only.
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", OldOwner: "A", OldEpoch: 1, NewEpoch: 2, Members: []string{"C1", "D1", "E1"}})
	if r := s.wantReport("A", "fence-failed"); r.Epoch != 2 {
		t.Fatalf("fence-failed report %+v: want epoch 2", r)
	}
	x.mu.Lock()
	failed, epoch := x.arrayFailed(), x.epoch
	x.mu.Unlock()
	if !failed || epoch != 2 {
		t.Fatalf("after the failed fence at epoch 2 of the failed array: failed %v, epoch %d; want failed under epoch 2 (the owner's retry re-assembles it)", failed, epoch)
	}
	if _, err := x.gate.ReadAt(make([]byte, 4096), keptAt); !errors.Is(err, blockdev.ErrNoPath) {
		t.Errorf("read of the failed array after the failed fence: %v; want an error wrapping ErrNoPath", err)
	}
	a.retryFailed(t.Context())
	if !x.arrayFailed() {
		t.Fatal("the array came back while two of its three members were still away")
	}

	// The members return; nobody asks: the owner's retry serves it again
	// under epoch 2, the epoch the store names it owner at.
	for _, name := range []string{"C", "D"} {
		if err := s.node(name).startBackend(); err != nil {
			t.Fatal(err)
		}
	}
	if r := s.awaitReport("A", "assembled", func() { a.retryFailed(t.Context()) }); r.Epoch != 2 {
		t.Fatalf("assembled report %+v: want epoch 2", r)
	}
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 2})
	got := make([]byte, 4096)
	if _, err := x.gate.ReadAt(got, keptAt); err != nil || !bytes.Equal(got, kept) {
		t.Fatalf("read after the owner re-assembled the array: err %v, data %x..., want %x...", err, got[:4], kept[:4])
	}
	if st, err := a.frontend.ANAState(x.nqn, anaGroup); err != nil || st != nvme.ANAOptimized {
		t.Errorf("re-assembled array: ANA %v (%v), want optimized", st, err)
	}
}

// serveXOnA fences, assembles and serves array x (members C1, D1, E1) on
// A at epoch 1.
func serveXOnA(s *testSite) *served {
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: []string{"C1", "D1", "E1"}})
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	s.wantReport("A", "assembled")
	return s.node("A").served("x")
}

// closeBackends closes the backend targets of the nodes named: their
// drives go away for every other node.
func closeBackends(t *testing.T, s *testSite, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := s.node(name).backend.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// cutOwnerReads is a node's store whose ownership reads fail while cut is
// set, as a node cut off from etcd sees them.
type cutOwnerReads struct {
	Store
	cut atomic.Bool
}

func (c *cutOwnerReads) Ownership(ctx context.Context, array string) (store.Ownership, error) {
	if c.cut.Load() {
		return store.Ownership{}, fmt.Errorf("read owner of array %q: store cut off (test): %w", array, context.DeadlineExceeded)
	}
	return c.Store.Ownership(ctx, array)
}

// An optimized ANA order that reaches the owner while its store cannot be
// read is kept and carried out once the store confirms the ownership.
// Before, the order was dropped: the array ran on its owner of record
// behind inaccessible paths for good, since the coordinator, having seen
// it assembled, never ordered it again (docs/RELIABILITY.md known problem
// 10; simulation seeds 9104662, 9143537, 9160812, 9175546). A kept order
// ends with a newer owner in the store, or with an inaccessible order.
func TestOptimizedOrderKeptWhileStoreUnreadable(t *testing.T) {
	s := newTestSite(t)
	a := s.node("A")
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: []string{"C1", "D1", "E1"}})
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	a.bg.Wait()
	cut := &cutOwnerReads{Store: a.st}
	a.st = cut
	x := a.served("x")
	optimized := func() bool { return x.anaState() == nvme.ANAOptimized }

	cut.cut.Store(true)
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	if optimized() {
		t.Fatal("optimized although the store could not confirm the ownership")
	}
	a.retryANA(t.Context())
	if optimized() {
		t.Fatal("optimized by the retry while the store was still cut off")
	}
	cut.cut.Store(false)
	a.retryANA(t.Context())
	if !optimized() {
		t.Fatal("not optimized once the store answered again: the order was dropped while the store was cut off")
	}
	if _, err := x.gate.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("read through the optimized path: %v", err)
	}

	// A kept order ends when an inaccessible order follows.
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAInaccessible, Epoch: 1})
	cut.cut.Store(true)
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAInaccessible, Epoch: 1})
	cut.cut.Store(false)
	a.retryANA(t.Context())
	if optimized() {
		t.Fatal("a kept optimized order outlived the inaccessible order after it")
	}

	// And when the store names a newer owner once it answers.
	cut.cut.Store(true)
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	if _, err := s.st.ClaimOwnership(t.Context(), "x", "B", 2); err != nil {
		t.Fatal(err)
	}
	cut.cut.Store(false)
	a.retryANA(t.Context())
	if optimized() {
		t.Fatal("optimized at epoch 1 although the store names B owner at epoch 2")
	}
}
