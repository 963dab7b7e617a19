// Package nemesis runs seeded schedules of overlapping faults against a
// real local cluster of tier0d processes while the checker
// (reliability/checker) reads and writes every array through the host's
// ANA multipath, and then checks the recorded history for linearizability
// (reliability/history).
//
// A schedule is 1–3 faults with random starts and durations inside a
// window, drawn from a seed: the same seed, kinds and site give the same
// schedule (Generate), printed before the run, so any failing run replays.
// Fault kinds are at every layer:
//
//   - process: kill -9 and restart; SIGSTOP/SIGCONT for durations below,
//     around and above the lease TTL; restart storms;
//   - network, per link, through toxiproxy proxies that the site's
//     advertised addresses point at: latency with jitter, bandwidth caps,
//     a stall with no RST (data vanishes), connection resets, one-way
//     stalls, and asymmetric partitions (every link into a node stalls
//     while its own connections out keep working);
//   - disk: power loss (kill -9 with every write not flushed or FUA lost,
//     via blockdev.PowerCut in the node, TIER0_NEMESIS_POWERCUT=1);
//   - operations during faults: drain/undrain (arrays move away and fail
//     back), drive fail and replace, through the API.
//
// Faults that take a node out (process faults, power loss, stalls, resets,
// partitions) hit at most as many distinct nodes at once as every array's
// parity and the etcd quorum tolerate; latency and bandwidth faults may
// hit any link. After the window every fault is healed, the cluster must
// come back active and optimal, the workload runs on, every unit is
// verified and the history checked.
package nemesis
