package store

import (
	"errors"
	"testing"
	"time"

	"tier0/daemon/clock"
)

// TestDesiredArrays: a name is created once; a deleting array collects the
// nodes that stopped and wiped it, each once; a removed record is gone.
func TestDesiredArrays(t *testing.T) {
	stores, _, _ := openCluster(t, 1)
	ctx := ctxT(t)
	da := NewDesiredArrays(stores[0].Client(), "/tier0/c/", nil)
	a := DesiredArray{Name: "p1", Level: "raid5", ChunkKiB: 128, Home: "A", Members: []string{"B9", "C9", "D9"}}
	got, err := da.Create(ctx, a)
	if err != nil || got.Phase != ArrayActive || got.Revision == 0 {
		t.Fatalf("create: %+v %v", got, err)
	}
	if _, err := da.Create(ctx, a); !errors.Is(err, ErrExists) {
		t.Fatalf("same name twice: %v, want ErrExists", err)
	}
	if _, err := da.Create(ctx, DesiredArray{Name: "a/b"}); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := da.Update(ctx, "p1", func(a *DesiredArray) (bool, error) { a.Phase = ArrayDeleting; return true, nil }); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"A", "B", "A"} {
		if err := da.MarkDone(ctx, "p1", n, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := da.MarkDone(ctx, "p1", "C", true); err != nil {
		t.Fatal(err)
	}
	l, _, err := da.List(ctx)
	if err != nil || len(l) != 1 || len(l[0].Stopped) != 2 || len(l[0].Wiped) != 1 || l[0].Members[2] != "D9" {
		t.Fatalf("list: %+v %v", l, err)
	}
	if err := da.Remove(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := da.Get(ctx, "p1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after remove: %v", err)
	}
	if err := da.MarkDone(ctx, "p1", "A", false); err != nil {
		t.Fatalf("mark on a removed array: %v", err)
	}
}

// TestTablesUseStoreClock: the records the store's tables create (an
// online array, a volume, a released implicit volume) are stamped by the
// store's Options.Clock, not the wall clock. The clock here runs ten years
// behind the wall clock (a constant offset, so the store's leases are
// unaffected).
func TestTablesUseStoreClock(t *testing.T) {
	const behind = 10 * 365 * 24 * time.Hour
	ps, dir := peers(t, 1), t.TempDir()
	o := options(ps, 0, dir)
	o.Clock = nowClock{clock.Real, func() time.Time { return time.Now().Add(-behind) }}
	s, err := Open(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := ctxT(t)
	onClock := func(what string, at time.Time) {
		t.Helper()
		if time.Since(at) < behind-time.Hour {
			t.Errorf("%s created at %v: want the store clock's time, about %v ago", what, at, behind)
		}
	}
	a, err := s.DesiredArrays().Create(ctx, DesiredArray{Name: "p1", Level: "raid5", ChunkKiB: 128, Home: "A"})
	if err != nil {
		t.Fatal(err)
	}
	onClock("online array", a.Created)
	vs := s.Volumes()
	p, err := vs.ReleaseImplicit(ctx, "a", testNQN, testPoolCap, testBS)
	if err != nil {
		t.Fatal(err)
	}
	onClock("implicit volume", p.Volumes[0].Created)
	if _, err := vs.Removed(ctx, "a", "a", "n1", []string{"n1"}); err != nil {
		t.Fatal(err)
	}
	v, err := vs.Create(ctx, "a", "v1", 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	onClock("volume", v.Created)
}
