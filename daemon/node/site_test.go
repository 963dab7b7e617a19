package node

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/api"
	"tier0/daemon/blockdev"
	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/daemon/store"
	"tier0/internal/testenv"
)

// testSite is an in-process cluster for the owner-side tests: one
// embedded etcd member shared by every node, owner nodes A and B with a
// frontend target each (no task loop, no coordinator: the test performs
// the tasks itself, in the order the schedule needs), and drive nodes C,
// D, E whose backend targets export blockdev.Mem drives. Array x is
// raid5 over C1, D1, E1.
type testSite struct {
	t     *testing.T
	cfg   *config.Config
	st    *store.Store
	nodes map[string]*Node
	mems  map[string]*blockdev.Mem
	holds map[string]*holdDev
	lives map[string]*store.Liveness
}

// holdDev is a drive whose reads can be held (to keep a request in
// flight) until released.
type holdDev struct {
	*blockdev.Mem
	mu      sync.Mutex
	held    chan struct{} // non-nil: reads wait until it is closed
	entered chan struct{} // receives once per read that waits
	failing atomic.Bool   // writes fail with a media error
}

// WriteAt and WriteAtFUA fail, as a drive's media error, while failing
// is set.
func (d *holdDev) WriteAt(p []byte, off int64) (int, error) {
	if d.failing.Load() {
		return 0, fmt.Errorf("test drive: injected media error: %w", blockdev.ErrIO)
	}
	return d.Mem.WriteAt(p, off)
}

func (d *holdDev) WriteAtFUA(p []byte, off int64) (int, error) {
	if d.failing.Load() {
		return 0, fmt.Errorf("test drive: injected media error: %w", blockdev.ErrIO)
	}
	return d.Mem.WriteAtFUA(p, off)
}

func (d *holdDev) hold() {
	d.mu.Lock()
	d.held, d.entered = make(chan struct{}), make(chan struct{}, 64)
	d.mu.Unlock()
}

func (d *holdDev) release() {
	d.mu.Lock()
	if d.held != nil {
		close(d.held)
		d.held = nil
	}
	d.mu.Unlock()
}

func (d *holdDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	held, entered := d.held, d.entered
	d.mu.Unlock()
	if held != nil {
		entered <- struct{}{}
		<-held
	}
	return d.Mem.ReadAt(p, off)
}

const testDriveSize = 8 << 20

func freeTCPPort(t *testing.T) int {
	t.Helper()
	return testenv.FreePort(t)
}

