package validate

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/bench"
	"tier0/internal/localcluster"
	"tier0/internal/testenv"
)

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// buildBinaries builds the real tier0 and tier0d, side by side, into a
// temporary folder (without -race: the validation runs as its own process,
// so that the race detector of a `go test -race` run does not slow the
// load generator five-fold or judge other packages' code paths here).
func buildBinaries(t *testing.T) (tier0 string) {
	t.Helper()
	return testenv.Binaries(t, "tier0", "tier0d")[0]
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

// TestLocalEndToEnd runs the real thing: `tier0 validate --local --short`
// with five tier0d processes; first interrupted with SIGINT right after the
// cluster came up (it must stop every process and leave no work file, exit
// 130), then a full run in the same work directory, over a stale file left
// behind, that must pass every check (Slurm and GDS: not run on CI) and
// write the report.
func TestLocalEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the end-to-end validation starts five tier0d processes and takes a minute or two")
	}
	tier0 := buildBinaries(t)
	work := filepath.Join(t.TempDir(), "work")
	site, err := filepath.Abs("testdata/site-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := loadTestSite(t, work)
	if err := localcluster.CheckPorts(cfg); err != nil {
		t.Skipf("the test site's ports are taken on this host: %v", err)
	}
	validate := func(out string) *exec.Cmd {
		cmd := exec.Command(tier0, "validate", "--site", site, "--local", "--short", "--work", work, "--out", out)
		cmd.Env = os.Environ()
		return cmd
	}
	exitCode := func(err error) int {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("tier0 validate: %v", err)
		}
		return 0
	}

	t.Run("interrupted", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "report")
		cmd := validate(out)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var seen strings.Builder
		sc := bufio.NewScanner(stdout)
		up := false
		for sc.Scan() {
			seen.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "] "+CheckClusterUp) {
				up = strings.Contains(sc.Text(), "[PASS")
				_ = cmd.Process.Signal(os.Interrupt) // Ctrl-C
				break
			}
		}
		go io.Copy(io.Discard, stdout)
		code := exitCode(cmd.Wait())
		if !up {
			t.Fatalf("cluster did not come up:\n%s\nstderr:\n%s", seen.String(), stderr.String())
		}
		if code != ExitInterrupted {
			t.Errorf("exit code %d, want %d; stderr:\n%s", code, ExitInterrupted, stderr.String())
		}
		if left := tier0dOf(site); len(left) > 0 {
			t.Errorf("tier0d processes left running after the interrupt: %v", left)
		}
		for _, p := range localcluster.WorkPaths(cfg, work) {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("work file %s left after the interrupt (%v)", p, err)
			}
		}
		res, err := bench.ReadFile(filepath.Join(out, "results.json"))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range res.Checks {
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
		out := filepath.Join(t.TempDir(), "report")
		cmd := validate(out)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		t0 := time.Now()
		code := exitCode(cmd.Run())
		t.Logf("tier0 validate --local --short took %s", time.Since(t0).Round(time.Second))
		res, err := bench.ReadFile(filepath.Join(out, "results.json"))
		if err != nil {
			t.Fatalf("%v (exit code %d); stderr:\n%s", err, code, stderr.String())
		}
		if code != ExitPass {
			t.Errorf("exit code %d, want 0", code)
		}
		for _, c := range res.Checks {
			want := bench.Pass
			if c.Name == CheckSlurm || c.Name == CheckGDS || c.Name == CheckFS {
				want = bench.NotRun // the test site has no Slurm; CI has no GPU; --short boots no guest
			}
			if c.Name == CheckGDS && c.Status == bench.Pass {
				continue // a GPU host with GDS
			}
			if c.Status != want {
				t.Errorf("check %q: %s (%s), want %s", c.Name, c.Status, c.Reason, want)
			}
		}
		if len(res.Checks) != len(AllChecks) {
			t.Errorf("%d checks, want %d", len(res.Checks), len(AllChecks))
		}
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			for _, n := range []string{"A", "B", "C"} {
				b, _ := os.ReadFile(filepath.Join(out, "logs", n+".log"))
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				t.Logf("tail of node %s's log:\n%s", n, b)
			}
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
		for _, f := range []string{"report.html", "report.md", "logs/A.log", "logs/E.log"} {
			if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
				t.Errorf("report file %s: %v", f, err)
			}
		}
		for _, want := range []string{"CHECKLIST", "PASSED", "resync/rebuild", "report:"} {
			if !strings.Contains(stdout.String(), want) {
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
