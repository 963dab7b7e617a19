package store

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// stallProxy forwards TCP connections to an etcd member and can hold every
// byte in both directions for a while: the store, seen from one client,
// answering nothing and then everything at once.
type stallProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	flow   chan struct{} // closed while bytes flow
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listener: %v", err)
	}
	p := &stallProxy{ln: ln, target: strings.TrimPrefix(target, "http://"), flow: make(chan struct{})}
	close(p.flow)
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

func (p *stallProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flow
}

func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flow = make(chan struct{})
}

func (p *stallProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flow:
	default:
		close(p.flow)
	}
}

func (p *stallProxy) serve(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	pipe := func(dst, src net.Conn) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 32<<10)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				<-p.gate()
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go pipe(u, c)
	pipe(c, u)
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
