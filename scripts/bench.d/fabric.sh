#!/usr/bin/env bash
# tier0 NVMe/TCP host -> tier0 target over loopback (memory namespace) versus
# a bare TCP baseline in the same run: same connections, payload sizes, queue
# depth and memory device behind the server, no NVMe framing. Prints the Go
# benchmark lines (benchstat-compatible) and one ratio line per workload.
#   TIER0_BENCH_COUNT   iterations per workload (-benchtime Nx, default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench '^BenchmarkFabric$' -benchtime "${TIER0_BENCH_COUNT:-3}x" -count 1 \
  ./test/fabric | tee "$out"
awk '/^BenchmarkFabric\// {
  name = $1; sub(/^BenchmarkFabric\//, "", name); sub(/-[0-9]+$/, "", name)
  ratio = ""; allocs = ""
  for (i = 2; i < NF; i++) { if ($(i+1) == "ratio") ratio = $i; if ($(i+1) == "allocs/io") allocs = $i }
  goal = (name ~ /^randread-4k/) ? 0.5 : 0.7
  printf "fabric %-18s nvme/tcp = %.2f (goal >= %.2f)%s, %s allocs/io\n", name, ratio, goal, (ratio >= goal ? "" : "  BELOW GOAL"), allocs
}' "$out"
