package campaign

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/internal/localcluster"
	"tier0/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// tier0d builds the daemon once per test binary.
func tier0d(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() { binPath, buildErr = BuildTier0d("tier0-campaign-bin") })
	if buildErr != nil {
		t.Fatalf("building tier0d: %v", buildErr)
	}
	return binPath
}

// runShort runs a short campaign on a testdata site, on ports shifted
// clear of anything else running.
func runShort(t *testing.T, site string, faults []string, seed uint64) Result {
	if testing.Short() {
		t.Skip("starts a cluster of tier0d processes (~1 min); skipped with -short")
	}
	bin := tier0d(t)
	site = filepath.Join("testdata", site)
	text, err := os.ReadFile(site)
	if err != nil {
		t.Fatal(err)
	}
	shift, err := localcluster.FreePortShift(string(text), []int{0, 100, 200, 300, 400})
	if err != nil {
		testenv.Missing(t, "no free port range for the campaign's cluster: %v", err)
	}
	wd := keepDir(t)
	var out lockedBuilder
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+45*time.Second*time.Duration(len(faults)))
	defer cancel()
	res, err := Run(ctx, Options{
		Site: site, Binary: bin, Workdir: wd, PortShift: shift, Faults: faults, Seed: seed,
		RecoverBound: 90 * time.Second, RecoveryPace: 20 * time.Millisecond, Units: 512, Out: &out,
		Logger: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	t.Log("\n" + out.String())
	if err != nil {
		dumpLogs(t, wd)
		t.Fatal(err)
	}
	t.Log("\n" + res.Summary())
	if err := res.Err(); err != nil {
		dumpLogs(t, wd)
		t.Fatal(err)
	}
	if res.Progress.Acked < 500 || res.Final.Verified != res.Final.Checked || res.Final.Checked == 0 {
		t.Fatalf("too little verified: %d writes acknowledged, %d of %d units verified", res.Progress.Acked, res.Final.Verified, res.Final.Checked)
	}
	if len(res.Injections) != len(faults) {
		t.Fatalf("%d injections, want %d", len(res.Injections), len(faults))
	}
	for _, in := range res.Injections {
		if in.Failover <= 0 {
			t.Errorf("%s: no failover measured: %+v", in.Fault, in)
		}
	}
	return res
}

// lockedBuilder is a strings.Builder shared by the campaign's output and
// the logger of its host-side devices.
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

// keepDir is the cluster's work directory: a fresh one under
// $TIER0_CAMPAIGN_KEEP (kept after the test, for the node logs) or a
// temporary one.
func keepDir(t *testing.T) string {
	base := os.Getenv("TIER0_CAMPAIGN_KEEP")
	if base == "" {
		return t.TempDir()
	}
	wd := filepath.Join(base, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.RemoveAll(wd); err != nil {
		t.Fatal(err)
	}
	t.Logf("work directory kept: %s", wd)
	return wd
}

func dumpLogs(t *testing.T, wd string) {
	logs, _ := filepath.Glob(filepath.Join(wd, "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		lines := strings.Split(string(b), "\n")
		t.Logf("--- %s (last 40 lines)\n%s", filepath.Base(l), strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}

// TestShortRAID5 kills an owner mid-write and freezes another past its
// lease, on the seed's 5-node RAID-5 topology.
func TestShortRAID5(t *testing.T) {
	runShort(t, "local5.yaml", []string{KillOwner, FreezeOwner}, 1)
}

// TestShortRAID6 kills two nodes at once on a 6-node RAID-6 site.
// It found docs/RELIABILITY.md's problem 1 (stale reads after the takeover
// of an array whose owner died together with one of its members), fixed in
// the RAID engine's log replay.
func TestShortRAID6(t *testing.T) {
	runShort(t, "raid6-6node.yaml", []string{KillTwo}, 2)
}

// TestFreezeEtcdVoterAndDroppedFrontend runs issue 12's schedules for
// holes 6 and 2 on the 5-node RAID-5 site: an embedded etcd voter frozen
// past the lease TTL, first the coordinator's node, then another voter
// (only the frozen node's arrays may move, once; nobody else fences
// itself); then the host's connections to an owner reset mid-write while
// one of the array's member nodes is slow (no acknowledged write may be
// overwritten by a command of the dead connection).
func TestFreezeEtcdVoterAndDroppedFrontend(t *testing.T) {
	runShort(t, "local5.yaml", []string{FreezeEtcdVoter, FreezeEtcdVoter, DropFrontendSlowMember}, 3)
}

// TestFreezeWithQueuedRepair runs issue 12's schedule for hole 1 on the
// RAID-6 site (a member node and the owner out at once): the thawed
// ex-owner has a queued repair and an old epoch; the new owner must keep
// its reservations and nothing may be lost or stale.
func TestFreezeWithQueuedRepair(t *testing.T) {
	runShort(t, "raid6-6node.yaml", []string{FreezeQueuedRepair}, 4)
}
