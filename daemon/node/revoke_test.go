package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/config"
	"tier0/daemon/store"
)

// stallProxy forwards TCP connections to an etcd member and can hold
// every byte in both directions for a while: the store, seen from one
// node, answering nothing and then everything at once (as right after an
// etcd leader thaws on a loaded machine).
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
	p := &stallProxy{ln: ln, target: target, flow: make(chan struct{})}
	close(p.flow)
	t.Cleanup(func() { ln.Close() })
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

// stall holds every byte read from now on until release.
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
	u, err := net.Dial("tcp", strings.TrimPrefix(p.target, "http://"))
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

// syncBuf is a log sink shared by the nodes of a test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// count counts the lines after offset from that contain substr.
func (s *syncBuf) count(from int, substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String()[from:], substr)
}

func (s *syncBuf) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Len()
}

// liveSite is an in-process cluster of four complete nodes (Node.Run:
// liveness, tasks, coordinator election, housekeeping) over one etcd
// member, each node's store connection through a stallProxy of its own.
// Arrays X (home A) and Y (home B) are raid5 over three drives each.
type liveSite struct {
	t       *testing.T
	etcd    *store.Store // a client of the member that bypasses every proxy
	nodes   map[string]*Node
	proxies map[string]*stallProxy
	log     *syncBuf
	ttl     time.Duration
}

func newLiveSite(t *testing.T, ttl time.Duration) *liveSite {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: rv\nworkdir: %s\nnodes:\n", dir)
	names := []string{"A", "B", "C", "D"}
	for _, name := range names {
		fmt.Fprintf(&b, "  - {name: %s, address: 127.0.0.1, backend: {port: %d}, frontend: {port: %d}, api: {port: %d}, drives: [{name: %s1, path: %s, size: 8MiB}, {name: %s2, path: %s, size: 8MiB}]}\n",
			name, freeTCPPort(t), freeTCPPort(t), freeTCPPort(t), name, filepath.Join(dir, name+"1.img"), name, filepath.Join(dir, name+"2.img"))
	}
	// The endpoint is never dialled: every node is given its store.
	b.WriteString("control_plane:\n  etcd: {endpoints: [http://127.0.0.1:9]}\n")
	fmt.Fprintf(&b, "policies: {lease_ttl: %s, member_io_timeout: 3s, rebuild_rate_mibs: 100000, rebuild_adaptive: false}\n", ttl)
	b.WriteString("arrays:\n  - {name: X, level: raid5, chunk_kib: 16, home: A, members: [B1, C1, D1]}\n  - {name: Y, level: raid5, chunk_kib: 16, home: B, members: [A1, C2, D2]}\n")
	cfg, err := config.Parse("site.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("test site config: %v", err)
	}
	logs := &syncBuf{}
	base := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	peer := store.Peer{Name: "etcd0", ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freeTCPPort(t)), PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freeTCPPort(t))}
	etcd, err := store.Open(t.Context(), store.Options{Name: "etcd0", Peers: []store.Peer{peer}, DataDir: filepath.Join(dir, "etcd"),
		Prefix: "/tier0/rv/", ClusterToken: "tier0-rv", StartTimeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	s := &liveSite{t: t, etcd: etcd, nodes: map[string]*Node{}, proxies: map[string]*stallProxy{}, log: logs, ttl: ttl}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		for _, p := range s.proxies {
			p.release()
		}
		cancel()
		wg.Wait()
		etcd.Close()
		if t.Failed() {
			t.Logf("node logs:\n%s", logs.String())
		}
	})
	for _, name := range names {
		p := newStallProxy(t, peer.ClientURL)
		st, err := store.Open(t.Context(), store.Options{Name: name, Endpoints: []string{p.url()}, Prefix: "/tier0/rv/",
			Logger: base.With("node", name, "layer", "store"), StartTimeout: 20 * time.Second})
		if err != nil {
			t.Fatalf("store client of %s: %v", name, err)
		}
		n, err := New(Options{Config: cfg, Name: name, Logger: base, Store: st})
		if err != nil {
			t.Fatal(err)
		}
		s.nodes[name], s.proxies[name] = n, p
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.Run(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("node %s stopped: %v", name, err)
			}
		}()
	}
	return s
}

