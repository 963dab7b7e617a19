package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissing runs Missing in a child test process with and without CI=true
// and checks that it skips on a developer's machine and fails in CI.
func TestMissing(t *testing.T) {
	if os.Getenv("TIER0_TESTENV_CHILD") == "1" {
		Missing(t, "a thing this test needs")
		t.Fatal("Missing returned")
	}
	for _, c := range []struct {
		ci       string
		wantFail bool
		want     string
	}{
		{"", false, "--- SKIP: TestMissing"},
		{"true", true, "required in CI (CI=true) but missing: a thing this test needs"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissing$", "-test.v")
		cmd.Env = append(os.Environ(), "TIER0_TESTENV_CHILD=1", "CI="+c.ci, "TIER0_REQUIRE_ALL=")
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.wantFail {
			t.Errorf("CI=%q: exit error %v, want failure %v; output:\n%s", c.ci, err, c.wantFail, out)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("CI=%q: output lacks %q:\n%s", c.ci, c.want, out)
		}
	}
}

func TestFreePortOutsideEphemeralRangeAndUnique(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		if p < portLo || p > portHi {
			t.Fatalf("FreePort returned %d, want a port in %d–%d (outside the ephemeral range)", p, portLo, portHi)
		}
		if seen[p] {
			t.Fatalf("FreePort returned %d twice in one process", p)
		}
		seen[p] = true
	}
}

func TestFreePortSkipsBoundPorts(t *testing.T) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	bound := map[int]bool{}
	for p := portLo; p < portLo+50; p++ {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			held = append(held, l)
			bound[p] = true
		}
	}
	for range 300 {
		if p := FreePort(t); bound[p] {
			t.Fatalf("FreePort returned %d, which this test holds bound", p)
		}
	}
}
