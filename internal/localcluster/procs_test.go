package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeTier0d writes a stand-in for tier0d: it runs until SIGTERM, except
// nodes named "stubborn*", which ignore SIGTERM (only SIGKILL stops them).
func fakeTier0d(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tier0d")
	script := `#!/bin/sh
case "$4" in stubborn*) trap '' TERM;; *) trap 'exit 0' TERM;; esac
while :; do sleep 0.05; done
`
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// procState is the state letter of /proc/PID/stat (R, S, T...) once it
// is (stopped) or is not (!stopped) T, or as it is after 10 s: a signal
// takes effect when the kernel delivers it, not when kill returns.
func procState(t *testing.T, pid int, stopped bool) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		st := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
		if (st == "T") == stopped || time.Now().After(deadline) {
			return st
		}
	}
}

// TestProcs: a node starts once, its log and the PID file are written, a
// kill -9 reaps it and it restarts, a frozen node is stopped (T) until
// thawed, and Stop ends every process, frozen ones and ones that ignore
// SIGTERM included, and removes the PID file.
func TestProcs(t *testing.T) {
	work := t.TempDir()
	var started []string
	ps := New(Options{Binary: fakeTier0d(t), Site: "site.yaml", Workdir: work, LogDir: filepath.Join(work, "logs"),
		Args: []string{"--log-level", "info"}, PIDFile: filepath.Join(work, PIDFile)})
	ps.OnStart(func(node string, pid int) { started = append(started, node) })
	ps.SetEnv("X", "1")
	ps.SetEnv("X", "2")
	if env := ps.Env(); !slices.Contains(env, "X=2") || slices.Contains(env, "X=1") || !slices.Contains(env, "TIER0_WORK="+work) {
		t.Errorf("environment %v: want X=2 once and TIER0_WORK", env[len(env)-3:])
	}
	for _, n := range []string{"A", "stubborn1", "stubborn2"} {
		if err := ps.Start(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := ps.Start("A"); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("starting a running node again: %v, want an error saying it runs", err)
	}
	if b, err := os.ReadFile(filepath.Join(work, PIDFile)); err != nil || strings.Count(string(b), "\n") != 3 {
		t.Errorf("PID file %q (%v), want three lines", b, err)
	}
	if _, err := os.Stat(ps.LogPath("A")); err != nil || filepath.Dir(ps.LogPath("A")) != filepath.Join(work, "logs") {
		t.Errorf("log of A at %s: %v", ps.LogPath("A"), err)
	}

	if _, err := ps.Kill("A"); err != nil {
		t.Fatal(err)
	}
	if ps.Running("A") || len(ps.Exited()) != 1 || !strings.HasPrefix(ps.Exited()[0], "A (") {
		t.Errorf("after kill -9: running %v, exited %v; want A exited", ps.Running("A"), ps.Exited())
	}
	if _, err := ps.Kill("A"); err == nil {
		t.Error("killing a node that is not running succeeded")
	}
	if err := ps.Start("A"); err != nil {
		t.Fatalf("restart after kill: %v", err)
	}
	pids := ps.PIDs()
	if len(pids) != 4 || !slices.Equal(started, []string{"A", "stubborn1", "stubborn2", "A"}) {
		t.Errorf("PIDs %v, OnStart saw %v: want 4 starts, A twice", pids, started)
	}

	if err := ps.Freeze("A"); err != nil {
		t.Fatal(err)
	}
	a := pids[3]
	if st := procState(t, a, true); st != "T" || !ps.Frozen("A") || !ps.Running("A") {
		t.Errorf("frozen A: state %s, Frozen %v, Running %v; want T, true, true", st, ps.Frozen("A"), ps.Running("A"))
	}
	if err := ps.Thaw("A"); err != nil {
		t.Fatal(err)
	}
	if st := procState(t, a, false); st == "T" || ps.Frozen("A") {
		t.Errorf("thawed A: state %s, Frozen %v", st, ps.Frozen("A"))
	}
	if err := ps.Freeze("A"); err != nil {
		t.Fatal(err)
	}

	stopped := make(chan struct{})
	go func() { ps.Stop(100 * time.Millisecond); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(60 * time.Second):
		t.Fatal("Stop did not return in 60 s: a process that ignores SIGTERM was not killed after the grace")
	}
	for _, n := range []string{"A", "stubborn1", "stubborn2"} {
		if ps.Running(n) {
			t.Errorf("node %s still runs after Stop", n)
		}
	}
	if _, err := os.Stat(filepath.Join(work, PIDFile)); !os.IsNotExist(err) {
		t.Errorf("PID file after Stop: %v, want it removed", err)
	}
}
