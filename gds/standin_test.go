//go:build cgo && linux

package gds

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Stand-in libraries, compiled once per test binary.
var (
	standinOnce sync.Once
	standinDir  string
	standinErr  error
)

func standinLibs(t *testing.T) (cufileLib, cufileNoStats, cudaLib string) {
	t.Helper()
	standinOnce.Do(func() {
		gcc, err := exec.LookPath("gcc")
		if err != nil {
			standinErr = err
			return
		}
		standinDir, standinErr = os.MkdirTemp("", "tier0-gds-standin-")
		if standinErr != nil {
			return
		}
		for _, b := range [][]string{
			{"libcufile_standin.so", "testdata/standin/cufile_standin.c"},
			{"libcufile_standin_nostats.so", "testdata/standin/cufile_standin.c", "-DSTANDIN_NO_STATS_API"},
			{"libcuda_standin.so", "testdata/standin/cuda_standin.c"},
		} {
			args := append([]string{"-Wall", "-Werror", "-shared", "-fPIC", "-o", filepath.Join(standinDir, b[0])}, b[1:]...)
			args = append(args, "-lpthread")
			if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
				standinErr = &buildError{string(out), err}
				return
			}
		}
	})
	if standinErr != nil {
		if _, ok := standinErr.(*buildError); ok {
			t.Fatalf("compiling stand-in libraries: %v", standinErr)
		}
		t.Skipf("stand-in libraries need gcc: %v", standinErr)
	}
	return filepath.Join(standinDir, "libcufile_standin.so"), filepath.Join(standinDir, "libcufile_standin_nostats.so"), filepath.Join(standinDir, "libcuda_standin.so")
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

func TestMain(m *testing.M) {
	code := m.Run()
	if standinDir != "" {
		os.RemoveAll(standinDir)
	}
	os.Exit(code)
}

// standin prepares a fake nvidia-fs (stats file with IO stats disabled,
// rw_stats_enabled = 0), a 4 MiB data file, and the environment the
// stand-in reads; it returns options that point the validator at them.
type standinSetup struct {
	opts   Options
	params string
	dir    string
}

