// Package slurmtest runs tier0's Slurm hooks against a real Slurm 22.05
// cluster on one machine: munged, slurmctld and five slurmd (one per tier0
// node A-E), all children of the test under a temporary directory, on
// loopback and non-default ports. In cluster_test.go each node's tier0d is
// FakeTier0d, an HTTP server serving only /v1/node/health, so that every
// health state can be set at will; real_test.go runs the same Slurm against
// five real tier0d processes and the real tier0 binary.
//
// It needs root and Debian's slurmctld, slurmd, slurm-client and munge
// (scripts/deps.d/slurm.sh); it skips, saying why, when they are missing.
package slurmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"tier0/daemon/slurm"
	"tier0/daemon/slurm/drain"
	"tier0/internal/localslurm"
	"tier0/internal/testenv"
	"tier0/slurm-plugin/cli"
	"tier0/slurm-plugin/health"
)

// TestMain doubles as the tier0 CLI: the test links the test binary as
// "tier0" and Slurm's hooks run it through the real wrapper scripts.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "tier0" {
		root := &cobra.Command{Use: "tier0", SilenceUsage: true, SilenceErrors: true}
		root.AddCommand(cli.Command(nil))
		if err := root.Execute(); err != nil {
			fmt.Fprintln(os.Stderr, "tier0:", err)
			if ec, ok := err.(interface{ ExitCode() int }); ok {
				os.Exit(ec.ExitCode())
			}
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// FakeTier0d stands in for one node's tier0d: it serves GET
// /v1/node/health with whatever the test sets, or 503 when the daemon is
// "down".
type FakeTier0d struct {
	srv  *httptest.Server
	mu   sync.Mutex
	body string
	hits atomic.Int64
}

func newFakeTier0d(t *testing.T) *FakeTier0d {
	f := &FakeTier0d{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		f.mu.Lock()
		body := f.body
		f.mu.Unlock()
		if r.URL.Path != "/v1/node/health" {
			http.NotFound(w, r)
			return
		}
		if body == "" {
			http.Error(w, "daemon down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *FakeTier0d) set(body string) {
	f.mu.Lock()
	f.body = body
	f.mu.Unlock()
}

// healthJSON is a report for node in the daemon's exact format.
func healthJSON(node string, o healthOpts) string {
	arrays := []string{}
	for _, a := range []string{"a", "b", "c", "d", "e"} {
		usable := a != o.noPath
		arrays = append(arrays, fmt.Sprintf(`{"name":%q,"state":"optimal","owner":%q,"path_usable":%v}`, a, strings.ToUpper(a), usable))
	}
	return fmt.Sprintf(`{"node":%q,"daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[%s],"rebuild_active":%v,"redundant":%v}`,
		node, strings.Join(arrays, ","), o.rebuilding, !o.rebuilding)
}

type healthOpts struct {
	rebuilding bool
	noPath     string
}

type cluster struct {
	t       *testing.T
	dir     string
	conf    string
	sc      *slurm.Client
	daemons map[string]*FakeTier0d // by Slurm node name
	ls      *localslurm.Cluster
	jobLog  string
	hookLog string
	sys     string
}

var tier0Names = map[string]string{"node1": "A", "node2": "B", "node3": "C", "node4": "D", "node5": "E"}

func need(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real Slurm cluster; skipped in -short mode")
	}
	if why := localslurm.Missing(); why != "" {
		testenv.Missing(t, "%s", why)
	}
}

// clusterOpts change what startClusterWith wires Slurm's hooks to.
type clusterOpts struct {
	// tier0 is the tier0 binary the wrappers run [this test binary].
	tier0 string
	// apis are the tier0d API base URLs by Slurm node name [a FakeTier0d each].
	apis map[string]string
	// beforeSlurm runs once the configuration is written and before
	// slurmctld starts (c.conf is SLURM_CONF); what it registers with
	// t.Cleanup runs before Slurm is stopped.
	beforeSlurm func(c *cluster)
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	return startClusterWith(t, clusterOpts{})
}

func startClusterWith(t *testing.T, o clusterOpts) *cluster {
	t.Helper()
	// Under /tmp rather than $TMPDIR: munged refuses a socket below any
	// directory that is not searchable by all.
	base := "/tmp"
	if st, err := os.Stat(base); err != nil || st.Mode().Perm()&0o001 == 0 {
		base = ""
	}
	dir, err := os.MkdirTemp(base, "tier0-slurmtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// munged insists that every directory above its socket is reachable.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, dir: dir, conf: filepath.Join(dir, "slurm.conf"), daemons: map[string]*FakeTier0d{},
		jobLog: filepath.Join(dir, "log", "jobs.log"), hookLog: filepath.Join(dir, "log", "hooks.log"), sys: filepath.Join(dir, "sys")}
	for _, d := range []string{"log", "bin", "sys/nvme0n1/device"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.write("sys/nvme0n1/device/subsysnqn", "nqn.2026-11.io.tier0:array-a\n", 0o644)
	c.write("sys/nvme0n1/stat", "0 0 0 0 0 0 0 0 0 0 0\n", 0o644)

	// The tier0 CLI (this test binary unless o.tier0), run through the
	// real wrapper scripts.
	self := o.tier0
	if self == "" {
		if self, err = os.Executable(); err != nil {
			t.Fatal(err)
		}
	}
	tier0 := filepath.Join(dir, "bin", "tier0")
	if err := os.Symlink(self, tier0); err != nil {
		t.Fatal(err)
	}
	hooksConf := filepath.Join(dir, "tier0-slurm.yaml")
	for _, h := range []string{"prolog", "epilog", "healthcheck"} {
		b, err := os.ReadFile(filepath.Join("..", "scripts", "tier0-"+h))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.Replace(string(b), "TIER0=/usr/local/bin/tier0", "TIER0="+tier0, 1)
		s = strings.Replace(s, "CONFIG=/etc/tier0/slurm.yaml", "CONFIG="+hooksConf, 1)
		if !strings.Contains(s, tier0) || !strings.Contains(s, hooksConf) {
			t.Fatalf("scripts/tier0-%s lost its TIER0= or CONFIG= line", h)
		}
		c.write("bin/tier0-"+h, s, 0o755)
	}

	var nodesYAML strings.Builder
	for i := 1; i <= 5; i++ {
		n := "node" + strconv.Itoa(i)
		api := o.apis[n]
		if o.apis == nil {
			d := newFakeTier0d(t)
			d.set(healthJSON(tier0Names[n], healthOpts{}))
			c.daemons[n] = d
			api = d.srv.URL
		}
		fmt.Fprintf(&nodesYAML, "  %s: {tier0: %s, api: %q}\n", n, tier0Names[n], api)
	}
	c.write("tier0-slurm.yaml", fmt.Sprintf(`scontrol: /usr/bin/scontrol
slurm_conf: %s
scontrol_timeout: 5s
http_timeout: 2s
state_dir: %s/hookstate
job_log: %s
hook_log: %s
metrics_dir: %s/metrics
sys_block: %s
nodes:
%s`, c.conf, dir, c.jobLog, c.hookLog, dir, c.sys, nodesYAML.String()), 0o644)

	// Our own munged with its own key and socket, and slurm.conf: nothing
	// outside dir (internal/localslurm).
	var nodes []string
	for i := 1; i <= 5; i++ {
		nodes = append(nodes, "node"+strconv.Itoa(i))
	}
	bin := filepath.Join(dir, "bin")
	c.ls, err = localslurm.New(context.Background(), localslurm.Options{Dir: dir, Nodes: nodes, ClusterName: "tier0test", Partition: "debug",
		Prolog: filepath.Join(bin, "tier0-prolog"), Epilog: filepath.Join(bin, "tier0-epilog"), HealthCheck: filepath.Join(bin, "tier0-healthcheck"),
		HealthCheckInterval: 2, PortBase: 16817, IdleTimeout: 120 * time.Second})
	if errors.Is(err, localslurm.ErrNoPorts) {
		testenv.Missing(t, "no free port range for the local Slurm: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if c.ls.Conf != c.conf {
		t.Fatalf("local Slurm's configuration is %s, want %s", c.ls.Conf, c.conf)
	}

	c.sc = slurm.New(slurm.Options{Conf: c.conf, Timeout: 5 * time.Second, Attempts: 2, Backoff: 200 * time.Millisecond})
	t.Cleanup(c.stop)
	if o.beforeSlurm != nil {
		o.beforeSlurm(c)
	}
	if err := c.ls.StartSlurm(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.waitFor("five idle nodes", 30*time.Second, func() bool {
		nodes, err := c.sc.ShowNodes(context.Background())
		if err != nil || len(nodes) != 5 {
			return false
		}
		for _, n := range nodes {
			if n.Base != "IDLE" || n.Unavailable() || n.HasFlag("NOT_RESPONDING") {
				return false
			}
		}
		return true
	})
	return c
}

func (c *cluster) write(rel, content string, mode os.FileMode) {
	c.t.Helper()
	p := filepath.Join(c.dir, rel)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		c.t.Fatal(err)
	}
}

// stop shows the logs' tails of a failed test, then shuts Slurm down.
func (c *cluster) stop() {
	if c.t.Failed() {
		for _, f := range []string{"munge/log", "log/munged.out", "log/slurmctld.out", "log/slurmctld.log", "log/hooks.log", "log/slurmd-node2.log", "log/slurmd-node3.log"} {
			b, _ := os.ReadFile(filepath.Join(c.dir, f))
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			c.t.Logf("--- tail of %s:\n%s", f, b)
		}
	}
	c.ls.Stop()
}

// waitFor polls ok until it holds. d is about what the step may take on a
// quiet machine; the bound is 4×d, a hang bound and no speed goal: CI runs
// this package beside others on 2 cores, where a requeue by slurmctld took
// over 30 s ("timed out after 30s waiting for job 2 requeued held").
func (c *cluster) waitFor(what string, d time.Duration, ok func() bool) {
	c.t.Helper()
	start := time.Now()
	deadline := start.Add(4 * d)
	for !ok() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %v waiting for %s", time.Since(start).Round(time.Millisecond), what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) node(name string) slurm.Node {
	c.t.Helper()
	n, err := c.sc.ShowNode(context.Background(), name)
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// healthChecksPass waits until node's HealthCheckProgram has asked its
// daemon at least n more times, so that a "nothing changed" check is not
// vacuous.
func (c *cluster) healthChecksPass(node string, n int64) {
	c.t.Helper()
	start := c.daemons[node].hits.Load()
	c.waitFor(fmt.Sprintf("%d health checks on %s", n, node), 20*time.Second, func() bool {
		return c.daemons[node].hits.Load() >= start+n
	})
}

func (c *cluster) slurmCmd(args ...string) string {
	c.t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.conf)
	cmd.Dir = c.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out.String())
	}
	return strings.TrimSpace(out.String())
}

func (c *cluster) sbatch(args ...string) string {
	c.t.Helper()
	out := c.slurmCmd(append([]string{"/usr/bin/sbatch", "--parsable", "-o", "/dev/null"}, args...)...)
	return strings.TrimSpace(strings.Split(out, ";")[0])
}

func (c *cluster) job(id string) string {
	c.t.Helper()
	return c.slurmCmd("/usr/bin/scontrol", "show", "job", "-o", id)
}

func TestSlurmHooksOnRealCluster(t *testing.T) {
	need(t)
	began := time.Now()
	c := startCluster(t)
	t.Logf("cluster up in %v", time.Since(began).Round(time.Millisecond))
	ctx := context.Background()

	// An administrator drains node5 (E) and its daemon dies: tier0 must
	// neither take over the drain nor, later, undo it.
	const adminReason = "admin: replace E3"
	if err := c.sc.Drain(ctx, "node5", adminReason); err != nil {
		t.Fatal(err)
	}
	c.daemons["node5"].set("")

	// 1. Health bad on B: the health check drains node2 with a tier0 reason.
	c.daemons["node2"].set("")
	c.waitFor("node2 drained by tier0", 20*time.Second, func() bool {
		n := c.node("node2")
		return n.Drained() && n.Reason == "tier0: daemon down"
	})
	t.Logf("B down -> node2 drained %q after %v", c.node("node2").Reason, time.Since(began).Round(time.Millisecond))

	// 2. Health back but rebuilding, not redundant: node2 stays drained.
	c.daemons["node2"].set(healthJSON("B", healthOpts{rebuilding: true}))
	c.healthChecksPass("node2", 2)
	if n := c.node("node2"); !n.Drained() || n.Reason != "tier0: daemon down" {
		t.Fatalf("node2 while rebuilding: state %s reason %q, want still drained by tier0", n.State, n.Reason)
	}

	// 3. Redundant again: node2 is resumed.
	c.daemons["node2"].set(healthJSON("B", healthOpts{}))
	c.waitFor("node2 resumed", 20*time.Second, func() bool { return !c.node("node2").Unavailable() })
	t.Logf("B redundant -> node2 resumed after %v", time.Since(began).Round(time.Millisecond))

	// 4. A job on a healthy node: the Prolog lets it run, the Epilog
	// records the I/O it did on the (fake) tier0 namespace.
	stat := filepath.Join(c.sys, "nvme0n1", "stat")
	okJob := c.sbatch("-w", "node1", "--comment", "tier0-arrays=a,b",
		"--wrap", fmt.Sprintf("echo '10 0 2048 0 4 0 8192 0 0 0 0' > %s", stat))
	c.waitFor("job "+okJob+" recorded by the epilog", 30*time.Second, func() bool {
		b, _ := os.ReadFile(c.jobLog)
		return strings.Contains(string(b), `"job_id":"`+okJob+`"`)
	})
	logText, _ := os.ReadFile(c.jobLog)
	if want := fmt.Sprintf(`"node":"node1","tier0_node":"A","job_id":"%s","user":"root","seconds":`, okJob); !strings.Contains(string(logText), want) ||
		!strings.Contains(string(logText), `"read_bytes":1048576,"write_bytes":4194304,"read_ios":10,"write_ios":4`) {
		t.Errorf("job log %s, want job %s on node1 with 1 MiB read, 4 MiB written", logText, okJob)
	}
	// COMPLETING while the Epilog finishes, then COMPLETED.
	c.waitFor("job "+okJob+" COMPLETED", 20*time.Second, func() bool {
		return strings.Contains(c.job(okJob), "JobState=COMPLETED")
	})

	// 5. A job whose Prolog finds no storage: array c has no usable path
	// from node3 (C). The job is requeued and node3 drained with the reason.
	c.daemons["node3"].set(healthJSON("C", healthOpts{noPath: "c"}))
	badJob := c.sbatch("-w", "node3", "--comment", "tier0-arrays=c", "--wrap", "true")
	wantReason := "tier0: prolog job " + badJob + ": array c has no usable path from this node"
	c.waitFor("job "+badJob+" requeued held", 30*time.Second, func() bool {
		j := c.job(badJob)
		return strings.Contains(j, "JobState=PENDING") && strings.Contains(j, "Restarts=1")
	})
	if n := c.node("node3"); !n.Drained() || n.Reason != wantReason {
		t.Fatalf("node3 after the prolog refused: state %s reason %q, want drained with %q", n.State, n.Reason, wantReason)
	}
	t.Logf("prolog refused job %s: %s", badJob, c.job(badJob)[:60])
	// Storage back: the health check resumes node3, since the drain is tier0's.
	c.daemons["node3"].set(healthJSON("C", healthOpts{}))
	c.waitFor("node3 resumed", 20*time.Second, func() bool { return !c.node("node3").Unavailable() })

	// 6. The daemon-side Drainer against the real scontrol: the cluster
	// declares D failed (its lease expired), D recovers, and the Drainer
	// resumes node4 once D reports redundant.
	c.daemons["node4"].set(strings.Replace(healthJSON("D", healthOpts{}), `"lease":"held"`, `"lease":"expired"`, 1))
	slurmName := func(n string) string { return "node" + strconv.Itoa(int(n[0]-'A'+1)) }
	d := drain.New(drain.Config{
		Slurm:     c.sc,
		Policy:    drain.Policy{ResumePoll: 200 * time.Millisecond},
		SlurmName: slurmName,
		Redundant: func(ctx context.Context, node string) (bool, error) {
			r, err := health.Fetch(ctx, nil, c.daemons[slurmName(node)].srv.URL)
			v, _ := health.Judge(r, err)
			return v == health.Healthy, nil
		},
	})
	defer d.Close()
	d.DrainFailedNode("D", "lease expired")
	if err := d.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.node("node4"); !n.Drained() || !slurm.IsTier0Reason(n.Reason) {
		t.Fatalf("node4 after DrainFailedNode: state %s reason %q, want drained by tier0", n.State, n.Reason)
	}
	d.ResumeWhenRedundant("D")
	c.daemons["node4"].set(healthJSON("D", healthOpts{}))
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := d.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	c.waitFor("node4 resumed", 20*time.Second, func() bool { return !c.node("node4").Unavailable() })

	// 7. The administrator's drain on node5 survived all of it, while E's
	// daemon was down and after it came back.
	c.daemons["node5"].set(healthJSON("E", healthOpts{}))
	c.healthChecksPass("node5", 2)
	d.DrainFailedNode("E", "daemon down")
	d.ResumeWhenRedundant("E")
	if err := d.Wait(wctx); err != nil {
		t.Fatal(err)
	}
	if n := c.node("node5"); !n.Drained() || n.Reason != adminReason {
		t.Fatalf("node5: state %s reason %q, want the administrator's drain %q untouched", n.State, n.Reason, adminReason)
	}
	t.Logf("whole scenario took %v", time.Since(began).Round(time.Millisecond))
}
