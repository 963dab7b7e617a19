package store

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

const (
	testNQN     = "nqn.2026-01.io.tier0:c:array-a"
	testPoolCap = 1 << 30
	testBS      = 4096
)

// TestVolumesLifecycle: a pool leaves its implicit volume only once every
// node removed NSID 1; volumes are carved first-fit, grow by appending
// zeroed extents, and free their extents and NSID only after every node
// removed the namespace.
func TestVolumesLifecycle(t *testing.T) {
	stores, _, _ := openCluster(t, 1)
	ctx := ctxT(t)
	vs := NewVolumes(stores[0].Client(), "/tier0/c/", nil)
	nodes := []string{"n1", "n2"}

	if _, err := vs.Create(ctx, "a", "v1", 1<<20, nil); !errors.Is(err, ErrImplicit) {
		t.Fatalf("create on a pool serving its implicit volume: %v, want ErrImplicit", err)
	}
	if _, err := vs.ReleaseImplicit(ctx, "a", testNQN, testPoolCap, testBS); err != nil {
		t.Fatal(err)
	}
	if _, err := vs.ReleaseImplicit(ctx, "a", testNQN, testPoolCap, testBS); !errors.Is(err, ErrConflict) {
		t.Fatalf("second release: %v, want ErrConflict", err)
	}
	if _, err := vs.Create(ctx, "a", "v1", 1<<20, nil); !errors.Is(err, ErrImplicit) {
		t.Fatalf("create while NSID 1 is still served somewhere: %v, want ErrImplicit", err)
	}
	if dropped, err := vs.Removed(ctx, "a", "a", "n1", nodes); err != nil || dropped {
		t.Fatalf("n1 removed the implicit volume: dropped=%v %v", dropped, err)
	}
	if dropped, err := vs.Removed(ctx, "a", "a", "n2", nodes); err != nil || !dropped {
		t.Fatalf("n2 removed the implicit volume: dropped=%v %v", dropped, err)
	}
	if _, err := vs.Create(ctx, "a", "v1", 1000, nil); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("size not a block multiple: %v", err)
	}
	v1, err := vs.Create(ctx, "a", "v1", 1<<20, []string{"nqn.h1"})
	if err != nil {
		t.Fatal(err)
	}
	if v1.NSID != 1 || v1.State != VolumeCreating || v1.Size != 0 || len(v1.Pending) != 1 || v1.Pending[0] != (Extent{0, 1 << 20}) || len(v1.NGUID) != 32 || v1.NGUID == v1.UUID {
		t.Fatalf("v1 = %+v", v1)
	}
	if _, err := vs.Create(ctx, "a", "v1", 1<<20, nil); !errors.Is(err, ErrVolumeExists) {
		t.Fatalf("same name twice: %v", err)
	}
	if _, err := vs.Resize(ctx, "v1", 2<<20); !errors.Is(err, ErrConflict) {
		t.Fatalf("resize of a creating volume: %v", err)
	}
	if v1, err = vs.Zeroed(ctx, "a", "v1", v1.Pending); err != nil || v1.State != VolumeReady || v1.Size != 1<<20 {
		t.Fatalf("zeroed: %+v %v", v1, err)
	}
	v2, err := vs.Create(ctx, "a", "v2", 1<<20, nil)
	if err != nil || v2.NSID != 2 || v2.Pending[0] != (Extent{1 << 20, 1 << 20}) {
		t.Fatalf("v2 = %+v %v", v2, err)
	}
	// growing v1 appends the first free range after v2
	g, err := vs.Resize(ctx, "v1", 3<<20)
	if err != nil || g.State != VolumeGrowing || g.Size != 1<<20 || len(g.Pending) != 1 || g.Pending[0] != (Extent{2 << 20, 2 << 20}) {
		t.Fatalf("resize: %+v %v", g, err)
	}
	if _, err := vs.Zeroed(ctx, "a", "v1", []Extent{{9, 9}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("zeroed with the wrong extents: %v", err)
	}
	if g, err = vs.Zeroed(ctx, "a", "v1", g.Pending); err != nil || g.Size != 3<<20 || len(g.Extents) != 2 {
		t.Fatalf("grown: %+v %v", g, err)
	}
	if _, err := vs.Resize(ctx, "v1", 1<<20); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("shrink: %v", err)
	}
	if _, err := vs.Create(ctx, "a", "huge", testPoolCap, nil); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("more than free: %v", err)
	}
	// deleting v2: its extent and NSID stay taken until both nodes removed it
	if _, err := vs.Delete(ctx, "v2"); err != nil {
		t.Fatal(err)
	}
	if _, err := vs.Removed(ctx, "a", "v2", "n2", nodes); err != nil {
		t.Fatal(err)
	}
	v3, err := vs.Create(ctx, "a", "v3", 1<<20, nil)
	if err != nil || v3.NSID == 2 || v3.Pending[0].Off < 4<<20 {
		t.Fatalf("v3 took v2's NSID or bytes while n1 still serves v2: %+v %v", v3, err)
	}
	rs := NewReservations(stores[0].Client(), "/tier0/c/")
	if _, err := rs.CompareAndSwap(ctx, testNQN, 2, 0, []byte(`{"generation":1}`)); err != nil {
		t.Fatal(err)
	}
	if dropped, err := vs.Removed(ctx, "a", "v2", "n1", nodes); err != nil || !dropped {
		t.Fatalf("last removal: %v %v", dropped, err)
	}
	if rec, err := rs.Get(ctx, testNQN, 2); err != nil || rec.Value != nil {
		t.Fatalf("v2's reservation state outlived it (the next NSID 2 would inherit it): %+v %v", rec, err)
	}
	if _, _, err := vs.Find(ctx, "v2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("v2 after its drop: %v", err)
	}
	v4, err := vs.Create(ctx, "a", "v4", 1<<20, nil)
	if err != nil || v4.NSID != 2 || v4.Pending[0] != (Extent{1 << 20, 1 << 20}) {
		t.Fatalf("v4 reuses v2's NSID and bytes: %+v %v", v4, err)
	}
}

