package program

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/internal/fakescontrol"
)

// fakeDaemon stands in for tier0d's health endpoint.
type fakeDaemon struct {
	mu   sync.Mutex
	body string // "" = answer 503
	srv  *httptest.Server
}

func newFakeDaemon(t *testing.T, body string) *fakeDaemon {
	f := &fakeDaemon{body: body}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.body == "" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(f.body))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeDaemon) set(body string) {
	f.mu.Lock()
	f.body = body
	f.mu.Unlock()
}

const (
	healthy = `{"node":"B","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[{"name":"a","state":"optimal","owner":"A","path_usable":true},{"name":"c","state":"degraded","owner":"C","path_usable":true}],"rebuild_active":false,"redundant":true}`
	noPathC = `{"node":"B","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[{"name":"a","state":"optimal","owner":"A","path_usable":true},{"name":"c","state":"degraded","owner":"C","path_usable":false}],"rebuild_active":false,"redundant":false}`
	rebuild = `{"node":"B","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[{"name":"a","state":"rebuilding","owner":"A","path_usable":true}],"rebuild_active":true,"redundant":false}`
	fenced  = `{"node":"B","daemon":"ok","fenced":true,"lease":"held","drives_missing":[],"arrays":[],"rebuild_active":false,"redundant":true}`
)

type rig struct {
	fake   *fakescontrol.Fake
	daemon *fakeDaemon
	r      *Runner
	dir    string
}

