#!/usr/bin/env bash
# member-death: BenchmarkMemberDeath in daemon/node. A RAID-5 array of four
# members, each a memory namespace behind its own tier0 target on loopback,
# with the daemon's member options and raid policy; 4 KiB random reads and
# writes from eight goroutines, and one member's target closed mid-run (its
# node died). Reports the longest I/O after the death beside the healthy
# phase's longest I/O of the same run (the machine's own stalls) and the
# goal (<= 100 ms, issue 15), for the daemon's behaviour and for the one
# before issue 15 ("before": no SlowRead, member I/O waits for the reconnect).
#   TIER0_BENCH_COUNT  repetitions (default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench '^BenchmarkMemberDeath$' -benchtime 1x -count "${TIER0_BENCH_COUNT:-3}" -timeout 10m \
  ./daemon/node | tee "$out"
awk '/^BenchmarkMemberDeath\// {
  name = $1; sub(/^BenchmarkMemberDeath\//, "", name); sub(/-[0-9]+$/, "", name)
  for (i = 3; i < NF; i++) {
    if ($(i+1) == "death-max-stall-ms") d = $i
    if ($(i+1) == "healthy-max-ms") h = $i
  }
  printf "member-death %-7s longest stall after a member died %.1f ms (healthy phase, same run: %.1f ms; goal <= 100 ms)%s\n",
    name, d, h, (name != "daemon" || d <= 100 ? "" : "  ABOVE GOAL")
}' "$out"
