package store

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/daemon/cluster"
)

// TestCoordinatorWiring runs the control plane as docs/CONTROL-PLANE.md
// describes it, against a real embedded etcd: five nodes hold liveness
// leases; the coordinator restores a failover machine from the store, feeds
// it lease changes and the performers' reports, and delivers its actions
// through guarded intent queues; each node performs its intents (ownership
// by compare-and-swap, serving records) and reports back. Node B's daemon
// dies (its lease expires): array b moves to A under epoch 2. B registers
// again: its members resync and b fails back under epoch 3.
func TestCoordinatorWiring(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	nodes := []string{"A", "B", "C", "D", "E"}
	leases := map[string]*Liveness{}
	for _, n := range nodes {
		l, err := s.Register(ctx, NodeInfo{Node: n}, 2*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		leases[n] = l
	}
	defer func() {
		for _, l := range leases {
			l.Abandon()
		}
	}()

	// Performers: one loop per node over its intent queue.
	var mu sync.Mutex
	serving := map[string]string{} // array -> node serving it optimized
	var snap []cluster.ArrayView   // the coordinator's view, after each step
	perform := func(node string) {
		for msg := range s.WatchQueue(ctx, "intents."+node, 1) {
			a, err := cluster.UnmarshalAction(msg.Payload)
			if err != nil {
				t.Errorf("node %s: bad intent: %v", node, err)
				return
			}
			var reply cluster.Event
			switch a := a.(type) {
			case cluster.Fence:
				if _, err := s.ClaimOwnership(ctx, a.Array, node, a.NewEpoch); err != nil {
					var ce *ConflictError
					if !errors.As(err, &ce) {
						if ctx.Err() == nil {
							t.Errorf("claim %s: %v", a.Array, err)
						}
						return
					}
					reply = cluster.OwnershipLost{Array: a.Array, Node: node, Epoch: a.NewEpoch, Winner: ce.Current.Owner, WinnerEpoch: ce.Current.Epoch}
				} else {
					reply = cluster.FenceDone{Array: a.Array, Node: node, Epoch: a.NewEpoch}
				}
			case cluster.Assemble:
				reply = cluster.ArrayAssembled{Array: a.Array, Node: node, Epoch: a.Epoch}
			case cluster.SetANA:
				if o, err := s.Ownership(ctx, a.Array); err != nil || o.Owner != node || o.Epoch != a.Epoch {
					_ = s.Done(ctx, msg) // stale intent: not the owner at that epoch
					continue
				}
				mu.Lock()
				if other, ok := serving[a.Array]; ok && other != node {
					t.Errorf("array %s optimized on %s while %s serves it", a.Array, node, other)
				}
				serving[a.Array] = node
				mu.Unlock()
				if _, err := s.Put(ctx, Observed, "serving", a.Array, map[string]any{"node": node, "epoch": a.Epoch}); err != nil {
					t.Errorf("serving record: %v", err)
				}
			case cluster.Release:
				mu.Lock()
				delete(serving, a.Array)
				mu.Unlock()
				_ = s.Delete(ctx, Observed, "serving", a.Array)
				reply = cluster.Released{Array: a.Array, Node: node, Epoch: a.Epoch}
			case cluster.Resync:
				reply = cluster.ResyncDone{Array: a.Array, Member: a.Member, Epoch: a.Epoch}
			case cluster.Rebuild:
				reply = cluster.RebuildDone{Array: a.Array, Member: a.Member, Epoch: a.Epoch}
			}
			if reply != nil {
				b, _ := cluster.MarshalEvent(reply)
				if _, err := s.Enqueue(ctx, nil, "reports", b); err != nil && ctx.Err() == nil {
					t.Errorf("report: %v", err)
				}
			}
			_ = s.Done(ctx, msg)
		}
	}
	var performers sync.WaitGroup
	for _, n := range nodes {
		performers.Go(func() { perform(n) })
	}

	// The coordinator.
	co, err := s.NewCoordinator(ctx, "A", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer co.Close()
	if err := co.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := cluster.New(cluster.Config{ReleaseTimeoutTicks: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodeEvents := s.WatchNodes(ctx, 0)
	live, err := s.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var evs []cluster.Event
	for _, n := range nodes {
		evs = append(evs, cluster.NodeJoined{Node: n, Drives: []string{n + "1", n + "2", n + "3", n + "4"}})
		if _, ok := live[n]; !ok {
			evs = append(evs, cluster.LeaseExpired{Node: n})
		}
	}
	seed := map[string]string{"a": "B1,C1,D1,E1", "b": "A1,C2,D2,E2", "c": "A2,B2,D3,E3", "d": "A3,B3,C3,E4", "e": "A4,B4,C4,D4"}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		var ms []cluster.MemberSpec
		for _, d := range strings.Split(seed[name], ",") {
			ms = append(ms, cluster.MemberSpec{Drive: d})
		}
		evs = append(evs, cluster.ArrayDefined{Name: name, Level: cluster.RAID5, Home: strings.ToUpper(name), Members: ms})
		o, err := s.Ownership(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, cluster.ArrayObserved{Array: name, Owner: o.Owner, Epoch: o.Epoch})
	}
	if err := m.Restore(evs); err != nil {
		t.Fatal(err)
	}
	deliver := func() {
		for _, a := range m.Ready() {
			if a.Performer() == "" {
				if r, ok := a.(cluster.RecordEvent); ok {
					if _, err := s.AppendEvent(ctx, Event{Kind: r.Kind, Array: r.Array, Node: r.Node, From: r.From, To: r.To, Epoch: r.Epoch, Message: r.Message}); err != nil && ctx.Err() == nil {
						t.Errorf("event log: %v", err)
					}
				}
				continue
			}
			b, _ := cluster.MarshalAction(a)
			if _, err := s.Enqueue(ctx, co.Guard(), "intents."+a.Performer(), b); err != nil && ctx.Err() == nil {
				t.Errorf("deliver %s: %v", a, err)
			}
		}
	}
	deliver()
	reports := s.WatchQueue(ctx, "reports", 1)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	coordDone := make(chan struct{})
	go func() {
		defer close(coordDone)
		for {
			select {
			case <-ctx.Done():
				return
			case ne := <-nodeEvents:
				if ne.Alive {
					_ = m.Step(cluster.NodeReturned{Node: ne.Node})
				} else {
					_ = m.Step(cluster.LeaseExpired{Node: ne.Node})
				}
			case msg := <-reports:
				ev, err := cluster.UnmarshalEvent(msg.Payload)
				if err != nil {
					t.Errorf("bad report: %v", err)
					return
				}
				if err := m.Step(ev); err != nil {
					t.Errorf("report %T: %v", ev, err)
				}
				_ = s.Done(ctx, msg)
			case <-tick.C:
				m.Tick()
			}
			deliver()
			mu.Lock()
			snap = m.Arrays()
			mu.Unlock()
		}
	}()

	waitOwner := func(array, owner string, epoch uint64) {
		t.Helper()
		for {
			o, err := s.Ownership(ctx, array)
			mu.Lock()
			srv := serving[array]
			mu.Unlock()
			if err == nil && o.Owner == owner && o.Epoch == epoch && srv == owner {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("array %s: store says %+v, served by %q; want %s at epoch %d", array, o, srv, owner, epoch)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		waitOwner(name, strings.ToUpper(name), 1)
	}
	start := time.Now()
	leases["B"].Abandon() // B's daemon dies: it serves nothing any more
	mu.Lock()
	delete(serving, "b")
	mu.Unlock()
	waitOwner("b", "A", 2)
	t.Logf("b served by A %s after B's daemon died (lease TTL 2s)", time.Since(start).Round(time.Millisecond))

	l, err := s.Register(ctx, NodeInfo{Node: "B"}, 2*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	leases["B"] = l
	waitOwner("b", "B", 3)
	for {
		mu.Lock()
		view := snap
		mu.Unlock()
		ok := len(view) == 5
		for _, a := range view {
			if a.State != cluster.StateOptimal || a.Owner != a.Home {
				ok = false
			}
		}
		if ok {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("cluster did not converge: %+v", view)
		}
		time.Sleep(20 * time.Millisecond)
	}
	log, err := s.Events(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range log {
		kinds = append(kinds, e.Kind+":"+e.Array+e.Node)
	}
	joined := strings.Join(kinds, " ")
	for _, want := range []string{"assign:a", "node-lost:B", "failover:b", "node-returned:B", "handoff:b"} {
		if !strings.Contains(joined, want) {
			t.Errorf("event log lacks %s: %s", want, joined)
		}
	}
	cancel()
	<-coordDone
	performers.Wait()
}
