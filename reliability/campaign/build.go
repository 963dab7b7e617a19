package campaign

import (
	"os"

	"tier0/internal/gobuild"
)

// BuildTier0d builds the daemon from this module into a new temporary
// directory and returns its path: the campaigns' and the nemesis's tests
// run the binary of the tree under test.
func BuildTier0d(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	paths, err := gobuild.BuildBinaries(dir, "tier0d")
	if err != nil {
		return "", err
	}
	return paths[0], nil
}
