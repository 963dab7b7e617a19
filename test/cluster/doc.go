// Package cluster holds end-to-end checks of a whole local tier0 cluster
// (five tier0d processes on 127.0.0.1 from testdata/local5.yaml, started by
// validate.StartLocalCluster) through an owner's failure:
//
//   - TestLinuxHostFailover: the Linux kernel's NVMe/TCP host in a QEMU
//     guest (test/vm), connected to all five frontends, runs fio verify
//     while the owner of the array is killed with SIGKILL; fio must finish
//     without an I/O error and the sysfs ANA states must follow the owner.
//   - TestXFSThroughFailover: `tier0 validate --local`'s "file system
//     through failover" check (validate.LocalCluster.FSThroughFailover):
//     XFS in the guest on array B's multipath device, a verified file
//     workload through the kill of B, takeover, restart and failback, then
//     xfs_repair -n clean.
//   - TestArrayOnline: pools online (issue 16) on four tier0d processes of
//     testdata/online4.yaml, driven only by the tier0 CLI through the
//     token-checked API: `tier0 array create` on free drives, a volume
//     written and verified with `tier0 fabric io` through a kill -9 of the
//     owner, `tier0 array delete` refused then forced with a member's node
//     down (its drive stays taken until it returns and wipes it), and the
//     same drives taken again by a new pool (docs/VOLUMES.md).
//   - TestArrayOnlineEmptySite: testdata/empty4.yaml has no arrays; a pool
//     and a volume are provisioned online and written and verified, as
//     docs/OPERATIONS.md shows.
//   - BenchmarkFailover: tier0's own multipath host over the five frontends;
//     kill → first completed I/O on the moved array over several trials, and
//     the longest stall of an array that did not move (scripts/bench.d/failover.sh).
//
// See docs/FAILOVER.md.
package cluster
