// Package gds is tier0's GPUDirect Storage (GDS) validator and gdsio
// driver.
//
// The validator (Validate) reads a file into GPU memory through NVIDIA
// cuFile and proves that the direct nvidia-fs DMA path was used: it compares
// the nvidia-fs kernel counters (/proc/driver/nvidia-fs/stats) before and
// after, reads cuFile's own per-process counters (the statistics API where
// the library has it, else `gds_stats -p PID -l 3`), and scans cufile.log
// for compat-mode notices. The result is a Verdict: proven, proof failed
// (with what failed), or not available on this host (with why). It also
// measures GPU_DIRECT against CPU_ONLY (pread into pinned host memory, then
// a copy to the GPU).
//
// The parsers (ParseNvfsStats, ParseGdsStats, ScanCufileLog, ParseGdsio)
// accept every format in testdata/ and are usable on their own by bench and
// report code. The cuFile and CUDA bindings live in gds/cufile and are
// loaded at run time, so this package builds everywhere.
package gds
