package validate

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/bench"
	"tier0/daemon/api"
	"tier0/daemon/config"
)

// fakeTier0CLI writes a stand-in for `tier0` that logs each hook it is
// asked to run (its arguments and SLURM_JOB_ID) and answers like the real
// one: healthcheck prints its JSON result; a hook named in failHook exits 1.
func fakeTier0CLI(t *testing.T, dir, failHook string) (bin, log string) {
	t.Helper()
	bin, log = filepath.Join(dir, "tier0"), filepath.Join(dir, "calls")
	script := fmt.Sprintf(`#!/bin/sh
echo "$* job=$SLURM_JOB_ID" >> %s
case "$3" in
%s) echo "tier0: prolog refused: daemon down" >&2; exit 1;;
healthcheck) echo '{"node":"x","verdict":"healthy","action":"keep","why":"healthy"}';;
esac
exit 0
`, log, failHook)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, log
}

func slurmRunner(t *testing.T, bin string) *runner {
	// A node-health API that says all is well: the old check asked only
	// this and passed without running a hook.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"node":"A","daemon":"ok","fenced":false,"redundant":true}`)
	}))
	t.Cleanup(srv.Close)
	cfg := &config.Config{File: "site.yaml", Slurm: config.Slurm{Enabled: true, Scontrol: "/usr/bin/scontrol"},
		Nodes: []config.Node{{Name: "A", Address: "127.0.0.1"}, {Name: "B", Address: "127.0.0.1"}}}
	cfg.Slurm.Nodes = []config.SlurmNode{{Node: "B", Slurm: "node2"}}
	r := &runner{o: Options{Out: io.Discard, OutDir: t.TempDir(), Tier0: bin}, ctx: t.Context(), cfg: cfg, log: discardLog(),
		res: bench.NewResults("t", "s", time.Now(), bench.Environment{}), clients: map[string]*api.Client{}}
	for _, n := range cfg.Nodes {
		r.clients[n.Name] = api.NewClient(srv.URL, "", nil)
	}
	return r
}

// TestSlurmCheckRunsTheRealHooks: with slurm.enabled the check runs the
// hook programs (healthcheck, prolog, epilog) for every node under its
// Slurm name, with a job ID, and a refusing hook fails it (issue 17: the
// check only read the hooks' input from the API).
func TestSlurmCheckRunsTheRealHooks(t *testing.T) {
	bin, log := fakeTier0CLI(t, t.TempDir(), "never")
	r := slurmRunner(t, bin)
	r.slurm()
	c := r.res.Checks[0]
	calls, _ := os.ReadFile(log)
	for _, want := range []string{"--json slurm healthcheck --config ", "--node A", "slurm prolog --config", "slurm epilog --config", "--node node2"} {
		if !strings.Contains(string(calls), want) {
			t.Errorf("hook calls lack %q:\n%s", want, calls)
		}
	}
	if n := strings.Count(string(calls), "\n"); n != 6 {
		t.Errorf("%d hook runs, want 3 per node for 2 nodes:\n%s", n, calls)
	}
	if !strings.Contains(string(calls), "job=tier0-validate-") {
		t.Errorf("hooks ran without SLURM_JOB_ID:\n%s", calls)
	}
	if c.Status != bench.Pass || !strings.Contains(c.Reason, "node2 (healthcheck healthy/keep, prolog ok, epilog ok)") {
		t.Errorf("check = %+v; want pass naming each node's hooks", c)
	}
	conf, err := os.ReadFile(filepath.Join(r.o.OutDir, "slurm", "hooks.yaml"))
	if err != nil || !strings.Contains(string(conf), "node2:") || !strings.Contains(string(conf), "tier0: B") {
		t.Errorf("hooks config %q (%v); want node2 mapped to B", conf, err)
	}

	bin, _ = fakeTier0CLI(t, t.TempDir(), "prolog")
	r = slurmRunner(t, bin)
	r.slurm()
	if c := r.res.Checks[0]; c.Status != bench.Fail || !strings.Contains(c.Reason, "prolog refused: daemon down") {
		t.Errorf("refusing prolog: check = %+v; want fail with the hook's message", c)
	}
}
