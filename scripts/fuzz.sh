#!/usr/bin/env bash
# A bounded fuzzing run of every Go fuzz target (network parsers, the
# target's command dispatcher, the site-config loader, ...), on top of the
# checked-in corpora that plain `go test` already replays.
#   FUZZTIME   time per target (default 2s)
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-2s}
n=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  grep -lq '^func Fuzz' "$dir"/*_test.go 2>/dev/null || continue
  for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go | sed 's/^func //' | sort -u); do
    go test -run '^$' -fuzz "^${f}\$" -fuzztime "$t" "$pkg" >/tmp/tier0-fuzz.$$ 2>&1 || {
      cat /tmp/tier0-fuzz.$$; rm -f /tmp/tier0-fuzz.$$
      echo "fuzz: $pkg $f failed; the failing input is under $dir/testdata/fuzz/$f" >&2
      exit 1
    }
    n=$((n + 1))
  done
done
rm -f /tmp/tier0-fuzz.$$
echo "fuzz: $n targets, $t each: no failures"
