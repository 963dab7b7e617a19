package validate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tier0/internal/localcluster"
)

// TestClusterControlKillsAndRestartsTheLocalTier0d: without commands, the
// existing-cluster control finds the node's tier0d in /proc by --node,
// kills it, and starts it again with the same command line and
// environment.
func TestClusterControlKillsAndRestartsTheLocalTier0d(t *testing.T) {
	work := t.TempDir()
	cfg := loadTestSite(t, work)
	orig := startFakeTier0d(t, work, "B")
	other := startFakeTier0d(t, work, "C")
	for !localcluster.IsTier0d(orig.Process.Pid) || !localcluster.IsTier0d(other.Process.Pid) {
		time.Sleep(10 * time.Millisecond)
	}
	c := newClusterControl(cfg, "", "", filepath.Join(work, "logs"))
	// Only this test's fakes: other clusters may run on the machine.
	mine := func(argv []string) bool { return strings.HasPrefix(argv[0], work+"/") }
	c.match = mine
	if err := c.start("B"); err == nil || !strings.Contains(err.Error(), "--start-command") {
		t.Fatalf("start before any kill = %v; want an error naming --start-command", err)
	}
	if _, err := c.kill("B"); err != nil {
		t.Fatal(err)
	}
	if procAlive("/proc", orig.Process.Pid) {
		t.Fatalf("tier0d of B (pid %d) still runs after kill", orig.Process.Pid)
	}
	if !procAlive("/proc", other.Process.Pid) {
		t.Fatalf("tier0d of C was killed too")
	}
	if err := c.start("B"); err != nil {
		t.Fatal(err)
	}
	var img procImage
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if img, err = findTier0dProcMatching("/proc", "B", mine); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tier0d for B after the restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { _ = syscall.Kill(img.pid, syscall.SIGKILL) })
	if img.pid == orig.Process.Pid || argNode(img.argv) != "B" {
		t.Errorf("restarted process %+v, want a new pid with --node B", img)
	}
	env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", img.pid))
	if !strings.Contains(string(env), "TIER0_VALIDATE_FAKE_TIER0D=sleep") {
		t.Errorf("restarted tier0d lost its environment")
	}
}

func TestClusterControlCommands(t *testing.T) {
	work := t.TempDir()
	cfg := loadTestSite(t, work)
	out := filepath.Join(work, "ran")
	c := newClusterControl(cfg, `echo "kill $TIER0_NODE $TIER0_NODE_ADDR" >> `+out, `echo "start $TIER0_NODE" >> `+out, work)
	if _, err := c.kill("D"); err != nil {
		t.Fatal(err)
	}
	if err := c.start("D"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(out)
	if string(b) != "kill D 127.0.0.1\nstart D\n" {
		t.Errorf("commands ran as %q", b)
	}
	c.killCmd = "echo no such host >&2; exit 7"
	if _, err := c.kill("D"); err == nil || !strings.Contains(err.Error(), "no such host") {
		t.Errorf("failing --kill-command = %v; want its output in the error", err)
	}
}

func TestArgNode(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"tier0d", "--site", "s.yaml", "--node", "B"}, "B"},
		{[]string{"tier0d", "--node=C"}, "C"},
		{[]string{"tier0d", "--site", "x"}, ""},
	} {
		if got := argNode(tc.argv); got != tc.want {
			t.Errorf("argNode(%q) = %q, want %q", tc.argv, got, tc.want)
		}
	}
}