func newTestSite(t *testing.T) *testSite {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: t\nworkdir: %s\nnodes:\n", dir)
	for _, name := range []string{"A", "B", "C", "D", "E"} {
		drives := "[]"
		if name >= "C" {
			drives = fmt.Sprintf("[{name: %s1, path: %s, size: 8MiB}]", name, filepath.Join(dir, name+"1.img"))
		}
		fmt.Fprintf(&b, "  - {name: %s, address: 127.0.0.1, backend: {port: %d}, frontend: {port: %d}, api: {port: %d}, drives: %s}\n",
			name, freeTCPPort(t), freeTCPPort(t), freeTCPPort(t), drives)
	}
	fmt.Fprintf(&b, "control_plane:\n  etcd: {peers: [A], client_port: %d, peer_port: %d}\n", freeTCPPort(t), freeTCPPort(t))
	b.WriteString("policies: {member_io_timeout: 3s, rebuild_rate_mibs: 100000, rebuild_adaptive: false}\n")
	b.WriteString("arrays: [{name: x, level: raid5, chunk_kib: 16, home: A, members: [C1, D1, E1]}]\n")
	cfg, err := config.Parse("site.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("test site config: %v", err)
	}
	peer := store.Peer{Name: "A", ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freeTCPPort(t)), PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freeTCPPort(t))}
	st, err := store.Open(t.Context(), store.Options{Name: "A", Peers: []store.Peer{peer}, DataDir: filepath.Join(dir, "etcd"),
		Prefix: "/tier0/t/", ClusterToken: "tier0-t", TickMs: 10, ElectionMs: 100, StartTimeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	s := &testSite{t: t, cfg: cfg, st: st, nodes: map[string]*Node{}, mems: map[string]*blockdev.Mem{}, holds: map[string]*holdDev{}, lives: map[string]*store.Liveness{}}
	t.Cleanup(func() {
		for _, n := range s.nodes {
			n.mu.Lock()
			arrays := n.arrays
			n.mu.Unlock()
			for _, a := range arrays {
				a.stop(true)
			}
			if n.frontend != nil {
				_ = n.frontend.Close()
			}
			if n.backend != nil {
				_ = n.backend.Close()
			}
		}
		for _, n := range s.nodes {
			n.bg.Wait()
		}
		for _, l := range s.lives {
			l.Abandon()
		}
		st.Close()
	})
	for _, name := range []string{"C", "D", "E"} {
		n := s.node(name)
		m := blockdev.NewMem(testDriveSize, 4096)
		h := &holdDev{Mem: m}
		s.mems[name+"1"], s.holds[name+"1"] = m, h
		t.Cleanup(h.release) // before the targets close (cleanups run last-in first-out)
		n.drives[name+"1"] = h
		if err := n.startBackend(); err != nil {
			t.Fatalf("backend of %s: %v", name, err)
		}
	}
	for _, name := range []string{"A", "B"} {
		n := s.node(name)
		if err := n.startFrontend(t.Context()); err != nil {
			t.Fatalf("frontend of %s: %v", name, err)
		}
		l, err := st.Register(t.Context(), store.NodeInfo{Node: name}, 10*time.Second, 0)
		if err != nil {
			t.Fatalf("lease of %s: %v", name, err)
		}
		s.lives[name] = l
		n.live = l
	}
	return s
}

func (s *testSite) node(name string) *Node {
	if n, ok := s.nodes[name]; ok {
		return n
	}
	n, err := New(Options{Config: s.cfg, Name: name})
	if err != nil {
		s.t.Fatal(err)
	}
	n.st = s.st
	n.metrics = api.NewMetrics()
	s.nodes[name] = n
	return n
}

// do performs one task on node as its task loop would.
func (s *testSite) do(node, kind string, action any) {
	s.t.Helper()
	raw, err := json.Marshal(action)
	if err != nil {
		s.t.Fatal(err)
	}
	s.node(node).perform(s.t.Context(), task{Kind: kind, Action: raw})
}

// reports returns (and deletes) every report written so far, in order.
func (s *testSite) reports() []report {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 5*time.Second)
	defer cancel()
	prefix := "/tier0/t/reports/"
	resp, err := s.st.Client().Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		s.t.Fatal(err)
	}
	var out []report
	for _, kv := range resp.Kvs {
		var r report
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, r)
		// Only the keys read: a report written since must stay for the
		// next call.
		if _, err := s.st.Client().Delete(ctx, string(kv.Key)); err != nil {
			s.t.Fatal(err)
		}
	}
	return out
}

func (s *testSite) wantReport(node, kind string) report {
	s.t.Helper()
	rs := s.reports()
	for _, r := range rs {
		if r.Node == node && r.Kind == kind {
			return r
		}
	}
	s.t.Fatalf("node %s sent no %q report; reports: %+v", node, kind, rs)
	return report{}
}

// holder reads the reservation holder of a drive's namespace through a
// connection of its own (host ID of no node).
func (s *testSite) holder(drive string) (hostID [16]byte, key uint64) {
	s.t.Helper()
	node, _, _ := s.cfg.Drive(drive)
	ctx, cancel := context.WithTimeout(s.t.Context(), 5*time.Second)
	defer cancel()
	c, err := host.Dial(ctx, node.AdvertiseAddr(node.Backend), host.Options{
		SubNQN: s.cfg.DriveNQN(drive), HostNQN: hostNQN(s.cfg, "C"), HostID: derive16("observer"),
		IOQueues: 1, QueueDepth: 16, DialTimeout: 2 * time.Second,
	})
	if err != nil {
		s.t.Fatalf("observer connection to %s: %v", drive, err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		s.t.Fatal(err)
	}
	rs, err := ns.Report()
	if err != nil {
		s.t.Fatalf("reservation report of %s: %v", drive, err)
	}
	for _, r := range rs.Registrants {
		if r.Holder {
			return r.HostID, r.RKey
		}
	}
	return [16]byte{}, 0
}

func (s *testSite) snapshot(drive string) []byte {
	s.t.Helper()
	m := s.mems[drive]
	b := make([]byte, m.Size())
	if _, err := m.ReadAt(b, 0); err != nil {
		s.t.Fatal(err)
	}
	return b
}
