package cluster

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"tier0/internal/testenv"
	"tier0/validate"
)

// site is this package's own five-node site (ports 16379-16484).
const site = "testdata/local5.yaml"

// buildTier0d builds the real tier0d (without -race: it runs as its own
// processes) into a temporary folder.
func buildTier0d(tb testing.TB) string {
	tb.Helper()
	return testenv.Binaries(tb, "tier0d")[0]
}

func testLogger() *slog.Logger {
	if os.Getenv("TIER0_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// startCluster builds tier0d and starts the site in a temporary work
// directory; the cluster is stopped when the test ends, and the tails of
// the nodes' logs are printed when it failed.
func startCluster(tb testing.TB) (*validate.LocalCluster, string) {
	tb.Helper()
	return startSite(tb, site, buildTier0d(tb))
}

// startSite is startCluster for the site file site and the tier0d binary bin.
func startSite(tb testing.TB, site, bin string) (*validate.LocalCluster, string) {
	tb.Helper()
	work := filepath.Join(tb.TempDir(), "work")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := validate.StartLocalCluster(ctx, site, bin, work, 150*time.Second, testLogger())
	if err != nil {
		dumpLogs(tb, work)
		tb.Fatalf("starting the local cluster from %s: %v", site, err)
	}
	tb.Cleanup(func() {
		c.Stop()
		if tb.Failed() {
			dumpLogs(tb, work)
		}
	})
	return c, work
}

// dumpLogs logs the last lines of every node's log.
func dumpLogs(tb testing.TB, work string) {
	files, _ := filepath.Glob(filepath.Join(work, "logs", "*.log"))
	sort.Strings(files)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		tb.Logf("--- %s (last %d lines)\n%s", filepath.Base(f), len(lines), strings.Join(lines, "\n"))
	}
}

// ownerOf asks the cluster who owns array now ("" when unknown).
func ownerOf(ctx context.Context, c *validate.LocalCluster, array string) (owner, state, phase string) {
	st, err := c.Status(ctx)
	if err != nil {
		return "", "", err.Error()
	}
	for _, a := range st.Arrays {
		if a.Name == array {
			return a.Owner, string(a.State), string(a.Phase)
		}
	}
	return "", "", "array not listed"
}
