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
//   - BenchmarkFailover: tier0's own multipath host over the five frontends;
//     kill → first completed I/O on the moved array over several trials, and
//     the longest stall of an array that did not move (scripts/bench.d/failover.sh).
//
// See docs/FAILOVER.md.
package cluster
