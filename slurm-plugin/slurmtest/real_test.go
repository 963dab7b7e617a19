package slurmtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"tier0/daemon/api"
	tier0cluster "tier0/daemon/cluster"
	"tier0/daemon/slurm"
	"tier0/internal/gobuild"
	"tier0/internal/testenv"
	"tier0/validate"
)

// realSite is the five-node site of the real-daemon test: the seed
// topology on its own ports, Slurm enabled with A..E mapped to node1..node5.
const realSite = "testdata/site-5node.yaml"

// slurmNode is the Slurm name of tier0 node A..E.
func slurmNode(tier0 string) string { return "node" + strconv.Itoa(int(tier0[0]-'A'+1)) }

// realAPIs are the tier0d API addresses of realSite, by Slurm node.
var realAPIs = map[string]string{
	"node1": "http://127.0.0.1:32480", "node2": "http://127.0.0.1:32481", "node3": "http://127.0.0.1:32482",
	"node4": "http://127.0.0.1:32483", "node5": "http://127.0.0.1:32484",
}

// buildBinaries builds tier0d and tier0 into a temporary directory. The
// tier0 CLI falls back to this test binary (which carries the same `slurm`
// verbs) when cmd/tier0 does not build; tier0d must build.
func buildBinaries(t *testing.T) (tier0d, tier0 string) {
	t.Helper()
	tier0d = testenv.Binaries(t, "tier0d")[0]
	paths, err := gobuild.BuildBinaries(t.TempDir(), "tier0")
	if err != nil {
		t.Logf("%v\nthe hooks run this test binary's tier0 slurm verbs instead", err)
		return tier0d, ""
	}
	return tier0d, paths[0]
}

// realCluster is Slurm plus five real tier0d.
type realCluster struct {
	*cluster
	lc   *validate.LocalCluster
	work string
}

func startRealCluster(t *testing.T) *realCluster {
	t.Helper()
	tier0d, tier0 := buildBinaries(t)
	site, err := filepath.Abs(realSite)
	if err != nil {
		t.Fatal(err)
	}
	rc := &realCluster{}
	c := startClusterWith(t, clusterOpts{tier0: tier0, apis: realAPIs, beforeSlurm: func(c *cluster) {
		// tier0d inherits the environment: its drainer's scontrol finds
		// this cluster through SLURM_CONF.
		t.Setenv("SLURM_CONF", c.conf)
		rc.work = filepath.Join(c.dir, "tier0-work")
		t.Setenv("TIER0_WORK", rc.work)
		began := time.Now()
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		lc, err := validate.StartLocalCluster(context.Background(), site, tier0d, rc.work, 90*time.Second, log)
		if err != nil {
			t.Fatalf("starting five tier0d from %s: %v", realSite, err)
		}
		rc.lc = lc
		t.Cleanup(func() {
			if keep := os.Getenv("TIER0_SLURMTEST_KEEP"); t.Failed() && keep != "" {
				out, err := exec.Command("cp", "-r", filepath.Join(rc.work, "logs"), c.hookLog, keep).CombinedOutput()
				t.Logf("TIER0_SLURMTEST_KEEP: tier0d and hook logs copied to %s (%v %s)", keep, err, out)
			}
			if t.Failed() {
				for _, n := range []string{"A", "B", "C", "D"} {
					b, _ := os.ReadFile(filepath.Join(rc.work, "logs", n+".log"))
					if len(b) > 3000 {
						b = b[len(b)-3000:]
					}
					t.Logf("--- tail of tier0d %s log:\n%s", n, b)
				}
			}
			lc.Stop()
		})
		t.Logf("five tier0d optimal in %v", time.Since(began).Round(time.Millisecond))
	}})
	rc.cluster = c
	return rc
}

