package nemesis

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/daemon/config"
	"tier0/internal/localcluster"
	"tier0/reliability/campaign"
	"tier0/reliability/history"
)

var site5 = Site{Nodes: []string{"A", "B", "C", "D", "E"}, EtcdPeers: []string{"A", "B", "C"}, Parity: 1, LeaseTTL: 3 * time.Second,
	Drives: map[string][]string{"A": {"A1"}, "B": {"B1"}, "C": {"C1"}, "D": {"D1"}, "E": {"E1"}}}

func TestScheduleReplaysAndKeepsBudgets(t *testing.T) {
	kinds := slices.Clone(AllKinds)
	counts := map[string]int{}
	for seed := range uint64(500) {
		s := Generate(seed, kinds, site5, 20*time.Second)
		if again := Generate(seed, kinds, site5, 20*time.Second); s.String() != again.String() {
			t.Fatalf("seed %d does not replay:\n%s\n%s", seed, s, again)
		}
		if len(s.Faults) < 1 || len(s.Faults) > 3 {
			t.Fatalf("seed %d: %d faults, want 1..3:\n%s", seed, len(s.Faults), s)
		}
		victims := map[string]bool{}
		for _, f := range s.Faults {
			counts[f.Kind]++
			if f.Start < 0 || f.End() > s.Window || f.Dur <= 0 {
				t.Fatalf("seed %d: fault outside the window:\n%s", seed, s)
			}
			if disruptive[f.Kind] {
				victims[f.Node] = true
			}
			if linkKinds[f.Kind] && f.Link == "" {
				t.Fatalf("seed %d: link fault without a link:\n%s", seed, s)
			}
			if f.Kind == Freeze {
				lo := []float64{0.5, 0.9, 2}[f.Param[0]]
				if r := f.Dur.Seconds() / site5.LeaseTTL.Seconds(); (r < lo || r > lo+2) && f.End() != s.Window {
					t.Fatalf("seed %d: freeze of %.2f TTLs in class %d:\n%s", seed, r, f.Param[0], s)
				}
			}
		}
		// RAID-5: one node taken out at a time.
		if len(victims) > 1 {
			t.Fatalf("seed %d: %d nodes taken out at once on a parity-1 site:\n%s", seed, len(victims), s)
		}
	}
	for _, k := range kinds {
		if counts[k] == 0 {
			t.Errorf("kind %s never drawn in 500 seeds: %v", k, counts)
		}
	}
	// RAID-6 may take two nodes, but never two of three etcd voters.
	s6 := site5
	s6.Parity = 2
	two := false
	for seed := range uint64(500) {
		victims := map[string]bool{}
		peers := 0
		for _, f := range Generate(seed, []string{Kill}, s6, 20*time.Second).Faults {
			if !victims[f.Node] && slices.Contains(s6.EtcdPeers, f.Node) {
				peers++
			}
			victims[f.Node] = true
		}
		if peers > 1 || len(victims) > 2 {
			t.Fatalf("seed %d: victims %v (%d etcd voters)", seed, victims, peers)
		}
		two = two || len(victims) == 2
	}
	if !two {
		t.Fatal("no RAID-6 schedule took two nodes at once")
	}
}

func TestParseKinds(t *testing.T) {
	if k, err := ParseKinds("all"); err != nil || len(k) != len(AllKinds) {
		t.Fatalf("all: %v %v", k, err)
	}
	if k, err := ParseKinds("process,latency"); err != nil || !slices.Equal(k, []string{Freeze, Kill, Latency, RestartStorm}) {
		t.Fatalf("process,latency: %v %v", k, err)
	}
	if _, err := ParseKinds("kill,meteor"); err == nil || !strings.Contains(err.Error(), "meteor") {
		t.Fatalf("unknown kind accepted: %v", err)
	}
}

