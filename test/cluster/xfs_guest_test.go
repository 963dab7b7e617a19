package cluster

import (
	"context"
	"strings"
	"testing"

	"tier0/bench"
	"tier0/internal/testenv"
	"tier0/test/vm"
)

// TestXFSThroughFailover is the seed's file-system claim on tier0, run as
// `tier0 validate --local` runs its "file system through failover" check
// (validate.LocalCluster.FSThroughFailover): in a Linux guest, XFS on the
// kernel's multipath device of array B over all five frontends, a file
// workload with verification (fio crc32c on files, md5-summed files
// re-read from the device) running while B's owner is killed with
// SIGKILL, B taken over, restarted and failed back home. The file system
// must stay mounted with no XFS or I/O error, every file must verify, the
// kernel must have held I/O for want of a path (else the workload was
// idle and nothing was proved), `xfs_repair -n` must find nothing after
// umount, and the files must still verify after a remount.
func TestXFSThroughFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest and a five-node cluster (a few minutes); not in -short")
	}
	vm.Image(t) // skips with the reason when no guest can run here (fails in CI)
	c, _ := startCluster(t)
	var log strings.Builder
	check := c.FSThroughFailover(context.Background(), "B", &log)
	t.Logf("%s: %s: %s", check.Name, check.Status, check.Reason)
	switch check.Status {
	case bench.NotRun:
		testenv.Missing(t, "file system through failover not run: %s", check.Reason)
	case bench.Fail:
		t.Fatalf("file system through failover failed: %s\n%s", check.Reason, log.String())
	}
	for _, want := range []string{"XFS on array B's multipath device (5 paths)", "through kill -9 of B", "xfs_repair -n clean", "files intact after a remount"} {
		if !strings.Contains(check.Reason, want) {
			t.Errorf("check reason %q lacks %q", check.Reason, want)
		}
	}
}