// tier0dLog is every tier0d's log so far, concatenated.
func (rc *realCluster) tier0dLog() string {
	var b strings.Builder
	for _, n := range []string{"A", "B", "C", "D", "E"} {
		s, _ := os.ReadFile(filepath.Join(rc.work, "logs", n+".log"))
		b.Write(s)
	}
	return b.String()
}

// drainerDid reports whether some tier0d's Slurm drainer logged a
// successful operation on slurmNode whose line contains every one of want.
func (rc *realCluster) drainerDid(slurmNode string, want ...string) bool {
	for _, l := range strings.Split(rc.tier0dLog(), "\n") {
		if !strings.Contains(l, `msg="slurm node"`) || !strings.Contains(l, "slurm_node="+slurmNode+" ") {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			return true
		}
	}
	return false
}

// healthChecks counts the HealthCheckProgram runs on node that reached a
// verdict.
func (rc *realCluster) healthChecks(node string) int {
	b, _ := os.ReadFile(rc.hookLog)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "msg=healthcheck ") && strings.Contains(l, " node="+node+" ") {
			n++
		}
	}
	return n
}

// healthChecksRun waits until node's health check has run n more times.
func (rc *realCluster) healthChecksRun(node string, n int) {
	rc.t.Helper()
	start := rc.healthChecks(node)
	rc.waitFor(fmt.Sprintf("%d health checks on %s", n, node), 30*time.Second, func() bool {
		return rc.healthChecks(node) >= start+n
	})
}

// unsynced lists what keeps the cluster from being redundant: arrays
// degraded, rebuilding or failed, members not in sync. Empty when every
// member of every array is in sync.
func unsynced(st api.Status) []string {
	var out []string
	for _, a := range st.Arrays {
		if s := string(a.State); s == "degraded" || s == "rebuilding" || s == "failed" {
			out = append(out, fmt.Sprintf("array %s %s", a.Name, s))
		}
		for _, m := range a.Members {
			if m.State != "ok" {
				out = append(out, fmt.Sprintf("%s/%s %s", a.Name, m.Drive, m.State))
			}
		}
	}
	return out
}

func (rc *realCluster) status() api.Status {
	rc.t.Helper()
	st, err := rc.lc.Status(context.Background())
	if err != nil {
		rc.t.Fatal(err)
	}
	return st
}

