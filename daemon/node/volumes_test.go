package node

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/store"
)

// TestVolumesReconciled: a pool whose implicit volume was released serves
// carved volumes on every node's frontend: a new volume reads zeroes (the
// owner zeroed bytes the implicit volume had written), its bytes land at
// its extents, a resize grows it as a host sees it, and a deleted volume's
// namespace goes from every node before its record does.
func TestVolumesReconciled(t *testing.T) {
	s := newTestSite(t)
	members := []string{"C1", "D1", "E1"}
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: members})
	s.wantReport("A", "fence-done")
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	a, b := s.node("A"), s.node("B")
	sa := a.served("x")
	ctx := t.Context()
	nqn := s.cfg.SubsystemNQN("x")
	vs := a.volumesStore()
	reconcile := func() {
		t.Helper()
		for _, n := range []*Node{a, b} {
			if err := n.reconcileVolumes(ctx); err != nil {
				t.Fatalf("reconcile on %s: %v", n.me.Name, err)
			}
		}
	}
	active := func(n *Node) []uint32 {
		t.Helper()
		c, err := host.Dial(ctx, n.me.AdvertiseAddr(n.me.Frontend), host.Options{SubNQN: nqn, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:vol-test", IOQueues: 1, QueueDepth: 8, DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("host to %s: %v", n.me.Name, err)
		}
		defer c.Close()
		ids, err := c.ActiveNamespaces(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}

	// the implicit volume has written everywhere
	junk := bytes.Repeat([]byte{0xA5}, 1<<20)
	if _, err := sa.gate.WriteAt(junk, 0); err != nil {
		t.Fatal(err)
	}
	reconcile()
	if ids := active(b); !slices.Equal(ids, []uint32{1}) {
		t.Fatalf("before any volume record B serves %v, want the implicit [1]", ids)
	}
	if _, err := vs.ReleaseImplicit(ctx, "x", nqn, sa.gate.size, sa.gate.bs); err != nil {
		t.Fatal(err)
	}
	reconcile()
	for _, n := range []*Node{a, b} {
		if ids := active(n); len(ids) != 0 {
			t.Fatalf("after the release %s serves %v, want none", n.me.Name, ids)
		}
	}
	for _, other := range []string{"C", "D", "E"} { // nodes without a frontend in this site
		if _, err := vs.Removed(ctx, "x", "x", other, a.nodeNames()); err != nil {
			t.Fatal(err)
		}
	}
	v, err := vs.Create(ctx, "x", "v1", 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	reconcile() // A (the owner) zeroes and marks it ready
	reconcile() // both serve it
	p, err := vs.Pool(ctx, "x")
	if err != nil || p.Volume("v1").State != store.VolumeReady {
		t.Fatalf("v1 after reconciling: %+v %v", p, err)
	}
	for _, n := range []*Node{a, b} {
		if ids := active(n); !slices.Equal(ids, []uint32{v.NSID}) {
			t.Fatalf("%s serves %v, want [%d]", n.me.Name, ids, v.NSID)
		}
	}
	c, err := host.Dial(ctx, a.me.AdvertiseAddr(a.me.Frontend), host.Options{SubNQN: nqn, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:vol-io", IOQueues: 1, QueueDepth: 8, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(v.NSID)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RefreshANA(ctx); err != nil {
		t.Fatal(err)
	}
	if ns.Size() != 1<<20 || ns.ANAState() != nvme.ANAOptimized {
		t.Fatalf("v1 through the owner: size %d, ANA %v", ns.Size(), ns.ANAState())
	}
	buf := make([]byte, 1<<20)
	if _, err := ns.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(buf, func(b byte) bool { return b != 0 }); i >= 0 {
		t.Fatalf("new volume v1 reads %#x at byte %d: the implicit volume's data shows through, want zeroes", buf[i], i)
	}
	blk := bytes.Repeat([]byte("v1"), 2048)
	if _, err := ns.WriteAt(blk, 8192); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(blk))
	if _, err := sa.gate.ReadAt(got, v.Pending[0].Off+8192); err != nil || !bytes.Equal(got, blk) {
		t.Fatalf("v1's block 2 is not at its extent's offset in the array: %v", err)
	}

	// a second volume, then v1 grows past it: two extents
	if _, err := vs.Create(ctx, "x", "v2", 1<<20, nil); err != nil {
		t.Fatal(err)
	}
	reconcile()
	if _, err := vs.Resize(ctx, "v1", 3<<20); err != nil {
		t.Fatal(err)
	}
	reconcile()
	reconcile()
	id, err := c.IdentifyNamespace(ctx, v.NSID)
	if err != nil || id.NSZE*uint64(id.BlockSize()) != 3<<20 {
		t.Fatalf("v1 after the resize: NSZE %d (%v), want %d blocks", id.NSZE, err, (3<<20)/id.BlockSize())
	}
	ns, err = c.Namespace(v.NSID)
	if err != nil {
		t.Fatal(err)
	}
	tail := bytes.Repeat([]byte("t"), 4096)
	if _, err := ns.WriteAt(tail, (3<<20)-4096); err != nil {
		t.Fatalf("write at the grown end: %v", err)
	}
	if _, err := ns.ReadAt(got, 8192); err != nil || !bytes.Equal(got, blk) {
		t.Fatalf("v1's data after growing: %v", err)
	}

	// delete: gone from both frontends, then (all nodes removed) dropped
	if _, err := vs.Delete(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	reconcile()
	for _, n := range []*Node{a, b} {
		if ids := active(n); slices.Contains(ids, v.NSID) {
			t.Fatalf("%s still serves deleted v1 (NSID %d): %v", n.me.Name, v.NSID, ids)
		}
	}
	p, _ = vs.Pool(ctx, "x")
	if dv := p.Volume("v1"); dv == nil || !slices.Equal(dv.RemovedOn, []string{"A", "B"}) {
		t.Fatalf("v1 after A and B removed it: %+v", dv)
	}
	for _, other := range []string{"C", "D", "E"} {
		if _, err := vs.Removed(ctx, "x", "v1", other, a.nodeNames()); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := vs.Find(ctx, "v1"); err == nil {
		t.Fatal("v1 still recorded after every node removed it")
	}
}

// TestDeleteVolumeNamesHolders: deleting a volume a host is connected to
// and registered on is refused, naming the host and the node; with force it
// is deleted. The implicit volume needs force even unused.
func TestDeleteVolumeNamesHolders(t *testing.T) {
	s := newTestSite(t)
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: []string{"C1", "D1", "E1"}})
	s.wantReport("A", "fence-done")
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	a := s.node("A")
	ctx := t.Context()
	if _, err := a.DeleteVolume(ctx, "x", false); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("delete of the implicit volume without force: %v", err)
	}
	if _, err := a.DeleteVolume(ctx, "x", true); err != nil {
		t.Fatal(err)
	}
	vs := a.volumesStore()
	for _, n := range a.nodeNames() {
		if _, err := vs.Removed(ctx, "x", "x", n, a.nodeNames()); err != nil {
			t.Fatal(err)
		}
	}
	v, err := a.CreateVolume(ctx, "v1", "x", 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.reconcileVolumes(ctx); err != nil { // zeroed
		t.Fatal(err)
	}
	if err := a.reconcileVolumes(ctx); err != nil { // served
		t.Fatal(err)
	}
	const hostNQN = "nqn.2014-08.org.nvmexpress:uuid:holder"
	c, err := host.Dial(ctx, a.me.AdvertiseAddr(a.me.Frontend), host.Options{SubNQN: s.cfg.SubsystemNQN("x"), HostNQN: hostNQN, HostID: derive16("holder"), IOQueues: 1, QueueDepth: 8, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(v.NSID)
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Register(nvme.ResvRegister, 0, 0x77, false); err != nil {
		t.Fatal(err)
	}
	a.publishHosts(ctx, &hostsPublished{})
	_, err = a.DeleteVolume(ctx, "v1", false)
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), hostNQN+" connected through node A") || !strings.Contains(err.Error(), "reservation registrant") {
		t.Fatalf("delete of a volume in use: %v, want a conflict naming %s on node A and its registration", err, hostNQN)
	}
	shown, err := a.Volume(ctx, "v1")
	if err != nil || len(shown.Holders) != 2 {
		t.Fatalf("show v1: holders %+v %v, want the connection and the registration", shown.Holders, err)
	}
	dv, err := a.DeleteVolume(ctx, "v1", true)
	if err != nil || dv.State != string(store.VolumeDeleting) {
		t.Fatalf("forced delete: %+v %v", dv, err)
	}
}