func newRig(t *testing.T, body string) *rig {
	t.Helper()
	dir := t.TempDir()
	g := &rig{fake: fakescontrol.New(t, "node2"), daemon: newFakeDaemon(t, body), dir: dir}
	cfgText := "scontrol: " + g.fake.Path + "\n" +
		"state_dir: " + filepath.Join(dir, "state") + "\n" +
		"job_log: " + filepath.Join(dir, "log", "jobs.log") + "\n" +
		"metrics_dir: " + filepath.Join(dir, "metrics") + "\n" +
		"sys_block: " + filepath.Join(dir, "sys") + "\n" +
		"scontrol_timeout: 2s\n" +
		"nodes:\n  node2: {tier0: B, api: " + g.daemon.srv.URL + "}\n"
	p := filepath.Join(dir, "slurm.yaml")
	if err := os.WriteFile(p, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	g.r = NewRunner(c, nil)
	return g
}

func (g *rig) want(t *testing.T, state, reason string) {
	t.Helper()
	st, re := g.fake.Get("node2")
	if st != state || re != reason {
		t.Fatalf("node2: %q %q, want %q %q", st, re, state, reason)
	}
}

func (g *rig) stat(t *testing.T, stat string) {
	t.Helper()
	d := filepath.Join(g.dir, "sys", "nvme0n1")
	if err := os.MkdirAll(filepath.Join(d, "device"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "device", "subsysnqn"), []byte("nqn.2026-11.io.tier0:array-a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestHealthCheckCycle(t *testing.T) {
	g := newRig(t, "")
	ctx := context.Background()
	check := func(action string) CheckResult {
		t.Helper()
		res, err := g.r.HealthCheck(ctx, "node2")
		if err != nil {
			t.Fatal(err)
		}
		if res.Action != action {
			t.Fatalf("action %q (%+v), want %q", res.Action, res, action)
		}
		return res
	}
	check("drain")
	g.want(t, "IDLE+DRAIN", "tier0: daemon down")
	check("keep") // same reason: no second update
	if u := g.fake.Updates(); len(u) != 1 {
		t.Errorf("updates %q, want one drain", u)
	}
	g.daemon.set(fenced)
	check("drain")
	g.want(t, "IDLE+DRAIN", "tier0: fenced")
	g.daemon.set(rebuild)
	if res := check("keep"); res.Verdict != "impaired" {
		t.Errorf("verdict %q, want impaired", res.Verdict)
	}
	g.want(t, "IDLE+DRAIN", "tier0: fenced")
	g.daemon.set(healthy)
	check("resume")
	g.want(t, "IDLE", "")
	check("keep")
	// Impaired does not drain a node in service.
	g.daemon.set(rebuild)
	check("keep")
	g.want(t, "IDLE", "")
}

func TestHealthCheckLeavesAdministratorAlone(t *testing.T) {
	g := newRig(t, "")
	for _, st := range []string{"IDLE+DRAIN", "DOWN", "ALLOCATED+DRAIN"} {
		g.fake.Set("node2", st, "bios update")
		for _, body := range []string{"", healthy} {
			g.daemon.set(body)
			res, err := g.r.HealthCheck(context.Background(), "node2")
			if err != nil || res.Action != "keep" {
				t.Fatalf("%s, health %q: %+v %v, want keep", st, body, res, err)
			}
		}
		g.want(t, st, "bios update")
	}
	if u := g.fake.Updates(); len(u) != 0 {
		t.Errorf("updates on an administrator's node: %q", u)
	}
}

func TestHealthCheckWrongNodeAndSlurmAway(t *testing.T) {
	g := newRig(t, strings.Replace(healthy, `"node":"B"`, `"node":"C"`, 1))
	res, err := g.r.HealthCheck(context.Background(), "node2")
	if err != nil || res.Action != "drain" || !strings.Contains(res.Reason, "is node C, expected B") {
		t.Errorf("daemon of another node: %+v %v, want a drain naming the mix-up", res, err)
	}
	g.fake.FailNext(10)
	if _, err := g.r.HealthCheck(context.Background(), "node2"); err == nil || !strings.Contains(err.Error(), "slurmctld unavailable") {
		t.Errorf("slurmctld away: %v, want an error saying so", err)
	}
}

func TestPrologRefusesAndDrains(t *testing.T) {
	g := newRig(t, noPathC)
	ctx := context.Background()
	env := Env{Node: "node2", JobID: "41", Comment: "project x tier0-arrays=a"}
	if err := g.r.Prolog(ctx, env, nil); err != nil {
		t.Fatalf("job needing only array a: %v", err)
	}
	env.Comment = "tier0-arrays=a,c"
	err := g.r.Prolog(ctx, env, nil)
	if !errors.Is(err, ErrPrologRefused) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("job needing c: %v, want a one-line ErrPrologRefused", err)
	}
	want := "tier0: prolog job 41: array c has no usable path from this node"
	if !strings.HasSuffix(err.Error(), want) {
		t.Errorf("error %q, want it to end with %q", err, want)
	}
	g.want(t, "IDLE+DRAIN", want)
	// No arrays named: all arrays by default; "none" checks the daemon only.
	env.Comment = ""
	if err := g.r.Prolog(ctx, env, nil); err == nil {
		t.Error("default prolog_arrays=all passed with array c unreachable")
	}
	g.r.Config.PrologArrays = "none"
	if err := g.r.Prolog(ctx, env, nil); err != nil {
		t.Errorf("prolog_arrays=none: %v", err)
	}
	// The command line wins over the comment.
	env.Comment = "tier0-arrays=c"
	if err := g.r.Prolog(ctx, env, []string{"a"}); err != nil {
		t.Errorf("--arrays a: %v", err)
	}
	// Daemon down refuses every job; an administrator's drain is kept.
	g.daemon.set("")
	g.fake.Set("node2", "IDLE+DRAIN", "rack power work")
	if err := g.r.Prolog(ctx, env, nil); err == nil || !strings.Contains(err.Error(), "daemon down") {
		t.Errorf("daemon down: %v", err)
	}
	g.want(t, "IDLE+DRAIN", "rack power work")
}

func TestPrologEpilogFigures(t *testing.T) {
	g := newRig(t, healthy)
	now := time.Unix(2000, 0)
	g.r.Now = func() time.Time { return now }
	g.stat(t, "100 0 800 0 50 0 400 0 0 0 0\n")
	ctx := context.Background()
	env := Env{Node: "node2", JobID: "7", User: "alice"}
	if err := g.r.Prolog(ctx, env, nil); err != nil {
		t.Fatal(err)
	}
	g.stat(t, "130 0 2848 0 60 0 4496 0 0 0 0\n")
	now = now.Add(30 * time.Second)
	rec, err := g.r.Epilog(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	if rec.ReadBytes != 2048*512 || rec.WriteBytes != 4096*512 || rec.ReadIOs != 30 || rec.WriteIOs != 10 || rec.Seconds != 30 || !rec.Complete {
		t.Errorf("record %+v", rec)
	}
	// A second job without a prolog snapshot is still logged, incomplete.
	rec2, err := g.r.Epilog(ctx, Env{Node: "node2", JobID: "8"})
	if err != nil || rec2.Complete || len(rec2.Warnings) == 0 {
		t.Errorf("job without snapshot: %+v %v", rec2, err)
	}
	b, err := os.ReadFile(filepath.Join(g.dir, "log", "jobs.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var first JobRecord
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &first) != nil || first.JobID != "7" || first.User != "alice" || first.Tier0Node != "B" {
		t.Fatalf("job log %q", lines)
	}
	m, err := os.ReadFile(filepath.Join(g.dir, "metrics", "node2.prom"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`tier0_slurm_jobs_total{node="node2",tier0_node="B"} 2`,
		`tier0_slurm_job_read_bytes_total{node="node2",tier0_node="B"} 1048576`,
		`tier0_slurm_job_write_bytes_total{node="node2",tier0_node="B"} 2097152`,
		`tier0_slurm_last_job_read_bytes{node="node2",tier0_node="B",job="8"} 0`,
	} {
		if !strings.Contains(string(m), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
	if _, err := os.Stat(filepath.Join(g.dir, "state", "node2", "job-7.json")); !os.IsNotExist(err) {
		t.Errorf("start snapshot not removed: %v", err)
	}
}

func TestConfig(t *testing.T) {
	c, err := LoadConfig(DefaultConfigPath)
	if err != nil && !strings.Contains(err.Error(), DefaultConfigPath) {
		t.Fatal(err)
	}
	if err == nil && c.API == "" {
		t.Error("defaults not filled")
	}
	dir := t.TempDir()
	for text, want := range map[string]string{
		"apii: x\n":               "field apii not found",
		"prolog_arrays: some\n":   "want all or none",
		"scontrol: scontrol\n":    "absolute path",
		"http_timeout: fast\n":    "time.Duration",
		"nodes: {n1: {tier0: A}}": "",
		"":                        "",
	} {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := LoadConfig(p)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", text, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v (config %+v), want error with %q", text, err, c, want)
		}
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing explicit config accepted")
	}
	c = Config{API: "http://x", Nodes: map[string]NodeConfig{"n1": {Tier0: "A"}}}
	if n, a := c.Node("n1"); n != "A" || a != "http://x" {
		t.Errorf("Node(n1) = %s %s", n, a)
	}
	if n, _ := c.Node("n9"); n != "n9" {
		t.Errorf("Node(n9) = %s", n)
	}
}

func TestArraysFromComment(t *testing.T) {
	for in, want := range map[string]string{
		"tier0-arrays=a,b":           "a b",
		"x=1; tier0_arrays=c ,d y=2": "c",
		"nothing here":               "",
		"tier0-arrays=":              "",
	} {
		if got := strings.Join(ArraysFromComment(in), " "); got != want {
			t.Errorf("ArraysFromComment(%q) = %q, want %q", in, got, want)
		}
	}
}
