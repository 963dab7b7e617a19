package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"tier0/internal/testenv"
)

func freePort(t *testing.T) int { return freePortTB(t) }

func freePortTB(t testing.TB) int {
	t.Helper()
	return testenv.FreePort(t)
}

func peers(t *testing.T, n int) []Peer {
	var ps []Peer
	for i := range n {
		ps = append(ps, Peer{
			Name:      fmt.Sprintf("n%d", i),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		})
	}
	return ps
}

func options(ps []Peer, i int, dir string) Options {
	return Options{Name: ps[i].Name, Peers: ps, DataDir: filepath.Join(dir, ps[i].Name),
		TickMs: 10, ElectionMs: 100, StartTimeout: 20 * time.Second}
}

// openCluster starts n embedded members at once (a member only becomes
// ready with a quorum) and closes them at the end of the test.
func openCluster(t *testing.T, n int) ([]*Store, []Peer, string) {
	t.Helper()
	ps, dir := peers(t, n), t.TempDir()
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = Open(t.Context(), options(ps, i, dir)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	t.Cleanup(func() {
		for _, s := range stores {
			if s != nil {
				s.Close()
			}
		}
	})
	return stores, ps, dir
}

// ctxT bounds a whole test's store requests and watches: a hang fails the
// test instead of the package. It is no measure of speed: under a loaded CI
// machine (go test -race -p 2 on 2 cores) TestRestartRejoin took over 30 s
// and failed at 20 s with "restart of a single member: context deadline
// exceeded", and TestRevokeSeenLateKeepsLease, which waits 13 s by design,
// took 15 s (its watch closes when ctx ends and reads as an event).
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestOptionsRejected(t *testing.T) {
	for _, o := range []Options{
		{},
		{Peers: []Peer{{Name: "a"}, {Name: "b"}}},
		{Peers: []Peer{{Name: "a"}}, Endpoints: []string{"http://x:1"}},
	} {
		if _, err := Open(t.Context(), o); !errors.Is(err, ErrBadOptions) {
			t.Errorf("Open(%+v) = %v, want ErrBadOptions", o, err)
		}
	}
}

func TestLeaseExpiryDetected(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	watch := s.WatchNodes(ctx, 0)
	a, err := s.Register(ctx, NodeInfo{Node: "A", Domain: "r1"}, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Register(ctx, NodeInfo{Node: "B"}, 3*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	for range 2 {
		if ev := <-watch; !ev.Alive {
			t.Fatalf("first events must be registrations, got %+v", ev)
		}
	}
	a.Abandon() // A "crashes": no more renewals, no revoke
	start := time.Now()
	var ev NodeEvent
	select {
	case ev = <-watch:
	case <-time.After(5 * time.Second):
		t.Fatal("lease expiry of A not seen within 5s of a 1s TTL")
	}
	if ev.Node != "A" || ev.Alive {
		t.Fatalf("got %+v, want A not alive", ev)
	}
	took := time.Since(start)
	if took < 500*time.Millisecond {
		t.Fatalf("A expired after %s, before its 1s TTL could have run out", took)
	}
	nodes, err := s.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := nodes["A"]; ok {
		t.Fatalf("A still listed alive: %v", nodes)
	}
	if _, ok := nodes["B"]; !ok {
		t.Fatalf("B, which renews, is not alive after %s: %v", took, nodes)
	}
	select {
	case <-b.Lost():
		t.Fatalf("B lost its lease while renewing: %v", b.Err())
	default:
	}
	t.Logf("expiry of a 1s lease detected after %s", took)
}

// TestSelfFenceBeforeStoreExpiry: when the node cannot reach the store, its
// Lost channel fires before the lease's TTL has run out counted from its
// last renewal, that is, before the store may expire it and hand its
// arrays on.
func TestSelfFenceBeforeStoreExpiry(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	l, err := s.Register(ctx, NodeInfo{Node: "A"}, 3*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Abandon()
	time.Sleep(1200 * time.Millisecond) // at least one renewal
	deadline := l.Deadline()
	s.closeMember() // the store becomes unreachable
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost did not fire with the store gone")
	}
	if now := time.Now(); !now.Before(deadline) {
		t.Fatalf("Lost fired at %s, not before the deadline %s", now, deadline)
	}
	if l.Err() == nil {
		t.Fatal("Lost without a reason")
	}
}

func TestOwnershipCASRace(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	for _, n := range []string{"A", "B"} {
		l, err := s.Register(ctx, NodeInfo{Node: n}, 5*time.Second, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(ctx)
	}
	wins := map[string]int{}
	for epoch := uint64(1); epoch <= 20; epoch++ {
		var wg sync.WaitGroup
		res := map[string]error{}
		var mu sync.Mutex
		for _, n := range []string{"A", "B"} {
			wg.Go(func() {
				_, err := s.ClaimOwnership(ctx, "x", n, epoch)
				mu.Lock()
				res[n] = err
				mu.Unlock()
			})
		}
		wg.Wait()
		var winner string
		for n, err := range res {
			switch {
			case err == nil:
				if winner != "" {
					t.Fatalf("epoch %d: both %s and %s won", epoch, winner, n)
				}
				winner = n
			case !errors.Is(err, ErrConflict):
				t.Fatalf("epoch %d: %s: %v, want ErrConflict", epoch, n, err)
			}
		}
		if winner == "" {
			t.Fatalf("epoch %d: nobody won: %v", epoch, res)
		}
		wins[winner]++
		o, err := s.Ownership(ctx, "x")
		if err != nil || o.Owner != winner || o.Epoch != epoch {
			t.Fatalf("epoch %d: store holds %+v (%v), want %s", epoch, o, err, winner)
		}
		for n, err := range res {
			var ce *ConflictError
			if n != winner && (!errors.As(err, &ce) || ce.Current.Owner != winner || ce.Current.Epoch != epoch) {
				t.Fatalf("epoch %d: loser %s got %v, want the winner's record", epoch, n, err)
			}
		}
	}
	t.Logf("wins over 20 races: %v", wins)
	// A stale epoch never wins; a node without a lease never wins; the
	// holder's retry of its own claim succeeds.
	loser := "A"
	if o, _ := s.Ownership(ctx, "x"); o.Owner == "A" {
		loser = "B"
	}
	if _, err := s.ClaimOwnership(ctx, "x", loser, 20); !errors.Is(err, ErrConflict) {
		t.Fatalf("claim at the current epoch by the loser: %v, want ErrConflict", err)
	}
	if _, err := s.ClaimOwnership(ctx, "x", loser, 19); !errors.Is(err, ErrConflict) {
		t.Fatalf("claim at an old epoch: %v, want ErrConflict", err)
	}
	if o, err := s.ClaimOwnership(ctx, "x", map[string]string{"A": "B", "B": "A"}[loser], 20); err != nil || o.Epoch != 20 {
		t.Fatalf("holder's retry: %+v, %v", o, err)
	}
	if _, err := s.ClaimOwnership(ctx, "x", "C", 21); !errors.Is(err, ErrNotAlive) {
		t.Fatalf("claim by an unregistered node: %v, want ErrNotAlive", err)
	}
	if o, _ := s.Ownership(ctx, "x"); o.Epoch != 20 {
		t.Fatalf("failed claims changed the record: %+v", o)
	}
}

func TestStateEventsAndWatch(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	type arr struct {
		Level string `json:"level"`
		Home  string `json:"home"`
	}
	ch := s.Watch(ctx, Desired, "arrays", 0)
	owners := s.WatchOwnership(ctx, 0)
	if _, err := s.Put(ctx, Desired, "arrays", "a", arr{"raid5", "A"}); err != nil {
		t.Fatal(err)
	}
	c := <-ch
	if c.Kind != "arrays" || c.Name != "a" || c.Deleted || string(c.Value) != `{"level":"raid5","home":"A"}` {
		t.Fatalf("watch got %+v", c)
	}
	var got arr
	if _, err := s.Get(ctx, Desired, "arrays", "a", &got); err != nil || got.Home != "A" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := s.Get(ctx, Observed, "arrays", "zz", &got); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	if _, err := s.Put(ctx, Desired, "arr/ays", "a", 1); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("kind with a slash accepted: %v", err)
	}
	l, _ := s.Register(ctx, NodeInfo{Node: "A"}, 5*time.Second, 0)
	defer l.Close(ctx)
	if _, err := s.ClaimOwnership(ctx, "a", "A", 1); err != nil {
		t.Fatal(err)
	}
	if o := <-owners; o.Array != "a" || o.Owner != "A" || o.Epoch != 1 {
		t.Fatalf("ownership watch got %+v", o)
	}

	var want []Event
	for i, k := range []string{"node-lost", "failover", "node-returned"} {
		ev, err := s.AppendEvent(ctx, Event{Kind: k, Array: "b", Epoch: uint64(i + 1), Duration: 1.5})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ev)
	}
	evs, err := s.Events(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("log has %d events, want 3: %+v", len(evs), evs)
	}
	for i := range evs {
		if evs[i].Kind != want[i].Kind || evs[i].Revision != want[i].Revision || evs[i].Time.IsZero() {
			t.Fatalf("event %d = %+v, want %+v", i, evs[i], want[i])
		}
		if i > 0 && evs[i].Revision <= evs[i-1].Revision {
			t.Fatalf("log not in write order: %+v", evs)
		}
	}
	tail, err := s.Events(ctx, want[0].Revision, 1)
	if err != nil || len(tail) != 1 || tail[0].Kind != "failover" {
		t.Fatalf("Events(after first, limit 1) = %+v, %v", tail, err)
	}
}

// TestRestartRejoin: in a 3-member cluster one member stops; the other two
// keep a quorum and take writes; the member restarts from its data
// directory, rejoins and catches up. A single member restarts with its data.
func TestRestartRejoin(t *testing.T) {
	st, ps, dir := openCluster(t, 3)
	ctx := ctxT(t)
	if _, err := st[0].Put(ctx, Desired, "arrays", "a", "before"); err != nil {
		t.Fatal(err)
	}
	st[2].Close()
	st[2] = nil
	if _, err := st[0].Put(ctx, Desired, "arrays", "b", "while-away"); err != nil {
		t.Fatalf("write with 2 of 3 members: %v", err)
	}
	s2, err := Open(ctx, options(ps, 2, dir))
	if err != nil {
		t.Fatalf("restart of member 2: %v", err)
	}
	st[2] = s2
	// Read from member 2 alone, serializably: its own copy of the data.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ps[2].ClientURL}, Logger: zap.NewNop(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := cli.Get(ctx, s2.key(string(Desired), "arrays", "b"), clientv3.WithSerializable())
		if err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == `"while-away"` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted member did not catch up: %v %v", resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	members, err := cli.MemberList(ctx)
	if err != nil || len(members.Members) != 3 {
		t.Fatalf("member list after rejoin: %v %v", members, err)
	}

	one, ps1, dir1 := openCluster(t, 1)
	if _, err := one[0].Put(ctx, Observed, "nodes", "A", 1); err != nil {
		t.Fatal(err)
	}
	one[0].Close()
	one[0] = nil
	again, err := Open(ctx, options(ps1, 0, dir1))
	if err != nil {
		t.Fatalf("restart of a single member: %v", err)
	}
	defer again.Close()
	var v int
	if _, err := again.Get(ctx, Observed, "nodes", "A", &v); err != nil || v != 1 {
		t.Fatalf("after restart: %d, %v", v, err)
	}
}

func TestCoordinatorElection(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	a, err := s.NewCoordinator(ctx, "A", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := s.NewCoordinator(ctx, "B", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.Leader(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("leader before any campaign: %v, want ErrNotFound", err)
	}
	if err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() { won <- b.Campaign(ctx) }()
	select {
	case err := <-won:
		t.Fatalf("B became coordinator while A leads: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if l, err := b.Leader(ctx); err != nil || l != "A" {
		t.Fatalf("leader = %q, %v; want A", l, err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-won:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B not elected after A resigned")
	}
	if l, _ := a.Leader(ctx); l != "B" {
		t.Fatalf("leader after resign = %q, want B", l)
	}
}

// TestGuardedQueue: intents written under the coordinator's guard are
// refused once it has resigned; the queue keeps order; Done removes.
func TestGuardedQueue(t *testing.T) {
	st, _, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	c, err := s.NewCoordinator(ctx, "A", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	g := c.Guard()
	w := s.WatchQueue(ctx, "intents.B", 0)
	for _, p := range []string{"one", "two", "three"} {
		if _, err := s.Enqueue(ctx, g, "intents.B", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"one", "two", "three"} {
		if m := <-w; string(m.Payload) != want {
			t.Fatalf("watch got %q, want %q", m.Payload, want)
		}
	}
	ms, err := s.Pending(ctx, "intents.B")
	if err != nil || len(ms) != 3 || string(ms[0].Payload) != "one" || string(ms[2].Payload) != "three" {
		t.Fatalf("pending %v, %v", ms, err)
	}
	if err := s.Done(ctx, ms[0]); err != nil {
		t.Fatal(err)
	}
	if ms, _ := s.Pending(ctx, "intents.B"); len(ms) != 2 || string(ms[0].Payload) != "two" {
		t.Fatalf("after Done: %v", ms)
	}
	if err := c.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Enqueue(ctx, g, "intents.B", []byte("stale")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("write under a resigned coordinator's guard: %v, want ErrNotLeader", err)
	}
	if _, err := s.Enqueue(ctx, nil, "reports", []byte("r")); err != nil {
		t.Fatalf("unguarded report: %v", err)
	}
}

func TestEtcdLogsGoToInjectedLogger(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	ps := peers(t, 1)
	o := options(ps, 0, t.TempDir())
	o.Logger, o.EtcdLogLevel = slog.New(slog.NewTextHandler(w, nil)), "info"
	s, err := Open(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), "component=etcd") || !strings.Contains(buf.String(), "etcd member ready") {
		t.Fatalf("etcd's logs did not reach the injected logger:\n%.2000s", buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestExternalAndClientOnly: a node that is not a voting peer, and a node
// pointed at an existing etcd by endpoints, run no member and share the
// same state.
func TestExternalAndClientOnly(t *testing.T) {
	st, ps, _ := openCluster(t, 1)
	ctx := ctxT(t)
	ext, err := Open(ctx, Options{Name: "X", Endpoints: []string{ps[0].ClientURL}})
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	cli, err := Open(ctx, Options{Name: "Y", Peers: ps})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if ext.Embedded() || cli.Embedded() || !st[0].Embedded() {
		t.Fatalf("embedded: external %v, client-only %v, peer %v", ext.Embedded(), cli.Embedded(), st[0].Embedded())
	}
	if _, err := ext.Put(ctx, Desired, "policies", "failback", "manual"); err != nil {
		t.Fatal(err)
	}
	var v string
	if _, err := cli.Get(ctx, Desired, "policies", "failback", &v); err != nil || v != "manual" {
		t.Fatalf("client-only read %q, %v", v, err)
	}
}

// TestReplaceDeadMember follows the documented procedure: member n2 is
// lost for good; it is removed, a new member n3 is added, and n3 starts
// with an empty data directory and JoinExisting, then serves the data.
func TestReplaceDeadMember(t *testing.T) {
	st, ps, dir := openCluster(t, 3)
	ctx := ctxT(t)
	if _, err := st[0].Put(ctx, Desired, "arrays", "a", "kept"); err != nil {
		t.Fatal(err)
	}
	st[2].Close()
	st[2] = nil
	c := st[0].Client()
	ml, err := c.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var deadID uint64
	for _, mb := range ml.Members {
		if mb.Name == "n2" {
			deadID = mb.ID
		}
	}
	if _, err := c.MemberRemove(ctx, deadID); err != nil {
		t.Fatalf("member remove: %v", err)
	}
	n3 := peers(t, 1)[0]
	n3.Name = "n3"
	// etcd refuses to add a voting member until the remaining ones have
	// been connected for its health interval (5s); retry like an operator.
	for {
		_, err := c.MemberAdd(ctx, []string{n3.PeerURL})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("member add: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	newPeers := []Peer{ps[0], ps[1], n3}
	o := options(newPeers, 2, dir)
	o.JoinExisting = true
	s3, err := Open(ctx, o)
	if err != nil {
		t.Fatalf("start replacement member: %v", err)
	}
	defer s3.Close()
	var v string
	if _, err := s3.Get(ctx, Desired, "arrays", "a", &v); err != nil || v != "kept" {
		t.Fatalf("replacement reads %q, %v", v, err)
	}
	ml, err = c.MemberList(ctx)
	if err != nil || len(ml.Members) != 3 {
		t.Fatalf("members after replacement: %v, %v", ml, err)
	}
	for _, mb := range ml.Members {
		if mb.Name == "n2" || mb.Name == "" {
			t.Fatalf("member list still has %q: %v", mb.Name, ml.Members)
		}
	}
}
