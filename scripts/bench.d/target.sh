#!/usr/bin/env bash
# tier0 NVMe/TCP target's cost per I/O (raw in-process client, one I/O queue,
# queue depth 16, memory namespace) versus a bare TCP server moving the same
# bytes per I/O in the same run. Go benchmark lines (benchstat-compatible)
# plus one ratio line per workload (bare time / target time; 1.0 = free).
#   TIER0_BENCH_TARGET_N   I/Os per workload (-benchtime Nx, default 20000)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench '^BenchmarkTarget$' -benchtime "${TIER0_BENCH_TARGET_N:-20000}x" -count 1 \
  ./daemon/target | tee "$out"
awk '/^BenchmarkTarget\// {
  name = $1; sub(/^BenchmarkTarget\//, "", name); sub(/-[0-9]+$/, "", name)
  ratio = ""
  for (i = 2; i < NF; i++) if ($(i+1) == "ratio") ratio = $i
  printf "target %-12s bare-tcp/target = %.2f\n", name, ratio
}' "$out"
