package gds

import (
	"errors"
	"fmt"
	"strings"
)

// Exit codes of `tier0 gds validate`, also Verdict.ExitCode.
const (
	ExitProven       = 0 // the direct path is proven
	ExitProofFailed  = 1 // GDS is there, but the proof failed (see Failures)
	ExitNotAvailable = 3 // no GDS on this host (see Cause, Reason)
)

// Causes of a "not available" verdict (Verdict.Cause).
const (
	CauseNotBuilt      = "not-built"            // binary built without cgo
	CauseNoCufile      = "no-libcufile"         // libcufile.so.0 not loadable
	CauseNoCUDA        = "no-libcuda"           // libcuda.so.1 not loadable: no NVIDIA driver
	CauseNoGPU         = "no-gpu"               // cuInit failed or no CUDA device
	CauseNvfsNotLoaded = "nvidia-fs-not-loaded" // kernel module missing
	CauseDriverOpen    = "driver-open-failed"   // cuFileDriverOpen failed
	CauseCompatOnly    = "compat-mode-only"     // cuFile runs, but only in POSIX compat mode
)

// Verdict is the validator's result. It is JSON-serializable so that the
// validate/report engineer can embed it.
type Verdict struct {
	// Available is false when this host has no usable GDS (Cause, Reason say
	// why); nothing was measured then.
	Available bool `json:"available"`
	// Proven is true when every operation is accounted for by nvidia-fs,
	// with no POSIX fallback, no error and no compat notice.
	Proven bool   `json:"proven"`
	Cause  string `json:"cause,omitempty"`
	// Reason: why not available, or why the proof failed (Failures joined).
	Reason   string   `json:"reason,omitempty"`
	Failures []string `json:"failures,omitempty"`

	Ops            int64 `json:"ops"`             // cuFileRead calls issued
	NvfsOps        int64 `json:"nvfs_ops"`        // reads nvidia-fs counted meanwhile
	PosixFallbacks int64 `json:"posix_fallbacks"` // reads served through POSIX compat mode

	GPUDirectGiBs float64 `json:"gpu_direct_gib_s"`
	CPUOnlyGiBs   float64 `json:"cpu_only_gib_s"`
	// Gain is GPUDirectGiBs/CPUOnlyGiBs - 1 (0.21 = 21 % faster); 0 when
	// either was not measured.
	Gain float64 `json:"gain"`

	Evidence Evidence `json:"evidence"`
}

// Evidence is what the verdict rests on.
type Evidence struct {
	File    string `json:"file,omitempty"`
	GPU     int    `json:"gpu"`
	GPUName string `json:"gpu_name,omitempty"`
	Size    int64  `json:"size"`
	IOSize  int    `json:"io_size"`
	Threads int    `json:"threads"`
	Strict  bool   `json:"strict"`

	// SetupError: the run stopped before any read (O_DIRECT open, handle
	// or buffer registration failed).
	SetupError string `json:"setup_error,omitempty"`
	// Reads issued through cuFileRead; Failed of them returned an error or
	// a short count (FirstError is the first such).
	Ops        int64  `json:"ops"`
	Failed     int64  `json:"failed"`
	FirstError string `json:"first_error,omitempty"`
	BytesRead  int64  `json:"bytes_read"`
	// DataChecked: the last buffer of each thread was copied back from the
	// GPU and compared with a pread of the same range; DataMismatch counts
	// buffers that differed.
	DataChecked  bool  `json:"data_checked"`
	DataMismatch int64 `json:"data_mismatch"`

	// nvidia-fs kernel counters around the GPU_DIRECT run.
	NvfsStatsPath string       `json:"nvfs_stats_path,omitempty"`
	NvfsBefore    ReadCounters `json:"nvfs_before"`
	NvfsAfter     ReadCounters `json:"nvfs_after"`
	NvfsNote      string       `json:"nvfs_note,omitempty"`

	// cuFile's own counters for this process.
	CufileSource  string `json:"cufile_source,omitempty"` // "stats API (cuFileGetStatsL3)" or "gds_stats -p PID -l 3"
	CufileNote    string `json:"cufile_note,omitempty"`   // why they are missing
	CufileReads   int64  `json:"cufile_reads"`
	CufileNvfs    int64  `json:"cufile_nvfs"`
	CufileHasNvfs bool   `json:"cufile_has_nvfs"`
	CufilePosix   int64  `json:"cufile_posix"`
	CufileErrors  int64  `json:"cufile_errors"`

	// cufile.log of the run.
	LogPath string  `json:"log_path,omitempty"`
	Log     LogScan `json:"log"`

	Notes []string `json:"notes,omitempty"`
}

// NotAvailable builds the verdict for a host without usable GDS.
func NotAvailable(cause, reason string) Verdict {
	return Verdict{Available: false, Cause: cause, Reason: reason}
}

