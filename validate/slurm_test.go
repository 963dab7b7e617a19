package validate

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"tier0/bench"
	"tier0/daemon/api"
	"tier0/daemon/config"
	"tier0/internal/testenv"
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

// TestLocalSlurmRunsTheHooksThroughSlurmd: with LocalSlurm, and a site
// whose slurm.enabled is false, the check starts a real Slurm on this
// machine and passes only when slurmd itself ran the Prolog and Epilog of
// a job on every node and each node's HealthCheckProgram (issue 17: make
// demo never ran the hooks against a real Slurm).
func TestLocalSlurmRunsTheHooksThroughSlurmd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real Slurm; not in -short")
	}
	if why := localSlurmMissing(); why != "" {
		testenv.Missing(t, "%s", why)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "report")
	calls := filepath.Join(dir, "calls")
	hookLog, jobLog := filepath.Join(out, "slurm", "hooks.log"), filepath.Join(out, "slurm", "jobs.log")
	// A stand-in for tier0 that logs each call and writes what the real
	// hooks write: the Prolog's and the health check's hook log lines,
	// the Epilog's job record.
	bin := filepath.Join(dir, "tier0")
	script := fmt.Sprintf(`#!/bin/sh
hook=$2; [ "$1" = --json ] && hook=$3
echo "$hook node=$SLURMD_NODENAME job=$SLURM_JOB_ID" >> %s
case $hook in
prolog) echo "level=INFO msg=\"prolog: storage usable\" hook=prolog node=$SLURMD_NODENAME job=$SLURM_JOB_ID arrays=[]" >> %[2]s;;
epilog) echo "{\"node\":\"$SLURMD_NODENAME\",\"job_id\":\"$SLURM_JOB_ID\"}" >> %[3]s;;
healthcheck) echo "level=INFO msg=healthcheck hook=healthcheck node=$SLURMD_NODENAME verdict=healthy" >> %[2]s
    echo '{"node":"x","verdict":"healthy","action":"keep","why":"healthy"}';;
esac
exit 0
`, calls, hookLog, jobLog)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := slurmRunner(t, bin)
	r.cfg.Slurm = config.Slurm{Nodes: r.cfg.Slurm.Nodes} // not enabled in the site
	r.o.OutDir, r.o.LocalSlurm = out, true
	r.slurm()
	c := r.res.Checks[0]
	b, _ := os.ReadFile(calls)
	if c.Status != bench.Pass || !strings.Contains(c.Reason, "local Slurm (slurmctld + 2 slurmd on this machine): job ") {
		t.Fatalf("check = %+v; want pass through the local Slurm; hook calls:\n%s", c, b)
	}
	// slurmd's runs have a numeric Slurm job ID (validate's own runs use
	// tier0-validate-PID).
	for _, n := range []string{"A", "node2"} {
		for _, hook := range []string{"prolog", "epilog"} {
			if !regexp.MustCompile(`(?m)^` + hook + ` node=` + n + ` job=[0-9]+$`).Match(b) {
				t.Errorf("slurmd ran no %s on %s:\n%s", hook, n, b)
			}
		}
		if !regexp.MustCompile(`(?m)^healthcheck node=` + n + ` job=$`).Match(b) {
			t.Errorf("slurmd ran no HealthCheckProgram on %s:\n%s", n, b)
		}
	}
	t.Logf("check: %s", c.Reason)
}
