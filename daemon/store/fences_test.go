package store

import (
	"testing"
	"time"
)

// TestSelfFencedRegistrationIsReported: a node whose lease was deleted
// registers again within the grace that WatchNodes holds the deletion
// back, with the same Started but one more self-fence: it stopped serving,
// so the watcher must hear its new registration (alive, Fences 1), though
// not the deletion; the same registration again (same Fences) stays
// unreported (TestRevokedLeaseRegistersAgain).
func TestSelfFencedRegistrationIsReported(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	const ttl = 2 * time.Second
	started := time.Now()
	a, err := s.Register(ctx, NodeInfo{Node: "A", Started: started}, ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	watch := s.WatchNodes(ctx, 0)
	time.Sleep(200 * time.Millisecond)
	a.Abandon() // A fences itself: it renews the lost lease no more
	if _, err := s.Client().Revoke(ctx, a.ID()); err != nil {
		t.Fatal(err)
	}
	again, err := s.Register(ctx, NodeInfo{Node: "A", Started: started, Fences: 1}, ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Abandon()
	select {
	case ev := <-watch:
		if ev.Node != "A" || !ev.Alive || ev.Info.Fences != 1 || !ev.Info.Started.Equal(started) {
			t.Fatalf("watcher saw %+v after A fenced itself and registered again; want A alive with Fences 1 and its Started", ev)
		}
	case <-time.After(ttl + NodeGoneGrace(ttl) + 2*time.Second):
		t.Fatal("A's registration after fencing itself (same Started, Fences 1) was never reported: the coordinator would not take its arrays back")
	}
}
