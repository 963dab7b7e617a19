#!/usr/bin/env bash
# security: cost of DH-HMAC-CHAP per association (admin queue + 1 I/O queue,
# tier0 host against tier0 target on loopback) per DH group, against the
# same Dial without authentication ("off", measured in the same run). Go
# benchmark format, comparable with benchstat.
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -run '^$' -bench 'BenchmarkAuthDial' -benchtime=20x -count=1 ./daemon/host
