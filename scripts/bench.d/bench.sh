#!/usr/bin/env bash
# bench: the load generator's own cost per I/O against a plain ReadAt loop
# (x-direct, measured in the same run), verify-block building and histogram
# recording. Go benchmark format, comparable with benchstat.
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -run '^$' -bench . -benchtime=200000x -count=1 ./bench
