// Package perf is a closed-loop block I/O benchmark over any
// blockdev.Device: a fixed number of I/Os in flight (one per worker
// goroutine), one workload (random or sequential, read or write, one block
// size), for a time or an I/O count. It reports IOPS, bandwidth, latency
// percentiles and the process's CPU time per I/O (getrusage), which is the
// figure to compare on a shared machine: rates move with the load of other
// processes, CPU time per I/O much less.
//
// `tier0 fabric perf` runs it over tier0's NVMe/TCP host against any
// target (tier0's, Linux nvmet, SPDK); the benchmarks of the layers run it
// over their devices.
package perf