// TestVolumesConcurrentAdmins: admins creating volumes at once through
// different clients never get the same extents or NSID, and none is lost.
func TestVolumesConcurrentAdmins(t *testing.T) {
	stores, _, _ := openCluster(t, 1)
	ctx := ctxT(t)
	if _, err := NewVolumes(stores[0].Client(), "/tier0/c/", nil).ReleaseImplicit(ctx, "a", testNQN, testPoolCap, testBS); err != nil {
		t.Fatal(err)
	}
	if _, err := NewVolumes(stores[0].Client(), "/tier0/c/", nil).Removed(ctx, "a", "a", "n1", []string{"n1"}); err != nil {
		t.Fatal(err)
	}
	const admins = 8
	var wg sync.WaitGroup
	errs := make([]error, admins)
	for i := range admins {
		wg.Go(func() {
			vs := NewVolumes(stores[0].Client(), "/tier0/c", nil)
			_, errs[i] = vs.Create(ctx, "a", fmt.Sprintf("v%d", i), 4<<20, nil)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("admin %d: %v", i, err)
		}
	}
	p, err := NewVolumes(stores[0].Client(), "/tier0/c/", nil).Pool(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Volumes) != admins {
		t.Fatalf("pool holds %d volumes after %d creations: %+v", len(p.Volumes), admins, p.Volumes)
	}
	var all []Extent
	nsids := map[uint32]string{}
	for _, v := range p.Volumes {
		if o, ok := nsids[v.NSID]; ok {
			t.Fatalf("volumes %s and %s share NSID %d", o, v.Name, v.NSID)
		}
		nsids[v.NSID] = v.Name
		all = append(all, v.Pending...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Off < all[j].Off })
	for i := 1; i < len(all); i++ {
		if all[i].Off < all[i-1].Off+all[i-1].Len {
			t.Fatalf("extents overlap: %v and %v", all[i-1], all[i])
		}
	}
}

// TestVolumeHosts: a volume's host allow-list is kept sorted without
// duplicates, replaced by SetHosts (empty: every host), and a bad NQN is
// refused naming it, at creation and at change.
func TestVolumeHosts(t *testing.T) {
	stores, _, _ := openCluster(t, 1)
	ctx := ctxT(t)
	vs := NewVolumes(stores[0].Client(), "/tier0/c/", nil)
	if _, err := vs.ReleaseImplicit(ctx, "a", testNQN, testPoolCap, testBS); err != nil {
		t.Fatal(err)
	}
	if _, err := vs.Removed(ctx, "a", "a", "n1", []string{"n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := vs.Create(ctx, "a", "v1", 1<<20, []string{"nqn.h1", "bad nqn"}); !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), `"bad nqn"`) {
		t.Fatalf("create with a bad host NQN: %v, want ErrBadOptions naming it", err)
	}
	v, err := vs.Create(ctx, "a", "v1", 1<<20, []string{"nqn.h2", "nqn.h1", "nqn.h2"})
	if err != nil || !slices.Equal(v.Hosts, []string{"nqn.h1", "nqn.h2"}) {
		t.Fatalf("create: hosts %v %v, want [nqn.h1 nqn.h2]", v.Hosts, err)
	}
	if v, err = vs.SetHosts(ctx, "v1", []string{"nqn.h3"}); err != nil || !slices.Equal(v.Hosts, []string{"nqn.h3"}) {
		t.Fatalf("set hosts: %v %v", v.Hosts, err)
	}
	if _, err := vs.SetHosts(ctx, "v1", []string{""}); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("set an empty NQN: %v, want ErrBadOptions", err)
	}
	if _, err := vs.SetHosts(ctx, "nope", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("hosts of an unknown volume: %v, want ErrNotFound", err)
	}
	if v, err = vs.SetHosts(ctx, "v1", nil); err != nil || v.Hosts != nil {
		t.Fatalf("clear hosts: %v %v", v.Hosts, err)
	}
	p, err := vs.Pool(ctx, "a")
	if err != nil || p.Volume("v1").Hosts != nil {
		t.Fatalf("stored hosts after clearing: %v %v", p.Volume("v1"), err)
	}
	if _, err := vs.Delete(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := vs.SetHosts(ctx, "v1", []string{"nqn.h1"}); !errors.Is(err, ErrConflict) {
		t.Fatalf("hosts of a deleting volume: %v, want ErrConflict", err)
	}
}