func TestRewriteSiteRoutesThroughProxies(t *testing.T) {
	text, err := os.ReadFile("../campaign/testdata/local5.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := RewriteSite(string(text))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "site.yaml")
	if err := os.WriteFile(p, []byte(strings.ReplaceAll(out, "${TIER0_WORK:-tier0-rel5}", dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatalf("rewritten site does not load: %v\n%s", err, out)
	}
	b, _ := cfg.Node("B")
	if got := b.AdvertiseAddr(b.Backend); got != "127.0.100.2:24430" || b.ListenAddr(b.Backend) != "127.0.0.1:24430" {
		t.Fatalf("B backend advertised %s, listens %s", got, b.ListenAddr(b.Backend))
	}
	if ps := cfg.EtcdPeers(); ps[0].ClientURL != "http://127.0.100.1:22379" || ps[0].ListenHost != "127.0.0.1" {
		t.Fatalf("etcd peer A: %+v", ps[0])
	}
	if !strings.Contains(out, "workdir:") {
		t.Fatal("workdir line lost")
	}
	// A proxy forwards, and a stall toxic holds data without a reset.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c) }()
		}
	}()
	n := newNet()
	if err := n.add("A", LinkBackend, "127.0.100.250:0", l.Addr().String()); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c, err := net.Dial("tcp", n.links["backend:A"].proxies[0].Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("through the proxy: %q %v", buf, err)
	}
	tx, err := n.Add(LinkBackend, "A", "timeout", "both", `{"timeout":0}`)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, _ = c.Write([]byte("lost"))
	if _, err := io.ReadFull(c, buf); err == nil || !os.IsTimeout(err) {
		t.Fatalf("stalled link: read %q, %v; want a timeout (no data, no reset)", buf, err)
	}
	tx.Remove()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("a healed stall left the connection open (its vanished data would corrupt the stream)")
	}
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// tier0d builds the daemon once per test binary ($TIER0_NEMESIS_TIER0D
// names a prebuilt one instead).
func tier0d(t *testing.T) string {
	if p := os.Getenv("TIER0_NEMESIS_TIER0D"); p != "" {
		return p
	}
	buildOnce.Do(func() { binPath, buildErr = campaign.BuildTier0d("tier0-nemesis-bin") })
	if buildErr != nil {
		t.Fatalf("building tier0d: %v", buildErr)
	}
	return binPath
}

type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestBoundedNemesis is the nemesis of make test: fixed seeds of process
// and network faults on the 5-node RAID-5 site. It needs no root (the
// proxies listen on loopback addresses), so it never skips except with
// -short: a nemesis that cannot start its faults fails.
func TestBoundedNemesis(t *testing.T) {
	kinds := []string{Kill, Freeze, Latency, Stall, Partition, OneWay, Reset}
	if k := os.Getenv("TIER0_NEMESIS_KINDS"); k != "" {
		kinds, _ = ParseKinds(k)
	}
	runBounded(t, kinds, 1, 3, nil)
}

// TestBoundedNemesisPowerLoss is make test's nemesis of the drive layer:
// every kill -9 is a power cut of the node's drives (the writes they kept
// unflushed are dropped, blockdev.PowerCut in tier0d), overlapping slow
// drives and a node's asymmetric partition. Seeds 159-161 draw, on A (an
// etcd peer), a partition, a power loss inside it and a slow drive; on A a
// partition and a power loss; on C a power loss, a slow drive and a
// partition. Every run must inject its power loss (checked), so the test
// cannot pass without cutting power.
func TestBoundedNemesisPowerLoss(t *testing.T) {
	runBounded(t, []string{PowerLoss, SlowDisk, DiskError, Partition}, 159, 3, func(res Result) error {
		if res.Injected[PowerLoss] < 3 {
			return fmt.Errorf("%d power losses injected over %d runs, want 3 (one a run): the schedules or the injector changed", res.Injected[PowerLoss], len(res.Runs))
		}
		return nil
	})
}

// runBounded runs the nemesis on the 5-node RAID-5 site for runs
// schedules from seed, 12 s windows, and fails on any anomaly, fault not
// injected, or a run that did too little; check adds a test's own demand.
func runBounded(t *testing.T, kinds []string, seed uint64, runs int, check func(Result) error) {
	if testing.Short() {
		t.Skip("starts a cluster of tier0d processes (~1-3 min); skipped with -short")
	}
	bin := tier0d(t)
	site := "../campaign/testdata/local5.yaml"
	text, err := os.ReadFile(site)
	if err != nil {
		t.Fatal(err)
	}
	shift, err := localcluster.FreePortShift(string(text), []int{500, 600, 700, 800})
	if err != nil {
		t.Fatal(err)
	}
	wd := t.TempDir()
	if k := os.Getenv("TIER0_NEMESIS_KEEP"); k != "" {
		wd = k
	}
	var out lockedBuilder
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{Site: site, Binary: bin, Workdir: wd, PortShift: shift, Kinds: kinds,
		Seed: seed, Runs: runs, Window: 12 * time.Second, Units: 256, Out: &out,
		Logger: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelError}))})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("the nemesis could not run: %v", err)
	}
	t.Log("\n" + res.Summary())
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, v := range res.Injected {
		total += v
	}
	if len(res.Runs) != runs || total == 0 || res.Ops < 1000 {
		t.Fatalf("%d runs, %d faults injected, %d operations checked: the nemesis did too little", len(res.Runs), total, res.Ops)
	}
	for _, rr := range res.Runs {
		if len(rr.Errors) > 0 {
			t.Errorf("run %d: faults not injected: %v", rr.Run, rr.Errors)
		}
	}
	if check != nil {
		if err := check(res); err != nil {
			t.Fatal(err)
		}
	}
}

