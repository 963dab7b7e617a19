package validate

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFSGuestScript: the guest script of the file system check is valid
// shell with every frontend and the array's NQN in it, and its reasons
// are formatted (a missing Sprintf argument reads %!s(MISSING)).
func TestFSGuestScript(t *testing.T) {
	s := fsGuestScript("nqn.2026-11.io.tier0:array-b", []int{16421, 16431, 16441})
	if strings.Contains(s, "%!") {
		t.Fatalf("badly formatted guest script:\n%s", s)
	}
	for _, want := range []string{"for p in 16421 16431 16441; do", "-n nqn.2026-11.io.tier0:array-b --ctrl-loss-tmo=-1", "fail 11 \"" + noXFSWhy, "xfs_repair -n /dev/nvme0n1", "printf 'rounds %s\\nheld %s\\nsums %s\\n'"} {
		if !strings.Contains(s, want) {
			t.Errorf("guest script lacks %q", want)
		}
	}
	out, err := exec.Command("sh", "-n", "-c", s).CombinedOutput()
	if err != nil {
		t.Errorf("sh -n: %v: %s", err, out)
	}
}