// Judge turns the evidence of a GPU_DIRECT run into a verdict. The proof
// holds when all of these do:
//   - every cuFileRead returned its full size (and copied-back data matched);
//   - the nvidia-fs read counters are published and their n delta is at
//     least the number of reads issued, with no new read error;
//   - cuFile's counters, where available, show no POSIX read, and as many
//     nvfs reads as reads where they report nvfs;
//   - cufile.log has no compat-mode notice.
func Judge(ev Evidence) Verdict {
	v := Verdict{Available: true, Ops: ev.Ops, Evidence: ev}
	var fail []string
	if ev.SetupError != "" {
		v.Failures = []string{ev.SetupError}
		v.Reason = ev.SetupError
		return v
	}
	if ev.Ops == 0 {
		fail = append(fail, "no read was issued")
	}
	if ev.Failed > 0 {
		fail = append(fail, fmt.Sprintf("%d of %d cuFileRead calls failed or came back short (first: %s)", ev.Failed, ev.Ops, ev.FirstError))
	}
	if ev.DataMismatch > 0 {
		fail = append(fail, fmt.Sprintf("%d GPU buffers differ from the file when copied back", ev.DataMismatch))
	}
	nvfsKnown := ev.NvfsBefore.Present && ev.NvfsAfter.Present
	if nvfsKnown {
		v.NvfsOps = ev.NvfsAfter.N - ev.NvfsBefore.N
		if v.NvfsOps < ev.Ops {
			fail = append(fail, fmt.Sprintf("nvidia-fs counted %d reads for %d operations: %d did not take the direct path", v.NvfsOps, ev.Ops, ev.Ops-v.NvfsOps))
		}
	} else {
		note := ev.NvfsNote
		if note == "" {
			note = "IO stats disabled"
		}
		fail = append(fail, fmt.Sprintf("nvidia-fs read counters not available (%s), so the operations cannot be accounted for: run as root or write 1 to /sys/module/nvidia_fs/parameters/rw_stats_enabled", note))
	}
	if d := ev.NvfsAfter.Err - ev.NvfsBefore.Err; d > 0 {
		fail = append(fail, fmt.Sprintf("nvidia-fs counted %d read errors during the run", d))
	}
	switch {
	case ev.CufileSource != "":
		v.PosixFallbacks = ev.CufilePosix
		if ev.CufilePosix > 0 {
			fail = append(fail, fmt.Sprintf("cuFile served %d of %d reads through POSIX (compat mode)", ev.CufilePosix, ev.Ops))
		}
		if ev.CufileHasNvfs && ev.CufileNvfs < ev.CufileReads {
			fail = append(fail, fmt.Sprintf("cuFile counted %d nvfs reads of %d reads", ev.CufileNvfs, ev.CufileReads))
		}
		if ev.CufileErrors > 0 {
			fail = append(fail, fmt.Sprintf("cuFile counted %d read errors", ev.CufileErrors))
		}
	case nvfsKnown && v.NvfsOps < ev.Ops:
		v.PosixFallbacks = ev.Ops - v.NvfsOps
	}
	if n := len(ev.Log.Compat); n > 0 {
		fail = append(fail, fmt.Sprintf("cufile.log has %d compat-mode notices, first: %q", n, ev.Log.Compat[0].Message))
	}
	v.Failures = fail
	v.Proven = len(fail) == 0
	if !v.Proven {
		v.Reason = strings.Join(fail, "; ")
	}
	return v
}

// SetThroughput records the GPU_DIRECT and CPU_ONLY rates and the gain.
func (v *Verdict) SetThroughput(gpuDirect, cpuOnly float64) {
	v.GPUDirectGiBs, v.CPUOnlyGiBs = gpuDirect, cpuOnly
	v.Gain = 0
	if gpuDirect > 0 && cpuOnly > 0 {
		v.Gain = gpuDirect/cpuOnly - 1
	}
}

// ExitCode is the process exit code for this verdict: ExitProven,
// ExitProofFailed or ExitNotAvailable.
func (v Verdict) ExitCode() int {
	switch {
	case !v.Available:
		return ExitNotAvailable
	case v.Proven:
		return ExitProven
	default:
		return ExitProofFailed
	}
}

// Counts is the one-line account: "N operations, N through nvfs, N POSIX
// fallbacks".
func (v Verdict) Counts() string {
	return fmt.Sprintf("%d operations, %d through nvfs, %d POSIX fallbacks", v.Ops, v.NvfsOps, v.PosixFallbacks)
}

// Summary is the verdict in one line, as reports print it.
func (v Verdict) Summary() string {
	switch {
	case !v.Available:
		return "not available on this host: " + v.Reason
	case v.Proven:
		s := "proven: " + v.Counts()
		if v.GPUDirectGiBs > 0 && v.CPUOnlyGiBs > 0 {
			s += fmt.Sprintf("; GPU_DIRECT %.2f GiB/s vs CPU_ONLY %.2f GiB/s (%+.0f%%)", v.GPUDirectGiBs, v.CPUOnlyGiBs, v.Gain*100)
		}
		return s
	default:
		return "proof failed: " + v.Counts() + ": " + v.Reason
	}
}

// ErrUsage marks an invalid option (a usage error, not a verdict).
var ErrUsage = errors.New("invalid gds validate option")
