package cluster

import "testing"

// TestFailedArrayWithReplacedDrive: a failed array whose missing member is a
// replaced drive (it never "comes back" as a node does) must not stay
// failed forever once every node is up (seeds found by the random runs).
func TestFailedArrayWithReplacedDriveConverges(t *testing.T) {
	for _, seed := range []uint64{1093, 1521} {
		randomRun(t, seed, 80)
	}
}