func newStandin(t *testing.T, cufileLib string) *standinSetup {
	t.Helper()
	_, _, cudaLib := standinLibs(t)
	dir := t.TempDir()
	params := filepath.Join(dir, "params")
	if err := os.MkdirAll(params, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(params, "rw_stats_enabled"), []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stats := filepath.Join(dir, "nvfs-stats")
	fixture, err := os.ReadFile("testdata/nvfs-stats-2.25.7-iostats-disabled.txt")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stats, fixture, 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	b := make([]byte, 4<<20)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(data, b, 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(data, unix.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Skipf("the test directory %s does not support O_DIRECT (%v); set TMPDIR to a disk file system", dir, err)
	}
	unix.Close(fd)
	// Restore whatever the validator sets in the environment.
	for _, k := range []string{"CUFILE_ENV_PATH_JSON", "CUFILE_LOGFILE_PATH", "CUFILE_ALLOW_COMPAT_MODE",
		"STANDIN_POSIX_EVERY", "STANDIN_DRIVER_OPEN_ERR", "STANDIN_COMPAT_ONLY", "STANDIN_CUDA_DEVICES", "STANDIN_GDS_STATS_OUT",
		EnvCufileLib, EnvCUDALib, EnvNvfsStats, EnvNvfsParams, EnvGdsStats} {
		t.Setenv(k, "")
	}
	t.Setenv("STANDIN_NVFS_STATS", stats)
	t.Setenv("STANDIN_NVFS_PARAMS", params)
	t.Setenv("STANDIN_NVFS_BASE", "1000")
	return &standinSetup{
		dir:    dir,
		params: params,
		opts: Options{
			File: data, IOSize: 32 << 10, Threads: 4,
			CufileLib: cufileLib, CUDALib: cudaLib,
			NvfsStatsPath: stats, NvfsParamsDir: params,
			GdsStats: "/nonexistent/gds_stats", BaseConfig: "/dev/null",
			WorkDir: filepath.Join(dir, "work"),
		},
	}
}

func TestValidateStandinAllDirect(t *testing.T) {
	lib, _, _ := standinLibs(t)
	s := newStandin(t, lib)
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Available || !v.Proven || v.ExitCode() != ExitProven {
		t.Fatalf("verdict = %s\n%+v", v.Summary(), v)
	}
	if v.Ops != 128 || v.NvfsOps != 128 || v.PosixFallbacks != 0 {
		t.Errorf("counts = %s, want 128 operations, 128 through nvfs, 0 POSIX fallbacks", v.Counts())
	}
	if got := v.Summary(); !strings.HasPrefix(got, "proven: 128 operations, 128 through nvfs, 0 POSIX fallbacks; GPU_DIRECT ") {
		t.Errorf("summary = %q", got)
	}
	ev := v.Evidence
	if ev.CufileSource != "stats API (cuFileGetStatsL3)" || ev.CufileReads != 128 || ev.CufilePosix != 0 || ev.CufileNvfs != 128 {
		t.Errorf("cuFile counters = %q reads %d nvfs %d posix %d", ev.CufileSource, ev.CufileReads, ev.CufileNvfs, ev.CufilePosix)
	}
	if ev.NvfsBefore.N != 1000 || ev.NvfsAfter.N != 1128 {
		t.Errorf("nvidia-fs counters before %+v after %+v, want n 1000 -> 1128", ev.NvfsBefore, ev.NvfsAfter)
	}
	if !ev.DataChecked || ev.DataMismatch != 0 {
		t.Errorf("data check = %v mismatch %d", ev.DataChecked, ev.DataMismatch)
	}
	if v.GPUDirectGiBs <= 0 || v.CPUOnlyGiBs <= 0 {
		t.Errorf("throughput GPU_DIRECT %v CPU_ONLY %v, want both measured", v.GPUDirectGiBs, v.CPUOnlyGiBs)
	}
	// rw_stats_enabled was switched on for the run and back off after.
	if b, _ := os.ReadFile(filepath.Join(s.params, "rw_stats_enabled")); strings.TrimSpace(string(b)) != "0" {
		t.Errorf("rw_stats_enabled left at %q, want restored to 0", b)
	}
	if !strings.Contains(strings.Join(ev.Notes, ";"), "enabled nvidia-fs rw_stats") {
		t.Errorf("notes = %v, want the rw_stats switch recorded", ev.Notes)
	}
	// The run's cufile.json asked for stats and allowed compat mode.
	cfg, err := os.ReadFile(filepath.Join(s.opts.WorkDir, "cufile.json"))
	if err != nil || !strings.Contains(string(cfg), `"cufile_stats": 3`) || !strings.Contains(string(cfg), `"allow_compat_mode": true`) {
		t.Errorf("cufile.json = %s (%v)", cfg, err)
	}
}

func TestValidateStandinPosixFallback(t *testing.T) {
	lib, _, _ := standinLibs(t)
	s := newStandin(t, lib)
	t.Setenv("STANDIN_POSIX_EVERY", "4")
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Available || v.Proven || v.ExitCode() != ExitProofFailed {
		t.Fatalf("verdict = %s", v.Summary())
	}
	if v.Ops != 128 || v.NvfsOps != 96 || v.PosixFallbacks != 32 {
		t.Errorf("counts = %s, want 128 operations, 96 through nvfs, 32 POSIX fallbacks", v.Counts())
	}
	for _, want := range []string{
		"nvidia-fs counted 96 reads for 128 operations: 32 did not take the direct path",
		"cuFile served 32 of 128 reads through POSIX (compat mode)",
		"cufile.log has 32 compat-mode notices",
	} {
		if !strings.Contains(v.Reason, want) {
			t.Errorf("reason %q\nlacks %q", v.Reason, want)
		}
	}
	if !strings.HasPrefix(v.Summary(), "proof failed: 128 operations, 96 through nvfs, 32 POSIX fallbacks: ") {
		t.Errorf("summary = %q", v.Summary())
	}
}

func TestValidateStandinStrict(t *testing.T) {
	lib, _, _ := standinLibs(t)
	s := newStandin(t, lib)
	t.Setenv("STANDIN_POSIX_EVERY", "4")
	s.opts.Strict = true
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if v.ExitCode() != ExitProofFailed {
		t.Fatalf("verdict = %s", v.Summary())
	}
	if os.Getenv("CUFILE_ALLOW_COMPAT_MODE") != "false" {
		t.Errorf("CUFILE_ALLOW_COMPAT_MODE = %q, want false in strict mode", os.Getenv("CUFILE_ALLOW_COMPAT_MODE"))
	}
	// Compat mode off: the would-be fallbacks fail loudly instead.
	if v.Evidence.Failed != 32 || v.PosixFallbacks != 0 ||
		!strings.Contains(v.Reason, "32 of 128 cuFileRead calls failed") || !strings.Contains(v.Reason, "CU_FILE_IO_NOT_SUPPORTED") {
		t.Errorf("failed %d posix %d reason %q", v.Evidence.Failed, v.PosixFallbacks, v.Reason)
	}
}

func TestValidateStandinGdsStatsTool(t *testing.T) {
	_, lib, _ := standinLibs(t)
	s := newStandin(t, lib)
	t.Setenv("STANDIN_POSIX_EVERY", "8")
	out := filepath.Join(s.dir, "gds_stats.out")
	t.Setenv("STANDIN_GDS_STATS_OUT", out)
	// A gds_stats stand-in that insists on being asked about this process.
	tool := filepath.Join(s.dir, "gds_stats")
	script := "#!/bin/sh\n[ \"$1 $2 $3 $4\" = \"-p " + itoa(os.Getpid()) + " -l 3\" ] || { echo \"bad args: $*\" >&2; exit 2; }\nexec cat \"$STANDIN_GDS_STATS_OUT\"\n"
	if err := os.WriteFile(tool, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s.opts.GdsStats = tool
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	ev := v.Evidence
	if ev.CufileSource != "gds_stats -p PID -l 3" || ev.CufileReads != 128 || ev.CufilePosix != 16 || ev.CufileHasNvfs {
		t.Fatalf("cuFile counters = %q reads %d posix %d hasNvfs %v note %q", ev.CufileSource, ev.CufileReads, ev.CufilePosix, ev.CufileHasNvfs, ev.CufileNote)
	}
	if v.Proven || v.PosixFallbacks != 16 || v.NvfsOps != 112 {
		t.Errorf("verdict = %s", v.Summary())
	}
}

func TestValidateStandinNoCufileCounters(t *testing.T) {
	_, lib, _ := standinLibs(t)
	s := newStandin(t, lib)
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	// Without cuFile's counters the kernel counters and the log still prove
	// the path; the missing source is recorded.
	if !v.Proven || v.Evidence.CufileSource != "" || !strings.Contains(v.Evidence.CufileNote, "/nonexistent/gds_stats") {
		t.Errorf("verdict = %s; cufile note %q", v.Summary(), v.Evidence.CufileNote)
	}
}

func TestValidateStandinNvfsCountersUnavailable(t *testing.T) {
	lib, _, _ := standinLibs(t)
	s := newStandin(t, lib)
	s.opts.NvfsParamsDir = filepath.Join(s.dir, "no-such-params")
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if v.Proven || !strings.Contains(v.Reason, "nvidia-fs read counters not available") || !strings.Contains(v.Reason, "no-such-params") {
		t.Errorf("verdict = %s", v.Summary())
	}
}

func TestValidateStandinNotAvailable(t *testing.T) {
	lib, _, _ := standinLibs(t)
	for _, c := range []struct {
		name, cause, reason string
		setup               func(t *testing.T, s *standinSetup)
	}{
		{"no-gpu", CauseNoGPU, "no GPU: cuInit: CUDA_ERROR_NO_DEVICE (CUresult 100)", func(t *testing.T, s *standinSetup) { t.Setenv("STANDIN_CUDA_DEVICES", "0") }},
		{"no-libcuda", CauseNoCUDA, "libcuda not loadable: dlopen /nonexistent/libcuda.so.1", func(t *testing.T, s *standinSetup) { s.opts.CUDALib = "/nonexistent/libcuda.so.1" }},
		{"no-libcufile", CauseNoCufile, "libcufile not loadable: dlopen /nonexistent/libcufile.so.0", func(t *testing.T, s *standinSetup) { s.opts.CufileLib = "/nonexistent/libcufile.so.0" }},
		{"nvidia-fs", CauseNvfsNotLoaded, "nvidia-fs kernel module not loaded", func(t *testing.T, s *standinSetup) { s.opts.NvfsStatsPath = filepath.Join(s.dir, "absent") }},
		{"driver-open", CauseDriverOpen, "cuFileDriverOpen: error 5033 (CU_FILE_NVFS_SETUP_ERROR: NVFS driver initialization error); cufile.log: stand-in driver open failure", func(t *testing.T, s *standinSetup) { t.Setenv("STANDIN_DRIVER_OPEN_ERR", "5033") }},
		{"compat-only", CauseCompatOnly, "compat mode only: cuFile opened without the nvidia-fs direct path (running in compatible mode; log: ", func(t *testing.T, s *standinSetup) { t.Setenv("STANDIN_COMPAT_ONLY", "1") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStandin(t, lib)
			c.setup(t, s)
			v, err := Validate(context.Background(), s.opts)
			if err != nil {
				t.Fatal(err)
			}
			if v.Available || v.ExitCode() != ExitNotAvailable || v.Cause != c.cause || !strings.Contains(v.Reason, c.reason) {
				t.Errorf("verdict cause %q: %s\nwant cause %q, reason containing %q", v.Cause, v.Summary(), c.cause, c.reason)
			}
			if !strings.HasPrefix(v.Summary(), "not available on this host: ") {
				t.Errorf("summary = %q", v.Summary())
			}
		})
	}
}

func TestValidateUsageErrors(t *testing.T) {
	lib, _, _ := standinLibs(t)
	s := newStandin(t, lib)
	for name, mod := range map[string]func(o *Options){
		"no file or dir":   func(o *Options) { o.File = "" },
		"unaligned io":     func(o *Options) { o.IOSize = 1000 },
		"too big":          func(o *Options) { o.Size = 1 << 30 },
		"missing file":     func(o *Options) { o.File = filepath.Join(s.dir, "nope") },
		"gpu out of range": func(o *Options) { o.GPU = 3 },
	} {
		o := s.opts
		mod(&o)
		if _, err := Validate(context.Background(), o); !errorsIs(err, ErrUsage) {
			t.Errorf("%s: err = %v, want ErrUsage", name, err)
		}
	}
}

func TestValidateDirCreatesAndRemovesFile(t *testing.T) {
	lib, _, _ := standinLibs(t)
	s := newStandin(t, lib)
	work := filepath.Join(s.dir, "scratch")
	os.Mkdir(work, 0o755)
	s.opts.File, s.opts.Dir, s.opts.Size = "", work, 1<<20
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Proven || v.Ops != 32 || !strings.HasPrefix(filepath.Base(v.Evidence.File), "tier0-gds-") {
		t.Errorf("verdict = %s file %s", v.Summary(), v.Evidence.File)
	}
	if left, _ := os.ReadDir(work); len(left) != 0 {
		t.Errorf("test file left behind: %v", left)
	}
}
