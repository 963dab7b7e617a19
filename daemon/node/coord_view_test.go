package node

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"tier0/daemon/cluster"
	"tier0/daemon/store"
)

// A coordinator superseded while its view write was in flight (frozen past
// its session: nemesis seed 2 froze node C 6.2 s, above the 3 s TTL) must
// not overwrite the view of the coordinator that replaced it: the new one
// publishes only when its decisions change, so a late stale write stayed
// for good, and every node answered from it ("C2=stale" for 120 s with the
// array in fact recovered). The view is written under the writer's
// election (store.ElectionGuard).
func TestSupersededCoordinatorCannotOverwriteView(t *testing.T) {
	s := newTestSite(t)
	n := s.node("A")
	ctx := t.Context()
	oldCtx, newCtx := supersede(t, s)
	machine := func(nodes ...string) *cluster.Machine {
		m, err := cluster.New(cluster.Config{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range nodes {
			if err := m.Step(cluster.NodeJoined{Node: id, Drives: []string{id + "9"}}); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	forget := func() { n.mu.Lock(); n.lastView = ""; n.mu.Unlock() }
	forget()
	n.publishView(newCtx, machine("P"))
	forget()
	n.publishView(oldCtx, machine("P", "Q")) // the superseded coordinator's late write
	var got clusterView
	if _, err := s.st.Get(ctx, store.Observed, "cluster", "view", &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Nodes) != 1 || got.Nodes[0].Name != "P" {
		t.Fatalf("published view has nodes %+v: the superseded coordinator's write replaced the current one's (want only P)", got.Nodes)
	}
}

// Nor may it hand out tasks: its decisions are void (the performer checks
// the epoch too, but a superseded machine's orders are noise at best).
func TestSupersededCoordinatorSendsNoTask(t *testing.T) {
	s := newTestSite(t)
	n := s.node("A")
	oldCtx, newCtx := supersede(t, s)
	prefix := n.key("tasks", "Z") + "/"
	count := func() int64 {
		resp, err := s.st.Client().Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	act := cluster.Resync{Array: "x", Node: "Z", Member: "C1", Epoch: 7}
	if err := n.sendTask(newCtx, act); err != nil || count() != 1 {
		t.Fatalf("the current coordinator's task: err %v, %d tasks queued for Z, want nil and 1", err, count())
	}
	err := n.sendTask(oldCtx, act)
	if got := count(); err == nil || got != 1 {
		t.Fatalf("the superseded coordinator's task: err %v, %d tasks queued for Z: want an error and still 1", err, got)
	}
}

// supersede elects one candidate, ends its session, elects another, and
// returns the contexts of the old (superseded) and the new coordinator.
func supersede(t *testing.T, s *testSite) (oldCtx, newCtx context.Context) {
	t.Helper()
	n := s.node("A")
	ctx := t.Context()
	cli := s.st.Client()
	elect := func(who string) (*concurrency.Election, *concurrency.Session) {
		sess, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			t.Fatal(err)
		}
		el := concurrency.NewElection(sess, n.key("coordinator-view-test"))
		if err := el.Campaign(ctx, who); err != nil {
			t.Fatal(err)
		}
		return el, sess
	}
	oldEl, oldSess := elect("old")
	oldCtx = withViewGuard(ctx, store.ElectionGuard(oldEl.Key(), oldEl.Rev()))
	oldSess.Close() // the old coordinator's session ends (its lease expired)
	newEl, newSess := elect("new")
	t.Cleanup(func() { newSess.Close() })
	return oldCtx, withViewGuard(ctx, store.ElectionGuard(newEl.Key(), newEl.Rev()))
}
