package campaign

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildTier0d builds the daemon from this module into a new temporary
// directory and returns its path: the campaigns' and the nemesis's tests
// run the binary of the tree under test.
func BuildTier0d(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "tier0d")
	cmd := exec.Command("go", "build", "-o", bin, "tier0/cmd/tier0d")
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build tier0/cmd/tier0d: %v\n%s", err, out)
	}
	return bin, nil
}
