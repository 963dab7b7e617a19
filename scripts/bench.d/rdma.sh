#!/usr/bin/env bash
# The CPU cost of the NVMe/RDMA data path beside NVMe/TCP's, same process,
# same I/O (daemon/target BenchmarkTransportCPU): tier0's host and target
# over rdma.MemPair (no RDMA device needed; the pair copies RDMA READ/WRITE
# data with the CPU, which a NIC does without it) and over TCP loopback.
# Emulated RDMA is no speed reference; compare cpu-us/io and cpu-ms/GiB.
#   TIER0_BENCH_RDMA_IOS   I/Os per workload (-benchtime Nx, default 2000)
set -euo pipefail
cd "$(dirname "$0")/../.."
go test -run '^$' -bench '^BenchmarkTransportCPU$' -benchtime "${TIER0_BENCH_RDMA_IOS:-2000}x" -count 1 ./daemon/target
