#!/usr/bin/env bash
# failover: BenchmarkFailover in test/cluster. A five-node local cluster
# (test/cluster/testdata/local5.yaml, ports 16379-16484); tier0's multipath
# host runs 4 KiB write+read-back I/O on array B and array D while node B
# (B's owner) is killed with SIGKILL, restarted and failed back, over
# TIER0_FAILOVER_TRIALS trials (default 10, about 17 s each). Go benchmark
# format (custom metrics, seconds); a per-trial table and the distribution
# of kill -> first completed I/O on B precede it. Goal: worst <= 5 s.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench '^BenchmarkFailover$' -benchtime 1x -count 1 -timeout 30m \
  ./test/cluster | tee "$out"
awk '/^BenchmarkFailover/ {
  for (i = 3; i < NF; i++) if ($(i+1) == "kill-io-max-s")
    printf "failover kill->first I/O worst %.2f s (goal <= 5.00)%s\n", $i, ($i <= 5 ? "" : "  ABOVE GOAL")
}' "$out"
