// Package bench measures block devices and records what it measured.
//
// The load generator (Run, Start; gen_config.go, gen.go, gen_worker.go)
// drives any blockdev.Device with sequential or random reads and writes at
// a queue depth, keeps latency Histograms and a time series of throughput
// and latency per interval, and in verify mode writes self-describing blocks (verify.go) so that a
// later read can tell a lost, stale, misplaced or torn write from a good
// one. Marks (Handle.Mark) time a failover: on each target, when the first
// I/O issued after the mark completed.
//
// The standard Scenarios (scenario.go) are the sequential 1 MiB and random
// 4 KiB workloads of the validation; fio.go runs the same ones through fio
// for the frontends. Results (results.go) is the tier0.bench/v1 document a
// bench or validate run writes and package reports renders; spread.go
// combines repeated runs into a median and range, env.go, cpus.go and
// cpuacct.go record the machine and the CPU spent.
package bench
