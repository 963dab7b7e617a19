package store

import (
	"errors"
	"testing"
)

// TestDesiredArrays: a name is created once; a deleting array collects the
// nodes that stopped and wiped it, each once; a removed record is gone.
func TestDesiredArrays(t *testing.T) {
	stores, _, _ := openCluster(t, 1)
	ctx := ctxT(t)
	da := NewDesiredArrays(stores[0].Client(), "/tier0/c/")
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
