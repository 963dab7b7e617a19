package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
)

const testToken = "s3cret"

// fakeBackend is a small cluster (nodes A B C, arrays a b c) that the
// management verbs are tested against through the real API server.
type fakeBackend struct {
	mu      sync.Mutex
	status  api.Status
	events  []api.Event
	calls   []string // mutating calls, "drain B"
	unavail bool     // answer 503 to everything

	// onStatus, when set, runs on every Status call (under mu) and may
	// change the view: how --wait tests make the cluster move.
	onStatus func(s *api.Status, n int)
	nStatus  int
	// onEvents, when set, runs on every Events call (under mu).
	onEvents func(n int)
	nEvents  int
}

var testTime = time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)

func newFakeBackend() *fakeBackend {
	m := func(drive, node string, st cluster.MemberState, p int) cluster.MemberView {
		return cluster.MemberView{Drive: drive, Node: node, State: st, Progress: p}
	}
	return &fakeBackend{
		status: api.Status{
			Node: "A", Time: testTime, Coordinator: "A", Lease: "held",
			Nodes: []cluster.NodeView{
				{Name: "A", Domain: "rack1", State: cluster.NodeUp, Drives: []string{"A1", "A2"}, Owns: []string{"a", "b"}},
				{Name: "B", Domain: "rack1", State: cluster.NodeDown, Drives: []string{"B1", "B2"}},
				{Name: "C", Domain: "rack2", State: cluster.NodeUp, Drives: []string{"C1", "C2", "C3"}, Owns: []string{"c"}},
			},
			Arrays: []api.Array{
				{Name: "a", Level: "raid5", Home: "A", Owner: "A", Epoch: 3, State: cluster.StateDegraded, Phase: "active", Policy: cluster.FailbackAuto,
					Members: []cluster.MemberView{m("B1", "B", cluster.MemberMissing, 0), m("C1", "C", cluster.MemberOK, 0)}},
				{Name: "b", Level: "raid5", Home: "B", Owner: "A", Epoch: 7, State: cluster.StateRebuilding, Phase: "active", Policy: cluster.FailbackAuto,
					Members: []cluster.MemberView{m("A1", "A", cluster.MemberRebuilding, 52), m("C2", "C", cluster.MemberOK, 0)}},
				{Name: "c", Level: "raid6", Home: "C", Owner: "C", Epoch: 1, State: cluster.StateOptimal, Phase: "active", Policy: cluster.FailbackManual,
					Members: []cluster.MemberView{m("A2", "A", cluster.MemberOK, 0), m("B2", "B", cluster.MemberOK, 0), m("C3", "C", cluster.MemberResyncing, 100)}},
			},
		},
		events: []api.Event{
			{Time: testTime.Add(-2 * time.Minute), Kind: "assign", Array: "b", To: "B", Epoch: 1, Revision: 9},
			{Time: testTime.Add(-time.Minute), Kind: "node-lost", Node: "B", Revision: 10},
			{Time: testTime.Add(-50 * time.Second), Kind: "failover", Array: "b", From: "B", To: "A", Epoch: 7, Duration: 2.5, Revision: 11},
			{Time: testTime.Add(-40 * time.Second), Kind: "rebuild-start", Array: "b", Node: "A", Message: "member A1", Revision: 12},
		},
	}
}

func (f *fakeBackend) check() error {
	if f.unavail {
		return fmt.Errorf("store not reachable: %w", api.ErrUnavailable)
	}
	return nil
}

func (f *fakeBackend) Status(context.Context) (api.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nStatus++
	if f.onStatus != nil {
		f.onStatus(&f.status, f.nStatus)
	}
	return f.status, f.check()
}

func (f *fakeBackend) Arrays(context.Context) ([]api.Array, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status.Arrays, f.check()
}

func (f *fakeBackend) Array(_ context.Context, name string) (api.Array, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(); err != nil {
		return api.Array{}, err
	}
	for _, a := range f.status.Arrays {
		if a.Name == name {
			return a, nil
		}
	}
	return api.Array{}, fmt.Errorf("array %q: %w", name, api.ErrNotFound)
}

func (f *fakeBackend) Events(_ context.Context, after int64, limit int) ([]api.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nEvents++
	if f.onEvents != nil {
		f.onEvents(f.nEvents)
	}
	var out []api.Event
	for _, e := range f.events {
		if e.Revision > after && (limit == 0 || len(out) < limit) {
			out = append(out, e)
		}
	}
	return out, f.check()
}

func (f *fakeBackend) NodeHealth(context.Context) (api.NodeHealth, error) {
	return api.NodeHealth{Node: "A", Daemon: "ok", Lease: "held", DrivesMissing: []string{},
		Arrays: []api.ArrayHealth{{Name: "a", State: "degraded", Owner: "A", PathUsable: true}}}, f.check()
}

func (f *fakeBackend) mutate(verb, kind, name string, known []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(); err != nil {
		return err
	}
	if !slices.Contains(known, name) {
		return fmt.Errorf("%s %q is not in the site config: %w", kind, name, api.ErrNotFound)
	}
	f.calls = append(f.calls, verb+" "+name)
	return nil
}