func TestResultSummaryAndErr(t *testing.T) {
	r := Result{Site: "s.yaml", Kinds: []string{Kill}, Injected: map[string]int{Kill: 2}, Ops: 1234,
		Runs:      []RunResult{{Run: 0, Seed: 7}, {Run: 1, Seed: 8, Anomalies: map[string]int{"stale": 1}, Report: "ANOMALY stale: ...\n"}},
		Anomalies: map[string]int{"stale": 1}}
	s := r.Summary()
	for _, want := range []string{"2 runs", "faults injected: kill 2", "operations checked: 1234", "anomalies: stale 1", "run 1, seed 8", "ANOMALY stale", "FAILED"} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "seeds 8") {
		t.Fatalf("Err %v: want the failing seed named", err)
	}
	r.Table = map[string]*Cell{}
	r.count(RunResult{Schedule: Schedule{Faults: []Fault{{Kind: Kill, Start: 0, Dur: 5e9}, {Kind: Latency, Start: 4e9, Dur: 1e9}, {Kind: Freeze, Start: 6e9, Dur: 1e9}}},
		History: history.Result{Ops: 10}, Anomalies: map[string]int{"stale": 2}})
	if c := r.Table["kill+latency"]; c == nil || *c != (Cell{Runs: 1, Ops: 10, Anomalies: 2}) || r.Table["freeze+kill"] != nil || r.Table["freeze"] == nil {
		t.Fatalf("table %v: want kill+latency (they overlap), not freeze+kill (they do not)", r.Table)
	}
	if !strings.Contains(r.Summary(), "kill+latency") {
		t.Fatalf("summary lacks the table:\n%s", r.Summary())
	}
	r.Anomalies, r.Runs[1].Anomalies = nil, nil
	if r.Err() != nil || !strings.Contains(r.Summary(), "PASSED") {
		t.Fatalf("clean result: %v\n%s", r.Err(), r.Summary())
	}
}

// TestRecoveryAsksEveryNode: a node just thawed answers from its view
// before the freeze (all healthy) while the others still see an array
// down; recovery must wait for every node's view, twice in a row.
func TestRecoveryAsksEveryNode(t *testing.T) {
	healthy := `[{"name":"a","state":"optimal","phase":"active","owner":"B","members":[{"drive":"A1","node":"A","state":"ok"}]}]`
	down := `[{"name":"a","state":"degraded","phase":"active","owner":"B","members":[{"drive":"A1","node":"A","state":"stale"}]}]`
	var mu sync.Mutex
	asked := map[string]int{}
	serve := func(name string, answer func(n int) string) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if r.URL.Path == "/v1/status" {
				// The owner's report: its RAID engine optimal, now.
				_, _ = fmt.Fprintf(w, `{"owners":[{"array":"a","owner":"B","serving":true,"state":"optimal","time":%q}]}`, time.Now().Format(time.RFC3339Nano))
				return
			}
			mu.Lock()
			asked[name]++
			n := asked[name]
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, answer(n))
		})}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { srv.Close() })
		return l.Addr().String()
	}
	a := serve("A", func(int) string { return healthy })
	b := serve("B", func(n int) string {
		if n <= 2 {
			return down
		}
		return healthy
	})
	node := func(name, addr string) config.Node {
		h, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		return config.Node{Name: name, Address: h, API: config.Endpoint{Port: port}}
	}
	e := &env{cfg: &config.Config{Nodes: []config.Node{node("A", a), node("B", b)}}, names: []string{"a"}, http: &http.Client{Timeout: 2 * time.Second}}
	_, bad, err := e.waitHealthy(context.Background(), time.Minute)
	if err != nil {
		t.Fatalf("waitHealthy: %v %v", err, bad)
	}
	mu.Lock()
	defer mu.Unlock()
	if asked["B"] != 4 || asked["A"] != 4 {
		t.Fatalf("asked %v: want both nodes 4 times (B down twice, then healthy twice in a row)", asked)
	}
}
