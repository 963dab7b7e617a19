// Package campaign runs bounded, self-stopping fault campaigns against a
// real local cluster of tier0d processes while the acknowledged-write
// checker (package reliability/checker) writes to every array through the
// host's ANA multipath, then verifies every block.
//
// A campaign starts the cluster from a site file, waits until every array
// is active and optimal, starts the workload, and injects faults one after
// another: kill -9 of an array's owner mid-write, kill -9 of a random node
// or of two at once (RAID-6), SIGSTOP of an owner long enough for the
// cluster to replace it followed by SIGCONT (a frozen node whose late
// writes the backend reservations must refuse), kill -9 of an owner while
// it resyncs a returned member, loss of an etcd peer, and a member drive
// failed and replaced through the API. After each fault is healed (nodes
// restarted or thawed) every array must be back active and optimal within
// a bound. At the end the workload stops and every block is verified.
//
// The result counts writes acknowledged, units verified, lost, stale and
// corrupt (all three must be 0), and arrays stuck (must be 0).
package campaign