func (f *fakeBackend) nodeNames() []string {
	var out []string
	for _, n := range f.status.Nodes {
		out = append(out, n.Name)
	}
	return out
}

func (f *fakeBackend) driveNames() []string {
	var out []string
	for _, n := range f.status.Nodes {
		out = append(out, n.Drives...)
	}
	return out
}

func (f *fakeBackend) Drain(_ context.Context, n string) error {
	return f.mutate("drain", "node", n, f.nodeNames())
}

func (f *fakeBackend) Undrain(_ context.Context, n string) error {
	return f.mutate("undrain", "node", n, f.nodeNames())
}

func (f *fakeBackend) FailDrive(_ context.Context, d string) error {
	return f.mutate("fail", "drive", d, f.driveNames())
}

func (f *fakeBackend) ReplaceDrive(_ context.Context, d string) error {
	return f.mutate("replace", "drive", d, f.driveNames())
}

func (f *fakeBackend) mutations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// serveFake starts the real API server over f and returns its URL.
func serveFake(t *testing.T, f *fakeBackend) string {
	t.Helper()
	srv, err := api.NewServer(api.ServerOptions{Backend: f, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// testRootOptions are the root options of a test: no real node's token,
// no host name that is a site node, fast polling.
func testRootOptions() *rootOptions {
	o := defaultRootOptions()
	o.poll = 5 * time.Millisecond
	o.hostname = func() (string, error) { return "not-a-tier0-node", nil }
	o.tokenFile = "/nonexistent/tier0-token"
	return o
}

// runCLI runs tier0 with args on a fresh command tree (environment cleared
// of TIER0_*) and returns stdout, stderr and the exit code main would use.
func runCLI(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	for _, k := range []string{"TIER0_SITE", "TIER0_API", "TIER0_TOKEN"} {
		t.Setenv(k, "")
	}
	root := newRootCmdWith(testRootOptions())
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	if ctx == nil {
		ctx = context.Background()
	}
	if err := root.ExecuteContext(ctx); err != nil {
		code = exitCode(err)
		errb.WriteString("tier0: " + err.Error() + "\n")
	}
	return out.String(), errb.String(), code
}

// mustContain fails unless s contains every want, in order.
func mustContain(t *testing.T, s string, want ...string) {
	t.Helper()
	rest := s
	for _, w := range want {
		i := strings.Index(rest, w)
		if i < 0 {
			t.Fatalf("output lacks %q (in this order); got:\n%s", w, s)
		}
		rest = rest[i+len(w):]
	}
}

// siteFile writes a valid 3-node site configuration whose nodes' API
// endpoints are the given host:port addresses.
func siteFile(t *testing.T, apis ...string) string {
	t.Helper()
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("cluster: t\nworkdir: " + dir + "\nnodes:\n")
	for i, a := range apis {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		name := string(rune('A' + i))
		fmt.Fprintf(&b, "  - name: %s\n    address: %s\n    backend: {port: %d}\n    frontend: {port: %d}\n    api: {port: %s}\n",
			name, host, 20000+10*i, 20001+10*i, port)
		if i == 0 {
			b.WriteString("    etcd: {client_port: 23790, peer_port: 23800}\n")
		}
		b.WriteString("    drives:\n")
		for d := 1; d <= 2; d++ {
			fmt.Fprintf(&b, "      - {name: %s%d, path: \"${workdir}/%s%d.img\", size: 4MiB}\n", name, d, name, d)
		}
	}
	b.WriteString("control_plane:\n  etcd:\n    peers: [A]\n")
	p := filepath.Join(dir, "site.yaml")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func hostPort(url string) string { return strings.TrimPrefix(url, "http://") }

func TestProgressBar(t *testing.T) {
	for pct, want := range map[int]string{
		0: "[..........] 0%", 52: "[#####.....] 52%", 100: "[##########] 100%", 150: "[##########] 100%", -3: "[..........] 0%", 9: "[..........] 9%", 10: "[#.........] 10%",
	} {
		if got := rebuildBar(pct); got != want {
			t.Errorf("rebuildBar(%d) = %q, want %q", pct, got, want)
		}
	}
}

func TestSiteTriesEachNodeUntilOneAnswers(t *testing.T) {
	f := newFakeBackend()
	live := serveFake(t, f)
	dead1, dead2 := deadAddr(t), deadAddr(t)
	site := siteFile(t, dead1, dead2, hostPort(live))
	out, errOut, code := runCLI(t, nil, "status", "--site", site)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	mustContain(t, out, "cluster view from node A", "coordinator A")
}

func TestSiteSkipsNodeAnswering503(t *testing.T) {
	sick := newFakeBackend()
	sick.unavail = true
	f := newFakeBackend()
	f.status.Node = "B"
	site := siteFile(t, hostPort(serveFake(t, sick)), hostPort(serveFake(t, f)))
	out, errOut, code := runCLI(t, nil, "status", "--site", site)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	mustContain(t, out, "cluster view from node B")
}

func TestLocalNodeAskedFirst(t *testing.T) {
	a, b := newFakeBackend(), newFakeBackend()
	b.status.Node = "B"
	site := siteFile(t, hostPort(serveFake(t, a)), hostPort(serveFake(t, b)))
	for _, k := range []string{"TIER0_SITE", "TIER0_API", "TIER0_TOKEN"} {
		t.Setenv(k, "")
	}
	ro := testRootOptions()
	ro.hostname = func() (string, error) { return "B.cluster.example", nil }
	o := &clusterOptions{root: ro, site: site, timeout: 5 * time.Second}
	c, err := o.connect()
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Node != "B" {
		t.Fatalf("answered by node %s, want B (the node this CLI runs on)", s.Node)
	}
}

func TestUnreachableClusterNamesAddresses(t *testing.T) {
	dead1, dead2 := deadAddr(t), deadAddr(t)
	site := siteFile(t, dead1, dead2)
	for _, args := range [][]string{
		{"status", "--site", site},
		{"node", "drain", "B", "--site", site},
		{"events", "--site", site},
		{"array", "list", "--site", site, "--json"},
	} {
		out, errOut, code := runCLI(t, nil, args...)
		if code != exitUnreachable {
			t.Fatalf("%v: exit %d, want %d; stderr:\n%s", args, code, exitUnreachable, errOut)
		}
		if out != "" {
			t.Errorf("%v: stdout should be empty, got %q", args, out)
		}
		mustContain(t, errOut, "no tier0d management API answered", site,
			"http://"+dead1+" (node A)", "connection refused",
			"http://"+dead2+" (node B)", "connection refused",
			"systemctl status tier0d", "--api")
	}
	_, errOut, code := runCLI(t, nil, "status", "--api", dead1)
	if code != exitUnreachable {
		t.Fatalf("--api: exit %d", code)
	}
	mustContain(t, errOut, "tried:", "http://"+dead1+": ", "refused")
}

func TestNoClusterGiven(t *testing.T) {
	if _, err := os.Stat(defaultSiteFile); err == nil {
		t.Skipf("%s exists on this machine; the no-site message cannot be shown", defaultSiteFile)
	}
	_, errOut, code := runCLI(t, nil, "status")
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, errOut, "no cluster to ask", "--site FILE", "TIER0_SITE", "--api")
	_, errOut, _ = runCLI(t, nil, "status", "--site", "/nonexistent/site.yaml")
	mustContain(t, errOut, "/nonexistent/site.yaml", "tier0 config validate")
	_, errOut, _ = runCLI(t, nil, "status", "--site", "x.yaml", "--api", "http://h:1")
	mustContain(t, errOut, "give one of them")
}

func TestEnvironmentChoosesCluster(t *testing.T) {
	f := newFakeBackend()
	url := serveFake(t, f)
	for _, k := range []string{"TIER0_SITE", "TIER0_TOKEN"} {
		t.Setenv(k, "")
	}
	t.Setenv("TIER0_API", url)
	o := &clusterOptions{root: testRootOptions()}
	c, err := o.connect()
	if err != nil {
		t.Fatal(err)
	}
	if eps := c.Endpoints(); len(eps) != 1 || eps[0].URL != url || c.Source() != "--api" {
		t.Fatalf("TIER0_API not used: %+v from %s", eps, c.Source())
	}
	const nowhere = "/nonexistent/tier0-token"
	t.Setenv("TIER0_TOKEN", "from-env")
	if tok, _ := resolveToken("", "", nowhere); tok != "from-env" {
		t.Fatalf("token %q, want from-env", tok)
	}
	p := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(p, []byte("from-file\n"), 0o600)
	if tok, _ := resolveToken("", p, nowhere); tok != "from-file" {
		t.Fatalf("token %q, want from-file", tok)
	}
	if tok, _ := resolveToken("flag", p, nowhere); tok != "flag" {
		t.Fatalf("token %q, want flag", tok)
	}
	if _, err := resolveToken("", "/nonexistent/tok", nowhere); err == nil || !strings.Contains(err.Error(), "--token-file") {
		t.Fatalf("missing token file: %v", err)
	}
	t.Setenv("TIER0_TOKEN", "")
	if tok, _ := resolveToken("", "", p); tok != "from-file" {
		t.Fatalf("default token file not read: %q", tok)
	}
}

func TestWrongTokenExplained(t *testing.T) {
	f := newFakeBackend()
	url := serveFake(t, f)
	_, errOut, code := runCLI(t, nil, "node", "drain", "B", "--api", url, "--token", "wrong")
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, errOut, "401", "does not match", "--token, --token-file or TIER0_TOKEN")
	if m := f.mutations(); len(m) != 0 {
		t.Fatalf("a refused call changed state: %v", m)
	}
	if !errors.Is(explain(&api.Error{Status: 401}), api.ErrUnauthorized) {
		t.Fatal("explain lost the sentinel")
	}
}
