#!/usr/bin/env bash
# Control plane: failover decisions of the pure state machine on a 64-node,
# 64-array RAID-6 cluster in 8 racks (one node lost, a whole rack lost,
# a steady tick), and the etcd store's operations on one embedded member
# (plain put = baseline; claim, event append and enqueue as ratios to it).
# Go benchmark format, comparable with benchstat.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench . -benchtime "${TIER0_BENCH_CLUSTER_N:-50x}" -count 1 ./daemon/cluster | tee "$out"
go test -run '^$' -bench . -benchtime "${TIER0_BENCH_STORE_N:-500x}" -count 1 ./daemon/store 2>/dev/null | tee -a "$out"
awk '
/^BenchmarkTick64/      { tick = $3 }
/^BenchmarkNodeLoss64/  { node = $3 }
/^BenchmarkRackLoss64/  { rack = $3 }
/^BenchmarkStore\/put/  { put = $3 }
/^BenchmarkStore\/claim/   { claim = $3 }
/^BenchmarkStore\/event/   { ev = $3 }
/^BenchmarkStore\/enqueue/ { enq = $3 }
END {
  if (tick > 0) {
    printf "cluster node-loss decision / steady tick = %.2f; as share of a 1 s tick: %.3f%%\n", node / tick, node / 1e7
    printf "cluster rack-loss decision / steady tick = %.2f; as share of a 1 s tick: %.3f%%\n", rack / tick, rack / 1e7
  }
  if (put > 0) printf "store claim/put = %.2f  event/put = %.2f  enqueue/put = %.2f\n", claim / put, ev / put, enq / put
}' "$out"
