package validate

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tier0/bench"
	"tier0/daemon/config"
	"tier0/internal/localcluster"
)

// TestMain lets the test binary stand in for a tier0d that hangs (the
// stale-process tests start it under the name tier0d).
func TestMain(m *testing.M) {
	if os.Getenv("TIER0_VALIDATE_FAKE_TIER0D") == "sleep" {
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func results(st ...bench.CheckStatus) *bench.Results {
	r := bench.NewResults("t", "s", time.Now(), bench.Environment{})
	for i, s := range st {
		r.AddCheck(fmt.Sprintf("c%d", i), s, "")
	}
	return r
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  *bench.Results
		err  error
		want int
	}{
		{"all pass", results(bench.Pass, bench.Pass), nil, ExitPass},
		{"not-run is not a failure", results(bench.Pass, bench.NotRun), nil, ExitPass},
		{"one failed check", results(bench.Pass, bench.Fail, bench.NotRun), fmt.Errorf("x: %w", ErrChecksFailed), ExitFail},
		{"failed check even without the error", results(bench.Fail), nil, ExitFail},
		{"could not run", nil, fmt.Errorf("%w: port busy", ErrSetup), ExitSetup},
		{"a step error with passing checks", results(bench.Pass), errors.New("fill: boom"), ExitSetup},
		{"interrupted wins over failures", results(bench.Fail), fmt.Errorf("%w: signal", ErrInterrupted), ExitInterrupted},
	} {
		if got := ExitCode(tc.res, tc.err); got != tc.want {
			t.Errorf("%s: ExitCode = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestCompleteOrdersAndFillsNotRun(t *testing.T) {
	r := bench.NewResults("t", "s", time.Now(), bench.Environment{})
	r.AddCheck(CheckFill, bench.Pass, "filled")
	r.AddCheck("extra", bench.Fail, "why")
	r.AddCheck(CheckClusterUp, bench.Pass, "up")
	complete(r, "not reached: cluster down")
	if len(r.Checks) != len(AllChecks)+1 {
		t.Fatalf("%d checks, want %d", len(r.Checks), len(AllChecks)+1)
	}
	for i, name := range AllChecks {
		if r.Checks[i].Name != name {
			t.Fatalf("check %d is %q, want %q", i, r.Checks[i].Name, name)
		}
	}
	if c := r.Checks[1]; c.Status != bench.Pass || c.Reason != "up" {
		t.Errorf("recorded check changed: %+v", c)
	}
	if c := r.Checks[0]; c.Status != bench.NotRun || c.Reason != "not reached: cluster down" {
		t.Errorf("missing check: %+v, want not-run with the reason", c)
	}
	if c := r.Checks[len(r.Checks)-1]; c.Name != "extra" || c.Status != bench.Fail {
		t.Errorf("unknown check not kept last: %+v", c)
	}
	if got := Failed(r); len(got) != 1 || got[0].Name != "extra" {
		t.Errorf("Failed = %+v", got)
	}
}

func TestWriteChecklist(t *testing.T) {
	r := bench.NewResults("t", "s", time.Now(), bench.Environment{})
	r.AddCheck(CheckClusterUp, bench.Pass, "5 nodes")
	r.AddCheck(CheckMoved, bench.Fail, "array B did not move")
	r.AddCheck(CheckSlurm, bench.NotRun, "Slurm not configured")
	var b strings.Builder
	if err := WriteChecklist(&b, r); err != nil {
		t.Fatal(err)
	}
	want := "CHECKLIST\n" +
		"[PASS   ] cluster up: 5 nodes\n" +
		"[FAIL   ] failover: owned arrays moved complete: array B did not move\n" +
		"[NOT RUN] slurm hooks: Slurm not configured\n" +
		"FAILED: 1 passed, 1 failed, 1 not run\n"
	if b.String() != want {
		t.Errorf("checklist:\n%s\nwant:\n%s", b.String(), want)
	}
}

func loadTestSite(t *testing.T, work string) *config.Config {
	t.Helper()
	t.Setenv("TIER0_WORK", work)
	cfg, err := config.Load("testdata/site-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestTopology(t *testing.T) {
	cfg := loadTestSite(t, t.TempDir())
	if got, want := topology(cfg), "5 nodes x 4 drives, 5 x RAID-5 3+1"; got != want {
		t.Errorf("topology = %q, want %q", got, want)
	}
}

func TestCheckPortsNamesTheBusyPort(t *testing.T) {
	cfg := loadTestSite(t, t.TempDir())
	if err := localcluster.CheckPorts(cfg); err != nil {
		t.Skipf("test site's ports are not free on this host: %v", err)
	}
	n := &cfg.Nodes[2]
	l, err := net.Listen("tcp", n.ListenAddr(n.API))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = localcluster.CheckPorts(cfg)
	if !errors.Is(err, ErrPortBusy) {
		t.Fatalf("checkPorts = %v, want ErrPortBusy", err)
	}
	port := strconv.Itoa(n.API.Port)
	for _, want := range []string{"127.0.0.1:" + port, "node C api", "sport = :" + port} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestCleanWorkRemovesOnlyItsFiles(t *testing.T) {
	work := filepath.Join(t.TempDir(), "work")
	cfg := loadTestSite(t, work)
	var made []string
	for _, p := range localcluster.WorkPaths(cfg, work) {
		if strings.HasSuffix(p, ".img") || strings.HasSuffix(p, localcluster.PIDFile) {
			made = append(made, p)
		} else {
			made = append(made, filepath.Join(p, "file"))
		}
	}
	for _, p := range made {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	foreign := filepath.Join(work, "A", "notes.txt")
	if err := os.WriteFile(foreign, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.CleanWork(cfg, work); err != nil {
		t.Fatal(err)
	}
	for _, p := range made {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("a file validate did not make was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(work, "B")); !os.IsNotExist(err) {
		t.Errorf("empty drive folder B left behind (%v)", err)
	}
	os.Remove(foreign)
	os.Remove(filepath.Dir(foreign))
	if err := localcluster.CleanWork(cfg, work); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("empty work dir left behind (%v)", err)
	}
}

// startFakeTier0d starts this test binary under the name .../tier0d with
// --node X, hanging, in its own session so that it outlives nothing.
func startFakeTier0d(t *testing.T, dir, node string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "--node", node)
	cmd.Args[0] = filepath.Join(dir, "tier0d")
	cmd.Env = append(os.Environ(), "TIER0_VALIDATE_FAKE_TIER0D=sleep")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func TestStopStaleKillsOnlyRecordedTier0d(t *testing.T) {
	work := t.TempDir()
	stale := startFakeTier0d(t, work, "A")
	// A recorded PID that is not a tier0d must be left alone.
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
	for !localcluster.IsTier0d(stale.Process.Pid) {
		time.Sleep(10 * time.Millisecond) // until exec has replaced the fork
	}
	// Reap the fake as soon as it dies, as init would for an orphan.
	exited := make(chan struct{})
	go func() { _ = stale.Wait(); close(exited) }()
	pids := fmt.Sprintf("%d A\n%d B\n", stale.Process.Pid, other.Process.Pid)
	if err := os.WriteFile(filepath.Join(work, localcluster.PIDFile), []byte(pids), 0o644); err != nil {
		t.Fatal(err)
	}
	got := localcluster.StopStale(work)
	if len(got) != 1 || got[0] != stale.Process.Pid {
		t.Fatalf("stopStale stopped %v, want only %d", got, stale.Process.Pid)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the stale tier0d is still running")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("a process that is not tier0d was stopped: %v", err)
	}
}

func TestLocalClusterStopsWhatItStarted(t *testing.T) {
	work := t.TempDir()
	cfg := loadTestSite(t, work)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	lc := newLocalCluster(cfg, exe, "site.yaml", work, nil)
	lc.SetEnv("TIER0_VALIDATE_FAKE_TIER0D", "sleep")
	for _, n := range []string{"A", "B"} {
		if err := lc.start(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := lc.start("A"); err == nil {
		t.Error("starting a running node again succeeded")
	}
	b, err := os.ReadFile(filepath.Join(work, localcluster.PIDFile))
	if err != nil || strings.Count(string(b), "\n") != 2 {
		t.Fatalf("PID file %q (%v), want two lines", b, err)
	}
	if _, err := lc.kill("B"); err != nil {
		t.Fatal(err)
	}
	if err := lc.start("B"); err != nil {
		t.Fatalf("restart after kill: %v", err)
	}
	t0 := time.Now()
	lc.Stop(5 * time.Second)
	if d := time.Since(t0); d > 4*time.Second {
		t.Errorf("stopAll took %s; SIGTERM should end the fake at once", d)
	}
	for _, pid := range lc.PIDs() {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("pid %d still exists after stopAll", pid)
		}
	}
	if _, err := os.Stat(filepath.Join(work, localcluster.PIDFile)); !os.IsNotExist(err) {
		t.Errorf("PID file left after stopAll (%v)", err)
	}
}

func TestRunKeepsFilesWhenPortsAreBusy(t *testing.T) {
	work := filepath.Join(t.TempDir(), "work")
	cfg := loadTestSite(t, work)
	if err := localcluster.CheckPorts(cfg); err != nil {
		t.Skipf("test site's ports are not free on this host: %v", err)
	}
	n := &cfg.Nodes[0]
	l, err := net.Listen("tcp", n.ListenAddr(n.Frontend))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A cluster holding the ports may be running on these files.
	drive := absIn(n.Drives[0].Path)
	if err := os.MkdirAll(filepath.Dir(drive), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(drive, []byte("in use"), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	rep, err := Run(t.Context(), Options{Site: "testdata/site-5node.yaml", Local: true, WorkDir: work, Tier0d: exe, OutDir: t.TempDir()})
	if !errors.Is(err, ErrSetup) || !errors.Is(err, ErrPortBusy) || rep != nil {
		t.Fatalf("Run = %v, %v; want ErrSetup and ErrPortBusy, no report", rep, err)
	}
	if ExitCode(nil, err) != ExitSetup {
		t.Errorf("exit code %d, want %d", ExitCode(nil, err), ExitSetup)
	}
	if _, err := os.Stat(drive); err != nil {
		t.Errorf("drive file of a possibly running cluster removed: %v", err)
	}
}

func TestRunRefusesToOverwriteAClusterWithoutConsent(t *testing.T) {
	_, err := Run(t.Context(), Options{Site: "testdata/site-5node.yaml"})
	if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "--allow-writes") {
		t.Fatalf("Run without --local and --allow-writes = %v; want ErrSetup naming --allow-writes", err)
	}
}

// TestExitCodeNotValidated: a run whose failover story did not run may not
// exit 0 (the issue-17 regression: on an existing cluster it did), unless
// the failover was skipped on purpose (--skip-failover).
func TestExitCodeNotValidated(t *testing.T) {
	mk := func(reason string) *bench.Results {
		r := bench.NewResults("t", "s", time.Now(), bench.Environment{})
		r.AddCheck(CheckClusterUp, bench.Pass, "")
		for _, c := range []string{"failover: owned arrays moved complete", "killed node restarted"} {
			r.AddCheck(c, bench.NotRun, reason)
		}
		r.AddCheck(CheckFinalVerify, bench.Pass, "")
		return r
	}
	if got := ExitCode(mk("needs --local: on an existing cluster validate does not kill nodes"), nil); got != 3 {
		t.Errorf("failover not run: ExitCode = %d, want 3 (not validated)", got)
	}
	if got := ExitCode(mk("skipped (--skip-failover)"), nil); got != 0 {
		t.Errorf("failover skipped on purpose: ExitCode = %d, want 0", got)
	}
	r := mk("needs --local")
	r.AddCheck(CheckRaw, bench.Fail, "boom")
	if got := ExitCode(r, nil); got != 1 {
		t.Errorf("a failed check with the failover not run: ExitCode = %d, want 1 (failed wins)", got)
	}
}
