#!/usr/bin/env bash
# RAID engine: each benchmark measures a baseline on the same members in the
# same run and reports "ratio" metrics (Go benchmark format, benchstat-
# compatible); members in memory (engine overhead) and as O_DIRECT files.
# A summary line per ratio follows, with its goal:
#   SeqRead    1 MiB reads / aggregate member reads            (>= 0.95)
#   SeqWrite   full-stripe writes / (data fraction x member writes) (>= 0.85)
#   RandWrite4K  4 KiB random writes / (member IOPS / 4 or / 6) (>= 0.80)
#   Degraded   degraded / healthy: seq (>= 0.75), 4 KiB random (>= 0.80)
#   Encode     parity encode / reedsolomon directly, per core   (>= 0.90)
#   Rebuild    MB/s alone and under load, foreground retained fraction
# SeqRead, SeqWrite (RAID-5) and RandWrite4K also run as ".../timed", with
# the daemon's member deadlines (IOTimeout 5 s, SlowRead 20 ms), printed
# after the same benchmark without them, with the same goals.
#   TIER0_BENCH_DIR   directory of the O_DIRECT member files (/var/tmp)
#   TIER0_BENCH_RAID  -bench pattern (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
go test -run '^$' -bench "${TIER0_BENCH_RAID:-.}" -benchtime 1x -count 1 -timeout 30m \
  ./daemon/raid | tee "$out"
awk '
function goal(name, metric) {
  if (name ~ /^SeqRead/) return 0.95
  if (name ~ /^SeqWrite/) return 0.85
  if (name ~ /^RandWrite4K/ && name !~ /nolog/) return 0.80
  if (name ~ /^Degraded/ && metric == "seq-ratio") return 0.75
  if (name ~ /^Degraded/ && metric == "4k-ratio") return 0.80
  if (name ~ /^Encode/) return 0.90
  return 0
}
/^Benchmark/ {
  name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
  for (i = 3; i < NF; i++) {
    m = $(i+1)
    if (m ~ /ratio$/ ) {
      g = goal(name, m)
      if (g > 0) printf "raid %-32s %-10s %.2f (goal >= %.2f)%s\n", name, m, $i, g, ($i >= g ? "" : "  BELOW GOAL")
      else printf "raid %-32s %-10s %.2f\n", name, m, $i
    }
    if (m == "fg-retained" || m == "rebuild-MB/s" || m == "rebuild-loaded-MB/s")
      printf "raid %-32s %-20s %.2f\n", name, m, $i
  }
}' "$out"
