#!/usr/bin/env bash
# make soak: the long form of the reliability campaigns (docs/RELIABILITY.md).
# Random faults (owner kills, freezes past the lease, restarts during
# resync, etcd peer loss, drive failures; two-node kills on RAID-6) under a
# checked write workload, on the seed's 5-node RAID-5 topology and on a
# 6-node RAID-6 site, each for SOAK_DURATION (default 20m). Every block is
# verified at the end; the script fails on any lost, stale or corrupt block
# or stuck array.
#
#   SOAK_DURATION=1h SOAK_SEED=42 make soak
#   SOAK_SITES="site-configs/local-5node.yaml" ./scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DURATION=${SOAK_DURATION:-20m}
SEED=${SOAK_SEED:-$(date +%s)}
SITES=${SOAK_SITES:-"site-configs/local-5node.yaml reliability/campaign/testdata/raid6-6node.yaml"}
OUT=${SOAK_OUT:-tier0-soak}
[ -x "$BIN/tier0" ] && [ -x "$BIN/tier0d" ] || { echo "soak: $BIN/tier0 and $BIN/tier0d missing; run make build" >&2; exit 2; }
mkdir -p "$OUT"
status=0
for site in $SITES; do
  name=$(basename "$site" .yaml)
  echo "== soak $site for $DURATION, seed $SEED"
  rm -rf "${OUT:?}/$name"
  if "$BIN/tier0" campaign --site "$site" --local --duration "$DURATION" --seed "$SEED" \
      --workdir "$OUT/$name" --keep --json > "$OUT/$name.json" 2> "$OUT/$name.log"; then
    echo "   passed ($OUT/$name.json)"
  else
    rc=$?
    echo "   FAILED (exit $rc): see $OUT/$name.log, $OUT/$name.json and node logs in $OUT/$name/" >&2
    tail -20 "$OUT/$name.log" >&2 || true
    status=1
  fi
done
exit $status
