package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestReservationsCASWatchAck: one key per namespace changed only by
// compare-and-swap, seen by a watch on another member, and the owner's
// acknowledgement awaited.
func TestReservationsCASWatchAck(t *testing.T) {
	stores, _, _ := openCluster(t, 1)
	ctx := ctxT(t)
	a, b := stores[0].Reservations(), NewReservations(stores[0].Client(), "/tier0/")
	const nqn = "nqn.2026-01.io.tier0:c:array-a"
	rec, err := a.Get(ctx, nqn, 1)
	if err != nil || rec.Revision != 0 || rec.Value != nil {
		t.Fatalf("empty state: %+v %v", rec, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := b.Watch(wctx, 0)
	rev, err := a.CompareAndSwap(ctx, nqn, 1, 0, []byte(`{"generation":1}`))
	if err != nil || rev == 0 {
		t.Fatalf("first swap: %d %v", rev, err)
	}
	// a second writer that decided on the empty state loses
	_, err = b.CompareAndSwap(ctx, nqn, 1, 0, []byte(`{"generation":9}`))
	var ce *ResvConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) || ce.Current.Revision != rev || string(ce.Current.Value) != `{"generation":1}` {
		t.Fatalf("stale swap: %v, want a conflict carrying revision %d", err, rev)
	}
	select {
	case got := <-watch:
		if got.SubNQN != nqn || got.NSID != 1 || got.Revision != rev || string(got.Value) != `{"generation":1}` {
			t.Fatalf("watched %+v", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not report the change")
	}
	rev2, err := b.CompareAndSwap(ctx, nqn, 1, rev, []byte(`{"generation":2}`))
	if err != nil || rev2 <= rev {
		t.Fatalf("swap on the current revision: %d %v", rev2, err)
	}
	// waiting for the owner's acknowledgement
	waited := make(chan error, 1)
	go func() { waited <- b.WaitApplied(ctx, nqn, 1, "n1", rev2) }()
	if err := a.Ack(ctx, nqn, 1, "n2", rev2); err != nil { // another node's ack does not count
		t.Fatal(err)
	}
	if err := a.Ack(ctx, nqn, 1, "n1", rev); err != nil { // nor an older revision
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		t.Fatalf("WaitApplied returned before the owner acknowledged the revision: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := a.Ack(ctx, nqn, 1, "n1", rev2); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("WaitApplied: %v", err)
	}
	if node, r, err := a.Applied(ctx, nqn, 1); err != nil || node != "n1" || r != rev2 {
		t.Fatalf("Applied: %s %d %v", node, r, err)
	}
	short, cancel2 := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel2()
	if err := b.WaitApplied(short, nqn, 1, "n1", rev2+100); err == nil {
		t.Fatal("WaitApplied for a revision never acknowledged returned nil")
	}
	if _, err := a.Get(ctx, "bad/nqn", 1); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("NQN with a slash: %v", err)
	}
}
