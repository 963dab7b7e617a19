// Package frontend is an in-process nemesis of the frontend path: tier0's
// NVMe/TCP host (one controller, or a multipath device over two paths)
// writes through toxiproxy proxies on loopback to tier0's targets, one per
// path (each an owner of the same namespace over the same memory), while a
// seeded schedule slows one path's device down (an owner whose member
// answers late, so commands queue behind it) and resets the host's connections
// (every connection of a path closed at once, new ones refused for a
// moment). Every read and write is recorded and
// the history is checked for linearizability (reliability/history), and a
// final read of every unit is checked against the acknowledged writes
// (reliability/checker).
//
// It is the machine that finds issue 12's hole 2: a command of a dead
// connection (queued behind the slow device, or executing in it) that
// lands after the host already resubmitted it on a new association and
// the application then rewrote the same block, acknowledged. Each seed
// runs in about a second plus the host's quiesce wait per reset, so many
// seeds run in `make test` (TestFrontendSeeds); the real-process nemesis
// (reliability/nemesis) stays the proof through a whole cluster.
package frontend
