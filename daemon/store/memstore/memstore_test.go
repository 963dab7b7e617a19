package memstore

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/clock"
	"tier0/daemon/store"
)

func newTest(t *testing.T) (*Store, *clock.Fake) {
	clk := clock.NewFake(time.Time{})
	return New(clk, "/tier0/t/"), clk
}

// A lease lives on the clock: renewed it stays, unrenewed the store drops
// it with its liveness key after the TTL, and Renew then reports it lost.
func TestLeaseExpiresOnTheClock(t *testing.T) {
	s, clk := newTest(t)
	ctx := context.Background()
	a := s.View("A")
	l, err := a.Register(ctx, store.NodeInfo{Node: "A"}, 5*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		clk.Advance(time.Second)
		l.Renew()
	}
	if nodes, _ := a.Nodes(ctx); len(nodes) != 1 || !l.Held() {
		t.Fatalf("renewed lease: nodes %v, held %v; want A alive and held", nodes, l.Held())
	}
	clk.Advance(4 * time.Second)
	if l.Held() {
		t.Error("lease held 4s after its last renewal with TTL 5s and margin 1s")
	}
	clk.Advance(time.Second)
	if nodes, _ := a.Nodes(ctx); len(nodes) != 0 {
		t.Errorf("nodes after the TTL passed without renewal: %v, want none", nodes)
	}
	l.Renew()
	select {
	case <-l.Lost():
	default:
		t.Fatal("Renew after expiry did not close Lost")
	}
	if !errors.Is(l.Err(), store.ErrNotAlive) {
		t.Errorf("Err %v, want ErrNotAlive", l.Err())
	}
}

// A partitioned node's calls fail as a timeout; its lease is lost by its
// local deadline, and the other nodes see it gone after the TTL.
func TestPartition(t *testing.T) {
	s, clk := newTest(t)
	ctx := context.Background()
	a, b := s.View("A"), s.View("B")
	l, err := a.Register(ctx, store.NodeInfo{Node: "A"}, 5*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s.Partition("A", true)
	if _, err := a.Put(ctx, store.Observed, "x", "y", 1); !errors.Is(err, ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put while partitioned: %v, want ErrUnreachable and DeadlineExceeded", err)
	}
	clk.Advance(4 * time.Second)
	l.Renew()
	if l.Err() == nil {
		t.Fatal("lease not lost at its local deadline minus margin while partitioned")
	}
	if nodes, _ := b.Nodes(ctx); len(nodes) != 1 {
		t.Errorf("B sees %v before the TTL, want A still alive", nodes)
	}
	clk.Advance(time.Second)
	if nodes, _ := b.Nodes(ctx); len(nodes) != 0 {
		t.Errorf("B sees %v after the TTL, want none", nodes)
	}
	s.Partition("A", false)
	if _, err := a.Put(ctx, store.Observed, "x", "y", 1); err != nil {
		t.Fatalf("put after the partition healed: %v", err)
	}
}

// ClaimOwnership is a compare-and-swap: epochs only increase, the claimant
// must be alive, a repeated claim succeeds.
func TestClaimOwnership(t *testing.T) {
	s, _ := newTest(t)
	ctx := context.Background()
	a, b := s.View("A"), s.View("B")
	if _, err := a.ClaimOwnership(ctx, "x", "A", 1); !errors.Is(err, store.ErrNotAlive) {
		t.Fatalf("claim without a lease: %v, want ErrNotAlive", err)
	}
	for _, v := range []*View{a, b} {
		if _, err := v.Register(ctx, store.NodeInfo{Node: v.node}, 5*time.Second, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.ClaimOwnership(ctx, "x", "A", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ClaimOwnership(ctx, "x", "A", 1); err != nil {
		t.Fatalf("repeated claim: %v", err)
	}
	var ce *store.ConflictError
	if _, err := b.ClaimOwnership(ctx, "x", "B", 1); !errors.As(err, &ce) || ce.Current.Owner != "A" {
		t.Fatalf("B's claim of epoch 1: %v, want a conflict naming A", err)
	}
	if _, err := b.ClaimOwnership(ctx, "x", "B", 2); err != nil {
		t.Fatal(err)
	}
	if own, _ := a.Ownership(ctx, "x"); own.Owner != "B" || own.Epoch != 2 {
		t.Fatalf("ownership %+v, want B at 2", own)
	}
}

// The raw client serves prefix reads and watches from the revision after
// a read, as the task loop uses them.
func TestClientWatch(t *testing.T) {
	s, _ := newTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cli := s.View("A").Client()
	if _, err := cli.Put(ctx, "/tier0/t/tasks/A/1", "one"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "/tier0/t/tasks/A/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "one" {
		t.Fatalf("get: %v %v", resp, err)
	}
	wc := cli.Watch(ctx, "/tier0/t/tasks/A/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	if _, err := s.View("B").Client().Put(ctx, "/tier0/t/tasks/A/2", "two"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.View("B").Client().Put(ctx, "/tier0/t/tasks/B/1", "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "/tier0/t/tasks/A/1"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		wr := <-wc
		for _, ev := range wr.Events {
			got = append(got, ev.Type.String()+" "+string(ev.Kv.Key))
		}
	}
	if got[0] != "PUT /tier0/t/tasks/A/2" || got[1] != "DELETE /tier0/t/tasks/A/1" {
		t.Fatalf("watch events %q", got)
	}
	s.Partition("A", true)
	if _, ok := <-wc; ok {
		t.Fatal("the watch of a partitioned node kept running")
	}
}