// TestSlurmWithRealTier0d is issue 7's "Done when" with real processes:
// five tier0d (the coordinator's drainer calling the real scontrol), the
// real tier0 binary as HealthCheckProgram and Prolog through the shipped
// wrappers, and a real slurmctld with five slurmd.
func TestSlurmWithRealTier0d(t *testing.T) {
	need(t)
	began := time.Now()
	rc := startRealCluster(t)
	t.Logf("tier0d and Slurm up in %v", time.Since(began).Round(time.Millisecond))
	ctx := context.Background()
	since := func() time.Duration { return time.Since(began).Round(time.Millisecond) }

	// The two nodes this test kills are B and D (not etcd voters). The
	// node whose loss the coordinator's drainer must act on is not the
	// coordinator itself: a coordinator elected after its predecessor died
	// restores "node down" without draining it (see docs/SLURM.md, known
	// gaps); the health check covers that case.
	vic, adm := "B", "D"
	if coord := rc.status().Coordinator; coord == "B" {
		vic, adm = "D", "B"
	}
	vicNode, admNode := slurmNode(vic), slurmNode(adm)
	t.Logf("coordinator %s; killing %s (%s), administrator holds %s (%s)", rc.status().Coordinator, vic, vicNode, adm, admNode)

	// An administrator drains admNode for maintenance. tier0 never undoes
	// it: not while its storage is healthy, not when its tier0d dies, not
	// when it is back (checked in step 4).
	adminReason := "admin: replace " + adm + "3"
	if err := rc.sc.Drain(ctx, admNode, adminReason); err != nil {
		t.Fatal(err)
	}

	// 1. The health check resumes a tier0 drain by itself: node3's drain
	// (left over, say, from before a restart of the coordinator) is lifted
	// because C's real tier0d reports healthy, while the administrator's
	// drain stays.
	if err := rc.sc.Drain(ctx, "node3", "tier0: left over from an earlier failure"); err != nil {
		t.Fatal(err)
	}
	rc.waitFor("node3 resumed by its health check", 30*time.Second, func() bool { return !rc.node("node3").Unavailable() })
	if b, _ := os.ReadFile(rc.hookLog); !strings.Contains(string(b), " node=node3 tier0_node=C verdict=healthy reasons=[] action=resume") {
		t.Fatalf("node3 back in service, but the hook log has no health check resume of node3:\n%s", b)
	}
	t.Logf("%v: node3's tier0 drain lifted by the health check", since())

	// 2. kill -9 the victim's tier0d: its Slurm node is drained with a
	// tier0 reason, by the health check ("daemon down") and by the
	// coordinator's drainer once the lease expires ("storage lease
	// expired").
	killed, err := rc.lc.Kill(vic)
	if err != nil {
		t.Fatal(err)
	}
	var first slurm.Node
	rc.waitFor(vicNode+" drained by tier0", 30*time.Second, func() bool {
		first = rc.node(vicNode)
		return first.Drained() && slurm.IsTier0Reason(first.Reason)
	})
	t.Logf("%v: %s killed -> %s drained %q after %v", since(), vic, vicNode, first.Reason, time.Since(killed).Round(time.Millisecond))
	rc.waitFor("the coordinator's drainer to drain "+vicNode, 30*time.Second, func() bool {
		return rc.drainerDid(vicNode, "op=drain", `reason="tier0: storage lease expired"`)
	})
	rc.waitFor("the health check to drain "+vicNode+" as daemon down", 30*time.Second, func() bool {
		n := rc.node(vicNode)
		return n.Drained() && n.Reason == "tier0: daemon down"
	})
	if n := rc.node(admNode); n.Reason != adminReason {
		t.Fatalf("%s while %s is down: reason %q, want the administrator's %q", admNode, vic, n.Reason, adminReason)
	}
	rc.waitFor("every array served", 60*time.Second, func() bool {
		for _, a := range rc.status().Arrays {
			if a.Owner == vic || a.Phase != "active" {
				return false
			}
		}
		return true
	})
	t.Logf("%v: array %s served by a survivor; %s %q", since(), vic, vicNode, rc.node(vicNode).Reason)

	// 3. Restart the victim: its node stays drained while any member is
	// not in sync, and is resumed after.
	if err := rc.lc.Start(vic); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	drainedWhileUnsynced := 0
	var lastPending []string
	rc.waitFor(vicNode+" resumed", 120*time.Second, func() bool {
		// Slurm first, then tier0: a node seen in service before an
		// array seen unsynced was resumed too early.
		n := rc.node(vicNode)
		st, err := rc.lc.Status(ctx)
		if err != nil {
			return false
		}
		pending := unsynced(st)
		if n.Unavailable() {
			if len(pending) > 0 {
				drainedWhileUnsynced++
				lastPending = pending
			}
			return false
		}
		if len(pending) > 0 {
			t.Fatalf("%s resumed (state %s) while %v", vicNode, n.State, pending)
		}
		return true
	})
	if drainedWhileUnsynced == 0 {
		t.Fatalf("never saw %s drained while %s's members resynced: the check above proved nothing", vicNode, vic)
	}
	t.Logf("%v: %s restarted -> %s drained through %d looks at an unsynced cluster (last: %v), resumed %v after the restart",
		since(), vic, vicNode, drainedWhileUnsynced, lastPending, time.Since(restarted).Round(time.Millisecond))
	if err := rc.lc.WaitOptimal(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	// 4. An administrator's drain is never undone: adm's tier0d dies (the
	// health check sees it failed, the coordinator's drainer is asked to
	// drain it) and comes back (both would resume a tier0 drain).
	admWasCoord := rc.status().Coordinator == adm
	if _, err := rc.lc.Kill(adm); err != nil {
		t.Fatal(err)
	}
	if !admWasCoord {
		rc.waitFor("the coordinator's drainer to leave "+admNode+" alone", 30*time.Second, func() bool {
			return rc.drainerDid(admNode, "op=keep", "held by someone else")
		})
	}
	rc.healthChecksRun(admNode, 2)
	if n := rc.node(admNode); !n.Drained() || n.Reason != adminReason {
		t.Fatalf("%s with %s down: state %s reason %q, want the administrator's drain %q", admNode, adm, n.State, n.Reason, adminReason)
	}
	// The story needs the cluster to have seen adm die: the store holds a
	// lost lease back for half a TTL, and a node back within that grace is
	// not a node loss (docs/CONTROL-PLANE.md, "Leases").
	rc.waitFor("the cluster to see "+adm+" down", 30*time.Second, func() bool {
		st, err := rc.lc.Status(ctx)
		if err != nil {
			return false // the coordinator may be changing
		}
		for _, n := range st.Nodes {
			if n.Name == adm {
				return n.State != tier0cluster.NodeUp
			}
		}
		return false
	})
	if err := rc.lc.Start(adm); err != nil {
		t.Fatal(err)
	}
	if err := rc.lc.WaitOptimal(ctx, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	rc.waitFor("the coordinator's drainer to decline resuming "+admNode, 30*time.Second, func() bool {
		return rc.drainerDid(admNode, "op=keep", "not resumed: held by someone else")
	})
	rc.healthChecksRun(admNode, 2)
	if n := rc.node(admNode); !n.Drained() || n.Reason != adminReason {
		t.Fatalf("%s after %s is back and optimal: state %s reason %q, want the administrator's drain %q", admNode, adm, n.State, n.Reason, adminReason)
	}
	t.Logf("%v: %s killed and restarted; %s kept %q", since(), adm, admNode, adminReason)

	// 5. A job whose Prolog finds no storage: array A loses two members
	// (operator fails C1 and D1 through the real API), so it has failed.
	// The health check does not drain anyone for that (the nodes' storage
	// roles work), but a job on node3 that needs A is refused by the
	// Prolog: requeued held, node3 drained with the Prolog's reason.
	cl := api.NewClient(realAPIs["node1"], "", nil)
	for _, d := range []string{"C1", "D1"} {
		if err := cl.FailDrive(ctx, d); err != nil {
			t.Fatalf("fail drive %s: %v", d, err)
		}
	}
	rc.waitFor("array A failed", 30*time.Second, func() bool {
		for _, a := range rc.status().Arrays {
			if a.Name == "A" {
				return a.State == "failed"
			}
		}
		return false
	})
	job := rc.sbatch("-w", "node3", "--comment", "tier0-arrays=A", "--wrap", "true")
	rc.waitFor("job "+job+" requeued held", 30*time.Second, func() bool {
		j := rc.job(job)
		return strings.Contains(j, "JobState=PENDING") && strings.Contains(j, "Restarts=1")
	})
	wantReason := "tier0: prolog job " + job + ": array A failed"
	if n := rc.node("node3"); !n.Drained() || n.Reason != wantReason {
		t.Fatalf("node3 after the Prolog refused job %s: state %s reason %q, want drained with %q", job, n.State, n.Reason, wantReason)
	}
	rc.healthChecksRun("node3", 2)
	if n := rc.node("node3"); !n.Drained() || n.Reason != wantReason {
		t.Fatalf("node3 while array A is failed: state %s reason %q, want still drained with %q", n.State, n.Reason, wantReason)
	}
	if n := rc.node(admNode); n.Reason != adminReason {
		t.Fatalf("%s at the end: reason %q, want the administrator's %q", admNode, n.Reason, adminReason)
	}
	t.Logf("%v: prolog refused job %s: %s", since(), job, wantReason)
}
