#!/usr/bin/env bash
# Local block device vs fio on the same O_DIRECT file, in the same run, at
# the same queue depth: 1 MiB sequential and 4 KiB random, read and write.
# Prints the Go benchmark lines (benchstat-compatible) and one ratio line
# per workload (tier0 / fio; goal >= 0.9), with the CPU time per I/O of
# each (fio/tier0 >= 1 means tier0 costs no more CPU than fio) and tier0's
# io_submit calls per I/O (batched submission: below 1 under load).
#   TIER0_BENCH_DIR          directory of the 256 MiB test file (/var/tmp)
#   TIER0_BENCH_FIO_RUNTIME  fio run time per workload (3s)
#   TIER0_BENCH_TIME         Go -benchtime per workload (3s)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench '^BenchmarkLocal$' -benchtime "${TIER0_BENCH_TIME:-3s}" -count 1 \
  ./daemon/blockdev/local | tee "$out"
awk '/^BenchmarkLocal\// {
  name = $1; sub(/^BenchmarkLocal\//, "", name); sub(/-[0-9]+$/, "", name)
  ratio = ""; cpu = ""; fcpu = ""; subm = ""
  for (i = 2; i < NF; i++) {
    if ($(i+1) == "ratio") ratio = $i
    if ($(i+1) == "cpu-us/io") cpu = $i
    if ($(i+1) == "fio-cpu-us/io") fcpu = $i
    if ($(i+1) == "submits/io") subm = $i
  }
  if (ratio == "") { printf "blockdev %-14s ratio n/a (no fio baseline)\n", name; next }
  extra = ""
  if (cpu != "" && fcpu != "") extra = sprintf("; CPU %.1f us/io, fio %.1f (fio/tier0 = %.2f)", cpu, fcpu, fcpu / cpu)
  if (subm != "") extra = extra sprintf("; %.2f io_submit/io", subm)
  printf "blockdev %-14s tier0/fio = %.2f (goal >= 0.90)%s%s\n", name, ratio, (ratio >= 0.9 ? "" : "  BELOW GOAL"), extra
}' "$out"
