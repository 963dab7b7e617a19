package node

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
	"tier0/daemon/host"
)

// TestVolumeHostAllowList: a volume created with a host allow-list is seen
// by that host through every node's frontend and by no other host (its
// NSID is not in their Active Namespace list), and a connection of a host
// not on the list does not hold it; changing the list online (through
// the API backend) is applied by every node at its next reconcile; an
// empty list shows it to every host. The implicit volume has no list.
func TestVolumeHostAllowList(t *testing.T) {
	s := newTestSite(t)
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: []string{"C1", "D1", "E1"}})
	s.wantReport("A", "fence-done")
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	s.do("A", "setana", cluster.SetANA{Array: "x", Node: "A", State: cluster.ANAOptimized, Epoch: 1})
	a, b := s.node("A"), s.node("B")
	ctx := t.Context()
	nqn := s.cfg.SubsystemNQN("x")
	const h1, h2 = "nqn.2014-08.org.nvmexpress:uuid:allowed", "nqn.2014-08.org.nvmexpress:uuid:other"
	if _, err := a.SetVolumeHosts(ctx, "x", []string{h1}); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "implicit") {
		t.Fatalf("hosts of the implicit volume: %v, want a conflict saying it is implicit", err)
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
	reconcile := func() {
		t.Helper()
		for _, n := range []*Node{a, b} {
			if err := n.reconcileVolumes(ctx); err != nil {
				t.Fatalf("reconcile on %s: %v", n.me.Name, err)
			}
		}
	}
	var conns []*host.Controller
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	active := func(n *Node, hostNQN string) []uint32 {
		t.Helper()
		c, err := host.Dial(ctx, n.me.AdvertiseAddr(n.me.Frontend), host.Options{SubNQN: nqn, HostNQN: hostNQN, IOQueues: 1, QueueDepth: 8, DialTimeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("%s to %s: %v", hostNQN, n.me.Name, err)
		}
		conns = append(conns, c)
		ids, err := c.ActiveNamespaces(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	if _, err := a.CreateVolume(ctx, "v1", "x", 1<<20, []string{"bad nqn"}); !errors.Is(err, api.ErrBadRequest) {
		t.Fatalf("create with a bad host NQN: %v, want ErrBadRequest", err)
	}
	v, err := a.CreateVolume(ctx, "v1", "x", 1<<20, []string{h1})
	if err != nil || !slices.Equal(v.Hosts, []string{h1}) {
		t.Fatalf("create: %+v %v", v, err)
	}
	reconcile() // zeroed
	reconcile() // served
	for _, n := range []*Node{a, b} {
		if ids := active(n, h1); !slices.Equal(ids, []uint32{v.NSID}) {
			t.Fatalf("allowed host through %s sees %v, want [%d]", n.me.Name, ids, v.NSID)
		}
		if ids := active(n, h2); len(ids) != 0 {
			t.Fatalf("host not on the list through %s sees %v, want none", n.me.Name, ids)
		}
	}
	a.publishHosts(ctx, &hostsPublished{})
	shown, err := a.Volume(ctx, "v1")
	// (h1 through A, published just now; through B too when B's own
	// reconcile loop has published since h1 connected to it)
	if err != nil || len(shown.Holders) == 0 || slices.ContainsFunc(shown.Holders, func(h api.VolumeHolder) bool { return h.HostNQN != h1 }) ||
		!slices.ContainsFunc(shown.Holders, func(h api.VolumeHolder) bool { return h.Node == "A" }) || !slices.Equal(shown.Hosts, []string{h1}) {
		t.Fatalf("show v1: hosts %v holders %+v %v, want only %s as a holder", shown.Hosts, shown.Holders, err, h1)
	}

	if v, err = a.SetVolumeHosts(ctx, "v1", []string{h2}); err != nil || !slices.Equal(v.Hosts, []string{h2}) {
		t.Fatalf("set hosts: %+v %v", v, err)
	}
	reconcile()
	for _, n := range []*Node{a, b} {
		if ids := active(n, h1); len(ids) != 0 {
			t.Fatalf("host taken off the list through %s sees %v, want none", n.me.Name, ids)
		}
		if ids := active(n, h2); !slices.Equal(ids, []uint32{v.NSID}) {
			t.Fatalf("host put on the list through %s sees %v, want [%d]", n.me.Name, ids, v.NSID)
		}
	}
	if _, err = b.SetVolumeHosts(ctx, "v1", nil); err != nil {
		t.Fatal(err)
	}
	reconcile()
	for _, n := range []*Node{a, b} {
		for _, h := range []string{h1, h2} {
			if ids := active(n, h); !slices.Equal(ids, []uint32{v.NSID}) {
				t.Fatalf("with an empty list %s through %s sees %v, want [%d]", h, n.me.Name, ids, v.NSID)
			}
		}
	}
}
