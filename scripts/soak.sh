#!/usr/bin/env bash
# make soak: the long form of the reliability campaigns and of the nemesis
# (docs/RELIABILITY.md). On each site, for DURATION each:
#   - the nemesis: seeded schedules of 1-3 overlapping faults (process,
#     network through toxiproxy, power loss, drain and drive operations),
#     every read and write checked for linearizability; seeds SEED, SEED+1,
#     ... (a failing run replays with `tier0 campaign --nemesis KINDS
#     --seed N --runs 1`);
#   - the campaign: random single faults (owner kills, freezes past the
#     lease, restarts during resync, etcd peer loss, drive failures;
#     two-node kills on RAID-6) under a checked write workload.
# The script fails on any anomaly, lost, stale or corrupt block, or stuck
# array.
#
#   DURATION=1h SEED=42 make soak
#   SOAK_KINDS=nemesis NEMESIS=process,network DURATION=30m ./scripts/soak.sh
#   SOAK_SITES="site-configs/local-5node.yaml" ./scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DURATION=${DURATION:-${SOAK_DURATION:-20m}}
SEED=${SEED:-${SOAK_SEED:-$(date +%s)}}
SITES=${SOAK_SITES:-"site-configs/local-5node.yaml reliability/campaign/testdata/raid6-6node.yaml"}
KINDS=${SOAK_KINDS:-"nemesis campaign"}
NEMESIS=${NEMESIS:-all}
WINDOW=${WINDOW:-20s}
OUT=${SOAK_OUT:-tier0-soak}
[ -x "$BIN/tier0" ] && [ -x "$BIN/tier0d" ] || { echo "soak: $BIN/tier0 and $BIN/tier0d missing; run make build" >&2; exit 2; }
mkdir -p "$OUT"
status=0
for site in $SITES; do
  for kind in $KINDS; do
    name=$(basename "$site" .yaml)-$kind
    echo "== soak: $kind on $site for $DURATION, seed $SEED"
    rm -rf "${OUT:?}/$name"
    args=(campaign --site "$site" --local --duration "$DURATION" --seed "$SEED" --workdir "$OUT/$name" --keep --json)
    if [ "$kind" = nemesis ]; then
      args+=(--nemesis "$NEMESIS" --window "$WINDOW" --past-stuck)
    fi
    if "$BIN/tier0" "${args[@]}" > "$OUT/$name.json" 2> "$OUT/$name.log"; then
      echo "   passed ($OUT/$name.json)"
    else
      rc=$?
      echo "   FAILED (exit $rc): see $OUT/$name.log, $OUT/$name.json and node logs in $OUT/$name/" >&2
      tail -20 "$OUT/$name.log" >&2 || true
      status=1
    fi
    grep -E '^run [0-9]+ seed' "$OUT/$name.log" | tail -3 || true
  done
done
exit $status
