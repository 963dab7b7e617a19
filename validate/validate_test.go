package validate

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/bench"
)

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// buildTier0d builds the real daemon into a temporary folder.
func buildTier0d(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go tool is not on $PATH; the end-to-end test builds tier0d with it")
	}
	bin := filepath.Join(t.TempDir(), "tier0d")
	cmd := exec.Command("go", "build", "-o", bin, "tier0/cmd/tier0d")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build tier0d: %v\n%s", err, out)
	}
	return bin
}

// tier0dOf lists the running tier0d processes whose command line names
// site.
func tier0dOf(site string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if cl := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(cl, "tier0d") && strings.Contains(cl, site) {
			out = append(out, e.Name()+": "+cl)
		}
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for the progress bar's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLocalEndToEnd runs the real thing: five tier0d processes, an
// interrupted run (Ctrl-C right after the cluster came up) that must leave
// nothing behind, then a full --short run in the same work directory that
// must pass every check and write the report.
func TestLocalEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the end-to-end validation starts five tier0d processes and takes a minute or two")
	}
	bin := buildTier0d(t)
	work := filepath.Join(t.TempDir(), "work")
	site, err := filepath.Abs("testdata/site-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := loadTestSite(t, work)
	if err := checkPorts(cfg); err != nil {
		t.Skipf("the test site's ports are taken on this host: %v", err)
	}
	opts := Options{Site: site, Local: true, Short: true, WorkDir: work, Tier0d: bin, Logger: discardLog()}

	t.Run("interrupted", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		o := opts
		o.OutDir = filepath.Join(t.TempDir(), "report")
		o.OnCheck = func(c bench.Check) {
			if c.Name == CheckClusterUp {
				if c.Status != bench.Pass {
					t.Errorf("cluster up: %s", c.Reason)
				}
				cancel() // Ctrl-C
			}
		}
		rep, err := Run(ctx, o)
		if !errors.Is(err, ErrInterrupted) {
			t.Fatalf("Run = %v, want ErrInterrupted", err)
		}
		if ExitCode(rep.Results, err) != ExitInterrupted {
			t.Errorf("exit code %d, want %d", ExitCode(rep.Results, err), ExitInterrupted)
		}
		if left := tier0dOf(site); len(left) > 0 {
			t.Errorf("tier0d processes left running after the interrupt: %v", left)
		}
		for _, p := range workPaths(cfg, work) {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("work file %s left after the interrupt (%v)", p, err)
			}
		}
		for _, c := range rep.Results.Checks {
			if c.Name != CheckRaw && c.Name != CheckClusterUp && c.Status == bench.Pass {
				t.Errorf("check %q passed in a run interrupted after the cluster came up", c.Name)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("short", func(t *testing.T) {
		// Leave a stale work file behind, as a killed run would.
		stale := filepath.Join(work, "A", "A1.img")
		if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(stale, []byte("left by a killed run"), 0o644); err != nil {
			t.Fatal(err)
		}
		o := opts
		o.OutDir = filepath.Join(t.TempDir(), "report")
		out := &syncBuffer{}
		o.Out, o.Progress = out, true
		t0 := time.Now()
		rep, err := Run(context.Background(), o)
		t.Logf("validate --short took %s", time.Since(t0).Round(time.Second))
		if rep == nil {
			t.Fatalf("Run: %v", err)
		}
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		for _, c := range rep.Results.Checks {
			want := bench.Pass
			if c.Name == CheckSlurm || c.Name == CheckGDS {
				want = bench.NotRun // the test site has no Slurm; CI has no GPU
			}
			if c.Name == CheckGDS && c.Status == bench.Pass {
				continue // a GPU host with GDS
			}
			if c.Status != want {
				t.Errorf("check %q: %s (%s), want %s", c.Name, c.Status, c.Reason, want)
			}
		}
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
			for _, l := range rep.Logs {
				b, _ := os.ReadFile(l)
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("tail of %s:\n%s", l, b)
			}
		}
		res, err := bench.ReadFile(rep.ResultsFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, layer := range []bench.Layer{bench.LayerRaw, bench.LayerBlock, bench.LayerFrontend} {
			for _, sc := range []string{bench.ScenarioSeqRead1M, bench.ScenarioSeqWrite1M, bench.ScenarioRandRead4K, bench.ScenarioRandWrite4K} {
				if m, ok := res.Find(layer, bench.Healthy, sc); !ok || m.Ops == 0 {
					t.Errorf("no healthy %s %s measurement", layer, sc)
				}
			}
		}
		if m, ok := res.Find(bench.LayerFrontend, bench.Degraded, bench.ScenarioRandRead4K); !ok || m.Ops == 0 {
			t.Error("no degraded frontend measurement")
		}
		if f := res.Failover; f == nil || f.Node != "B" || f.Duration <= 0 || len(f.Arrays) != 5 {
			t.Errorf("failover record %+v, want node B, a duration and five arrays", f)
		}
		if len(res.Rebuilds) != 4 {
			t.Errorf("%d rebuild records, want 4 (arrays A, C, D, E)", len(res.Rebuilds))
		}
		for _, p := range append([]string{rep.Paths.HTML, rep.Paths.Markdown}, rep.Logs...) {
			if st, err := os.Stat(p); err != nil || st.Size() == 0 {
				t.Errorf("report file %s: %v", p, err)
			}
		}
		if len(rep.Logs) != 5 {
			t.Errorf("%d node logs copied, want 5", len(rep.Logs))
		}
		for _, want := range []string{"CHECKLIST", "PASSED", "resync/rebuild", "report:"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("output lacks %q", want)
			}
		}
		if left := tier0dOf(site); len(left) > 0 {
			t.Errorf("tier0d processes left running: %v", left)
		}
		if _, err := os.Stat(work); !os.IsNotExist(err) {
			t.Errorf("work dir %s left behind (%v)", work, err)
		}
	})
}