// arrayState is one array as the test sees it: the store's ownership
// record and what its owner runs.
type arrayState struct {
	owner    string
	epoch    uint64 // the store's
	runEpoch uint64 // the owner's running array's
}

func (s *liveSite) arrays(ctx context.Context) map[string]arrayState {
	out := map[string]arrayState{}
	for _, name := range []string{"X", "Y"} {
		own, err := s.etcd.Ownership(ctx, name)
		if err != nil {
			s.t.Fatalf("ownership of %s: %v", name, err)
		}
		as := arrayState{owner: own.Owner, epoch: own.Epoch}
		if n := s.nodes[own.Owner]; n != nil {
			n.mu.Lock()
			x := n.arrays[name]
			n.mu.Unlock()
			if x != nil {
				as.runEpoch = x.runEpoch.Load()
			}
		}
		out[name] = as
	}
	return out
}

// awaitServing waits until X runs on A and Y on B, each at the epoch the
// store names and active in the coordinator's published view, with every
// node's lease held.
func (s *liveSite) awaitServing(ctx context.Context) map[string]arrayState {
	s.t.Helper()
	var last map[string]arrayState
	for ctx.Err() == nil {
		last = s.arrays(ctx)
		x, y := last["X"], last["Y"]
		ok := x.owner == "A" && y.owner == "B" && x.epoch > 0 && y.epoch > 0 && x.runEpoch == x.epoch && y.runEpoch == y.epoch
		var v clusterView
		if _, err := s.etcd.Get(ctx, store.Observed, "cluster", "view", &v); err != nil || len(v.Arrays) != 2 {
			ok = false
		}
		for _, a := range v.Arrays {
			if a.Phase != "active" || a.Owner != a.Home {
				ok = false
			}
		}
		for _, n := range s.nodes {
			if l := n.lease.Load(); l == nil || !l.Held() {
				ok = false
			}
		}
		if ok && s.read("X") == nil && s.read("Y") == nil {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("arrays not served at home: %+v", last)
	return nil
}

// read reads the array's first block through its owner's frontend gate.
func (s *liveSite) read(array string) error {
	home := map[string]string{"X": "A", "Y": "B"}[array]
	n := s.nodes[home]
	n.mu.Lock()
	x := n.arrays[array]
	n.mu.Unlock()
	if x == nil {
		return fmt.Errorf("array %s not configured on %s", array, home)
	}
	buf := make([]byte, 4096)
	_, err := x.gate.ReadAt(buf, 0)
	return err
}

// leases returns each node's current store lease.
func (s *liveSite) leases() map[string]*store.Liveness {
	out := map[string]*store.Liveness{}
	for name, n := range s.nodes {
		if l, ok := n.lease.Load().(*store.Liveness); ok {
			out[name] = l
		}
	}
	return out
}

// checkUndisturbed requires that no node fenced itself or lost a lease
// since log offset from, that the same leases are held, and that both
// arrays still run at home at the epochs of before, readable.
func (s *liveSite) checkUndisturbed(ctx context.Context, what string, from int, leases map[string]*store.Liveness, before map[string]arrayState) {
	s.t.Helper()
	var probs []string
	if k := s.log.count(from, "self-fenced"); k > 0 {
		probs = append(probs, fmt.Sprintf("%d self-fence lines in the node logs", k))
	}
	for name, n := range s.nodes {
		if n.fenced.Load() {
			probs = append(probs, fmt.Sprintf("node %s is fenced", name))
		}
		l, _ := n.lease.Load().(*store.Liveness)
		if l != leases[name] {
			probs = append(probs, fmt.Sprintf("node %s registered again after losing its lease (%v)", name, leases[name].Err()))
		} else if !l.Held() {
			probs = append(probs, fmt.Sprintf("node %s does not hold its lease: %v", name, l.Err()))
		}
	}
	after := s.arrays(ctx)
	for name, b := range before {
		if a := after[name]; a != b {
			probs = append(probs, fmt.Sprintf("array %s: owner %s epoch %d running %d before, owner %s epoch %d running %d after", name, b.owner, b.epoch, b.runEpoch, a.owner, a.epoch, a.runEpoch))
		}
		if err := s.read(name); err != nil {
			probs = append(probs, fmt.Sprintf("array %s: read at home: %v", name, err))
		}
	}
	if len(probs) > 0 {
		s.t.Fatalf("%s: %s", what, strings.Join(probs, "; "))
	}
}

// revokeDuringStall stalls the proxies of nodes, revokes the leases ids
// directly in etcd (what an etcd leader that was frozen and thaws
// proposes: etcd #12528/#15247), releases the stall stall after it began;
// it returns the time by which the revocations were committed.
func (s *liveSite) revokeDuringStall(ctx context.Context, nodes []string, ids []clientv3.LeaseID, stall time.Duration) time.Time {
	s.t.Helper()
	began := time.Now()
	for _, n := range nodes {
		s.proxies[n].stall()
	}
	for _, id := range ids {
		if _, err := s.etcd.Client().Revoke(ctx, id); err != nil {
			s.t.Fatalf("revoke lease %x: %v", int64(id), err)
		}
	}
	at := time.Now()
	time.Sleep(time.Until(began.Add(stall)))
	for _, n := range nodes {
		s.proxies[n].release()
	}
	return at
}

// TestRevokedLeaseKeepsArraysServing: the store revokes leases long
// before their deadline — one node's, then every lease at once, the
// coordinator's session included — and the nodes concerned hear nothing
// from the store for a while after (docs/RELIABILITY.md problem 5: an etcd
// leader frozen past the TTL revokes every lease when it thaws, on a
// cluster busy catching up). No node may fence itself, every array keeps
// running at home at its epoch and stays readable, and the coordinator
// (a new one, for the second revoke) reassigns nothing.
func TestRevokedLeaseKeepsArraysServing(t *testing.T) {
	const ttl = 10 * time.Second
	// Longer than the TTL/2 − margin (3 s) within which a node used to
	// have to register again, well inside the TTL − margin (8 s) its own
	// lease gives: on a loaded machine the first answers after the stall
	// and the new lease and key can take 2–3 s more.
	const stall = 3200 * time.Millisecond
	s := newLiveSite(t, ttl)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	before := s.awaitServing(ctx)
	t.Logf("arrays served at home after %s: %+v", time.Since(start).Round(time.Millisecond), before)
	leases := s.leases()

	// One node: B, the owner of Y.
	from := s.log.size()
	at := s.revokeDuringStall(ctx, []string{"B"}, []clientv3.LeaseID{leases["B"].ID()}, stall)
	// A coordinator that acted on the deletion would do so after the
	// grace it holds deletions back; give it that and a few ticks more.
	time.Sleep(time.Until(at.Add(store.NodeGoneGrace(ttl) + 2*time.Second)))
	s.checkUndisturbed(ctx, "B's lease revoked", from, leases, before)
	if st := leases["B"].Stats(); st.Rejoins != 1 {
		t.Fatalf("B's lease: %d rejoins, want 1 (the revoke was not seen?)", st.Rejoins)
	}

	// Every lease at once: every node's and the coordinator's session.
	from = s.log.size()
	ls, err := s.etcd.Client().Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []clientv3.LeaseID
	for _, l := range ls.Leases {
		ids = append(ids, l.ID)
	}
	s.revokeDuringStall(ctx, []string{"A", "B", "C", "D"}, ids, stall)
	// The coordinator's term ends with its session (so do those of the
	// candidates, which may believe themselves elected a moment, their
	// keys gone); the last term to begin reads the live nodes a grace
	// after it began and restores from them.
	elected, changed := 0, time.Now()
	for ctx.Err() == nil && (elected == 0 || time.Since(changed) < store.NodeGoneGrace(ttl)+2*time.Second) {
		if k := s.log.count(from, "coordinator elected"); k != elected {
			elected, changed = k, time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.checkUndisturbed(ctx, fmt.Sprintf("all %d leases revoked", len(ids)), from, leases, before)
	for _, name := range []string{"A", "B", "C", "D"} {
		if st := leases[name].Stats(); st.Rejoins == 0 {
			t.Errorf("%s's lease: no rejoin after every lease was revoked", name)
		}
	}
	t.Logf("every lease revoked (%d, the coordinator's session included): no node fenced, a new coordinator term (%d elected), arrays %+v",
		len(ids), elected, s.arrays(ctx))
}
