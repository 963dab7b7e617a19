#!/usr/bin/env bash
# perf: tier0's NVMe/TCP target's CPU time per I/O and per MiB (memory
# namespace, one core: GOMAXPROCS=1, in a child process) against a bare
# NVMe/TCP responder in raw blocking system calls (one read of all that
# arrived, one writev of all answers, no Go runtime on the path), moving
# the same PDUs for the same client in the same run (bench/perf
# BenchmarkTargetCPU). CPU time per I/O is the figure to compare on a
# loaded machine; the IOPS metrics are for reference only. Goals mirror
# issue 15's against SPDK: bare/target >= 0.5 at 4 KiB, >= 0.9 at 128 KiB.
#   TIER0_BENCH_PERF_N   I/Os per workload (-benchtime Nx, default 50000)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench '^BenchmarkTargetCPU$' -benchtime "${TIER0_BENCH_PERF_N:-50000}x" -count 1 -timeout 20m \
  ./bench/perf | tee "$out"
awk '/^BenchmarkTargetCPU\// {
  name = $1; sub(/^BenchmarkTargetCPU\//, "", name); sub(/-[0-9]+$/, "", name)
  for (i = 2; i < NF; i++) m[$(i+1)] = $i
  goal = (name ~ /-4k-/) ? 0.5 : 0.9
  printf "perf %-16s target %6.2f us/io %7.1f us/MiB %5.2f rw-calls/io | bare %6.2f us/io %7.1f us/MiB %5.2f rw-calls/io | bare/target = %.2f (goal >= %.2f)%s\n",
    name, m["target-cpu-us/io"], m["target-cpu-us/MiB"], m["target-rw-calls/io"],
    m["bare-cpu-us/io"], m["bare-cpu-us/MiB"], m["bare-rw-calls/io"], m["cpu-ratio"], goal, (m["cpu-ratio"] >= goal ? "" : "  BELOW GOAL")
}' "$out"
