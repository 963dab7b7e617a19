package store

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/clock"
)

// stallProxy forwards TCP connections to an etcd member and can hold every
// byte in both directions for a while: the store, seen from one client,
// answering nothing and then everything at once. stallReplies holds only
// the member's answers (its requests still arrive and are applied).
type stallProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	flow    chan struct{} // closed while bytes flow to the member
	replies chan struct{} // closed while bytes flow from the member
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listener: %v", err)
	}
	p := &stallProxy{ln: ln, target: strings.TrimPrefix(target, "http://"), flow: make(chan struct{}), replies: make(chan struct{})}
	close(p.flow)
	close(p.replies)
	t.Cleanup(func() { p.release(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *stallProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *stallProxy) gate(toMember bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if toMember {
		return p.flow
	}
	return p.replies
}

func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flow = make(chan struct{})
	p.replies = make(chan struct{})
}

func (p *stallProxy) stallReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replies = make(chan struct{})
}

func (p *stallProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range []chan struct{}{p.flow, p.replies} {
		select {
		case <-c:
		default:
			close(c)
		}
	}
}

func (p *stallProxy) serve(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	pipe := func(dst, src net.Conn, toMember bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				<-p.gate(toMember)
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(u, c, true)
	pipe(c, u, false)
}

// TestRevokeSeenLateKeepsLease: the store revokes a node's lease and the
// node hears nothing from the store for 2.6 s from then on (an etcd
// leader that was frozen and thaws revokes every lease, and the cluster is
// busy catching up: docs/RELIABILITY.md problem 5). The node sees the
// revoke later than half its TTL after its last renewal, but well within
// the lease it holds (TTL − margin): it keeps its lease under a new one,
// and a watcher of the node keys, which holds the deletion back a TTL,
// sees nothing of it.
func TestRevokeSeenLateKeepsLease(t *testing.T) {
	st, ps, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	const ttl = 8 * time.Second // 6.4 s to register again, 2.4 s before the fix
	p := newStallProxy(t, ps[0].ClientURL)
	ns, err := Open(ctx, Options{Name: "A", Endpoints: []string{p.url()}, StartTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	a, err := ns.Register(ctx, NodeInfo{Node: "A"}, ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Abandon()
	watch := s.WatchNodes(ctx, 0)
	time.Sleep(500 * time.Millisecond)
	old := a.ID()
	p.stall()
	if _, err := s.Client().Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2600 * time.Millisecond)
	p.release()
	quiet := time.After(ttl + 2*time.Second)
	for {
		select {
		case ev := <-watch:
			t.Fatalf("watcher saw %+v for A, whose lease was revoked and replaced within its own deadline", ev)
		case <-a.Lost():
			t.Fatalf("A lost its lease after the store revoked it and answered again 2.6 s later: %v", a.Err())
		case <-quiet:
			if a.ID() == old || a.Stats().Rejoins != 1 {
				t.Fatalf("A's lease %x (was %x), %d rejoins: want a new lease, 1 rejoin", int64(a.ID()), int64(old), a.Stats().Rejoins)
			}
			if !a.Held() {
				t.Fatalf("A does not hold its lease: deadline %s", a.Deadline())
			}
			return
		}
	}
}

// TestRegisterWhoseLeaseEndsBeforeItsKeyIsPut: the lease Register grants
// is gone by the time its key is put — on a loaded store the put's first
// try timed out (it was applied later) and its retry came after the 3 s
// lease had expired, nothing renewing it yet (a CI run of
// TestLeaseSurvivesFrozenMember: `register node "node2": etcdserver:
// requested lease not found`). Here the member's answer to the grant is
// held until the lease is revoked. Register grants another lease and
// publishes the node under it, as it would have with a faster store.
func TestRegisterWhoseLeaseEndsBeforeItsKeyIsPut(t *testing.T) {
	st, ps, _ := openCluster(t, 1)
	s := st[0]
	ctx := ctxT(t)
	p := newStallProxy(t, ps[0].ClientURL)
	var armed atomic.Bool
	now := func() time.Time {
		if armed.CompareAndSwap(true, false) {
			p.stallReplies() // Register's first clock reading: before its grant
		}
		return time.Now()
	}
	ns, err := Open(ctx, Options{Name: "A", Endpoints: []string{p.url()}, StartTimeout: 10 * time.Second, Clock: nowClock{clock.Real, now}})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	// a lease granted and revoked through the proxy first: the
	// connections Register uses are up before the answers are held
	warm, err := ns.Client().Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Client().Revoke(ctx, warm.ID); err != nil {
		t.Fatal(err)
	}
	before, err := s.Client().Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	known := map[clientv3.LeaseID]bool{}
	for _, l := range before.Leases {
		known[l.ID] = true
	}
	revoked := make(chan clientv3.LeaseID, 1)
	go func() {
		defer p.release()
		for ctx.Err() == nil {
			ls, err := s.Client().Leases(ctx)
			if err == nil {
				for _, l := range ls.Leases {
					if !known[l.ID] {
						if _, err := s.Client().Revoke(ctx, l.ID); err != nil {
							t.Errorf("revoke the lease Register was granted (%x): %v", int64(l.ID), err)
						}
						revoked <- l.ID
						return
					}
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	armed.Store(true)
	a, err := ns.Register(ctx, NodeInfo{Node: "A", Started: time.Now()}, 3*time.Second, 0)
	if err != nil {
		t.Fatalf("Register whose first lease was revoked before its key was put: %v; want it registered under a new lease", err)
	}
	defer a.Abandon()
	var old clientv3.LeaseID
	select {
	case old = <-revoked:
	case <-ctx.Done():
		t.Fatal("the lease Register was granted never appeared in the store's lease list")
	}
	if a.ID() == old {
		t.Fatalf("registered under lease %x, which was revoked", int64(old))
	}
	resp, err := s.Client().Get(ctx, s.key("nodes", "A"))
	if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != a.ID() {
		t.Fatalf("node key after Register: %v, %v; want it put under lease %x", resp, err, int64(a.ID()))
	}
	if !a.Held() {
		t.Fatalf("lease %x not held after Register: %v", int64(a.ID()), a.Err())
	}
}

// nowClock is a Clock whose Now is now.
type nowClock struct {
	clock.Clock
	now func() time.Time
}

func (c nowClock) Now() time.Time { return c.now() }
