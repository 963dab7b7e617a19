#!/usr/bin/env bash
# make bench: Go benchmarks of every layer (ratios against baselines measured
# in the same run), plus the comparisons that need external tools.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in scripts/bench.d/*.sh; do
  [ -e "$f" ] || continue
  echo "== $f"
  bash "$f"
done
