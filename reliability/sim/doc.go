// Package sim runs tier0d's action executor — N daemon/node nodes — in one
// process, over an in-memory store (daemon/store/memstore), an in-memory
// backend fabric with reservations and injectable faults (Fabric), memory
// drives and one fake clock, under a seeded schedule of overlapping
// faults: kills and restarts, freezes, partitions from the store, fabric
// link cuts, drive failures. A workload reads and writes the array through
// whichever node's frontend path is ANA optimized, as a multipath host
// would; its history is checked for linearizability (reliability/history),
// and the fabric checks that a member's reservation key (the owner's
// epoch) never goes back. A run of one seed takes milliseconds of real
// time for tens of seconds of cluster time.
//
// The simulation is the coordinator (a cluster.Machine fed from the
// store's leases and the nodes' reports, as daemon/node's coordinate
// does), the task queues and every node's lease keep-alive. It performs
// everything from one goroutine, in an order drawn from the seed: the
// tasks, renewals and self-fencing of the nodes, the workload, the
// faults. What is not under the seed: goroutines the nodes start
// themselves (RAID resync and rebuild, background reports), which run
// concurrently; the simulation waits for the reports before each
// coordinator step. docs/RELIABILITY.md ("Simulation") says what that
// leaves nondeterministic.
package sim
