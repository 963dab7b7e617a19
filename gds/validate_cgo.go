//go:build cgo && linux

package gds

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tier0/gds/cufile"
)

// Validate runs the GPUDirect Storage proof described in the package
// documentation and returns its verdict. The error is non-nil only for
// invalid options (wrapping ErrUsage) or a file that cannot be prepared;
// "not available" and "proof failed" are verdicts, not errors.
//
// Validate sets CUFILE_ENV_PATH_JSON and CUFILE_LOGFILE_PATH (and
// CUFILE_ALLOW_COMPAT_MODE=false when Strict) in the process environment
// before opening the cuFile driver; cuFile reads its configuration from
// there. Run one Validate per process at a time.
func Validate(ctx context.Context, o Options) (Verdict, error) {
	if err := o.setDefaults(); err != nil {
		return Verdict{}, err
	}
	log := o.Logger
	ev := Evidence{File: o.File, Size: o.Size, GPU: o.GPU, IOSize: o.IOSize, Threads: o.Threads, Strict: o.Strict, NvfsStatsPath: o.NvfsStatsPath}
	// NotAvailable verdicts carry the options in their evidence too.
	na := func(cause, reason string) Verdict {
		v := NotAvailable(cause, reason)
		v.Evidence = ev
		return v
	}

	lib, err := cufile.Open(o.CufileLib)
	if err != nil {
		return na(CauseNoCufile, fmt.Sprintf("%v (install libcufile0 from Debian non-free or NVIDIA's GDS package, or set %s)", err, EnvCufileLib)), nil
	}
	cu, err := cufile.OpenCUDA(o.CUDALib)
	if err != nil {
		return na(CauseNoCUDA, fmt.Sprintf("%v (no NVIDIA driver on this host; cuFile needs %s)", err, o.CUDALib)), nil
	}
	if err := cu.Init(); err != nil {
		return na(CauseNoGPU, fmt.Sprintf("no GPU: %v", err)), nil
	}
	n, err := cu.DeviceCount()
	if err != nil {
		return na(CauseNoGPU, fmt.Sprintf("no GPU: %v", err)), nil
	}
	if n == 0 {
		return na(CauseNoGPU, "no GPU: cuDeviceGetCount reports 0 CUDA devices"), nil
	}
	if o.GPU >= n {
		return Verdict{}, fmt.Errorf("%w: gpu %d requested, but this host has %d CUDA devices (0..%d)", ErrUsage, o.GPU, n, n-1)
	}
	ev.GPUName, _ = cu.DeviceName(o.GPU)
	if _, err := os.Stat(o.NvfsStatsPath); err != nil {
		return na(CauseNvfsNotLoaded, fmt.Sprintf("nvidia-fs kernel module not loaded (%s: %v): load it with modprobe nvidia-fs", o.NvfsStatsPath, errors.Unwrap(err))), nil
	}

	// The file first: a usage error should not cost a driver open.
	path, size, cleanupFile, err := prepareFile(o)
	if err != nil {
		return Verdict{}, err
	}
	defer cleanupFile()
	ev.File, ev.Size = path, size

	workDir, keep, err := prepareWorkDir(o)
	if err != nil {
		return Verdict{}, err
	}
	ev.LogPath = filepath.Join(workDir, "cufile.log")
	proven := false
	defer func() {
		if !keep && proven {
			os.RemoveAll(workDir)
		}
	}()

	xctx, err := cu.PrimaryContext(o.GPU)
	if err != nil {
		return na(CauseNoGPU, fmt.Sprintf("GPU %d: %v", o.GPU, err)), nil
	}
	defer xctx.Release()

	pid := os.Getpid()
	if err := lib.DriverOpen(); err != nil {
		scan, _ := scanLogFile(ev.LogPath, pid)
		reason := err.Error()
		if s := logErrorSummary(scan); s != "" {
			reason += "; cufile.log: " + s
		}
		return na(CauseDriverOpen, reason+" (log: "+ev.LogPath+")"), nil
	}
	defer lib.DriverClose()
	props, _ := lib.Properties()
	if scan, _ := scanLogFile(ev.LogPath, pid); len(scan.Compat) > 0 || props.NvfsMajor == 0 {
		why := fmt.Sprintf("nvidia-fs version %d.%d", props.NvfsMajor, props.NvfsMinor)
		if len(scan.Compat) > 0 {
			why = scan.Compat[0].Message
		}
		if s := logErrorSummary(scan); s != "" {
			why += "; " + s
		}
		return na(CauseCompatOnly, "compat mode only: cuFile opened without the nvidia-fs direct path ("+why+"; log: "+ev.LogPath+")"), nil
	}
	log.Info("cuFile driver open", "nvfs", fmt.Sprintf("%d.%d", props.NvfsMajor, props.NvfsMinor), "gpu", ev.GPUName)

	statsAPI := false
	if lib.HasStatsAPI() {
		if err := lib.StatsStart(3); err != nil {
			ev.CufileNote = "statistics API present but failed: " + err.Error()
		} else {
			statsAPI = true
		}
	}

	restore := enableRWStats(o.NvfsParamsDir, &ev)
	defer restore()

	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		v := Judge(failEvidence(ev, fmt.Sprintf("open %s with O_DIRECT: %v (GDS needs a file system that supports O_DIRECT)", path, err)))
		return v, nil
	}
	defer unix.Close(fd)
	h, err := lib.HandleRegister(xctx, fd)
	if err != nil {
		msg := err.Error()
		if o.Strict {
			msg += " (compat mode is off: cuFile cannot use the direct path for this file)"
		}
		ev.Log, _ = scanLogFile(ev.LogPath, pid)
		return Judge(failEvidence(ev, msg)), nil
	}
	defer h.Deregister()

	bufs := make([]cufile.DevPtr, o.Threads)
	for i := range bufs {
		p, err := xctx.MemAlloc(o.IOSize)
		if err != nil {
			return Judge(failEvidence(ev, fmt.Sprintf("allocating %d bytes of GPU memory: %v", o.IOSize, err))), nil
		}
		defer xctx.MemFree(p)
		if err := lib.BufRegister(xctx, p, o.IOSize); err != nil {
			return Judge(failEvidence(ev, err.Error())), nil
		}
		defer lib.BufDeregister(xctx, p)
		bufs[i] = p
	}

	before, err := ReadNvfsStatsFile(o.NvfsStatsPath)
	if err == nil {
		ev.NvfsBefore = before.Reads()
	} else {
		ev.NvfsNote = err.Error()
	}
	ops := size / int64(o.IOSize)
	start := time.Now()
	last := runReads(ctx, ops, o, func(t int, off int64) (int, error) {
		return h.Read(bufs[t], o.IOSize, off, 0)
	}, &ev)
	elapsed := time.Since(start)
	if after, err := ReadNvfsStatsFile(o.NvfsStatsPath); err == nil {
		ev.NvfsAfter = after.Reads()
	} else if ev.NvfsNote == "" {
		ev.NvfsNote = err.Error()
	}
	if !ev.NvfsAfter.Present && ev.NvfsNote == "" {
		ev.NvfsNote = "IO stats disabled in " + o.NvfsStatsPath
	}

	// cuFile's own counters.
	if statsAPI {
		if s, err := lib.Stats(); err == nil {
			ev.CufileSource = "stats API (cuFileGetStatsL3)"
			for _, g := range s.GPUs {
				ev.CufileReads += int64(g.TotalReads)
				ev.CufileNvfs += int64(g.NvfsReads)
				ev.CufilePosix += int64(g.PosixReads)
				ev.CufileErrors += int64(g.ReadErrors)
			}
			ev.CufileHasNvfs = true
		} else {
			ev.CufileNote = err.Error()
		}
	} else if o.GdsStats != "" {
		if s, err := runGdsStats(o.GdsStats, pid); err == nil {
			ev.CufileSource = "gds_stats -p PID -l 3"
			ev.CufileReads, ev.CufilePosix, ev.CufileErrors, ev.CufileNvfs, ev.CufileHasNvfs = s.ReadTotals()
		} else {
			ev.CufileNote = err.Error()
		}
	} else if ev.CufileNote == "" {
		ev.CufileNote = "this libcufile has no statistics API and gds_stats was not found"
	}

	// Copy back the last buffer of each thread and compare with the file.
	verifyData(xctx, fd, bufs, last, o.IOSize, &ev)

	ev.Log, _ = scanLogFile(ev.LogPath, pid)
	v := Judge(ev)
	gpuDirect := rate(ev.BytesRead, elapsed)

	cpuOnly := 0.0
	if !o.SkipCPUOnly {
		if r, err := cpuOnlyRun(ctx, fd, xctx, bufs, size, o); err == nil {
			cpuOnly = r
		} else {
			v.Evidence.Notes = append(v.Evidence.Notes, "CPU_ONLY run failed: "+err.Error())
		}
	}
	v.SetThroughput(gpuDirect, cpuOnly)
	proven = v.Proven
	if proven && !keep {
		v.Evidence.LogPath = ""
	}
	log.Info("gds validate", "verdict", v.Summary())
	return v, nil
}

func failEvidence(ev Evidence, msg string) Evidence {
	ev.SetupError = msg
	return ev
}

func rate(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / (1 << 30)
}

// runReads issues ops reads of o.IOSize from o.Threads goroutines, handing
// out offsets in order. It returns, per thread, the offset of its last good
// read (-1 for none).
func runReads(ctx context.Context, ops int64, o Options, read func(t int, off int64) (int, error), ev *Evidence) []int64 {
	var next, done, failed, bytes atomic.Int64
	var mu sync.Mutex
	last := make([]int64, o.Threads)
	var wg sync.WaitGroup
	for t := 0; t < o.Threads; t++ {
		last[t] = -1
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= ops {
					return
				}
				off := i * int64(o.IOSize)
				n, err := read(t, off)
				done.Add(1)
				if err == nil && n != o.IOSize {
					err = fmt.Errorf("short read at offset %d: %d of %d bytes", off, n, o.IOSize)
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					if ev.FirstError == "" {
						ev.FirstError = err.Error()
					}
					mu.Unlock()
					continue
				}
				bytes.Add(int64(n))
				last[t] = off
			}
		}(t)
	}
	wg.Wait()
	ev.Ops, ev.Failed, ev.BytesRead = done.Load(), failed.Load(), bytes.Load()
	if ctx.Err() != nil {
		ev.Notes = append(ev.Notes, "run cut short: "+ctx.Err().Error())
	}
	return last
}

func verifyData(x *cufile.Context, fd int, bufs []cufile.DevPtr, last []int64, ioSize int, ev *Evidence) {
	host, err := x.HostAlloc(2 * ioSize) // page-aligned, suitable for O_DIRECT
	if err != nil {
		ev.Notes = append(ev.Notes, "data check skipped: "+err.Error())
		return
	}
	defer x.HostFree(host)
	fromFile, fromGPU := host[:ioSize], make([]byte, ioSize)
	for t, off := range last {
		if off < 0 {
			continue
		}
		if n, err := unix.Pread(fd, fromFile, off); err != nil || n != ioSize {
			ev.Notes = append(ev.Notes, fmt.Sprintf("data check: pread at %d: %d bytes, %v", off, n, err))
			return
		}
		if err := x.CopyDtoH(fromGPU, bufs[t]); err != nil {
			ev.Notes = append(ev.Notes, "data check: "+err.Error())
			return
		}
		ev.DataChecked = true
		if !bytes.Equal(fromFile, fromGPU) {
			ev.DataMismatch++
		}
	}
}

// cpuOnlyRun reads the same range with pread into pinned host memory and
// copies each buffer to the GPU, like gdsio's CPU_ONLY mode, and returns
// GiB/s.
func cpuOnlyRun(ctx context.Context, fd int, x *cufile.Context, bufs []cufile.DevPtr, size int64, o Options) (float64, error) {
	hosts := make([][]byte, o.Threads)
	for i := range hosts {
		b, err := x.HostAlloc(o.IOSize)
		if err != nil {
			return 0, err
		}
		defer x.HostFree(b)
		hosts[i] = b
	}
	var ev Evidence
	start := time.Now()
	runReads(ctx, size/int64(o.IOSize), o, func(t int, off int64) (int, error) {
		n, err := unix.Pread(fd, hosts[t], off)
		if err != nil {
			return n, err
		}
		return n, x.CopyHtoD(bufs[t], hosts[t][:n])
	}, &ev)
	if ev.Failed > 0 {
		return 0, fmt.Errorf("%d of %d reads failed, first: %s", ev.Failed, ev.Ops, ev.FirstError)
	}
	return rate(ev.BytesRead, time.Since(start)), nil
}

// prepareFile returns the file to read and the byte count, creating a test
// file in o.Dir when asked.
func prepareFile(o Options) (string, int64, func(), error) {
	if o.File != "" {
		st, err := os.Stat(o.File)
		if err != nil {
			return "", 0, nil, fmt.Errorf("%w: --file %s: %v", ErrUsage, o.File, err)
		}
		size := o.Size
		fsize := st.Size()
		if !st.Mode().IsRegular() {
			// A block device: its size comes from seeking to the end.
			if f, err := os.Open(o.File); err == nil {
				fsize, _ = f.Seek(0, 2)
				f.Close()
			}
		}
		if size == 0 {
			size = fsize - fsize%int64(o.IOSize)
		}
		if size > fsize {
			return "", 0, nil, fmt.Errorf("%w: --size %d exceeds %s (%d bytes)", ErrUsage, size, o.File, fsize)
		}
		if size < int64(o.IOSize) {
			return "", 0, nil, fmt.Errorf("%w: %s has %d bytes to read, less than one I/O of %d bytes", ErrUsage, o.File, size, o.IOSize)
		}
		return o.File, size - size%int64(o.IOSize), func() {}, nil
	}
	if o.Size < int64(o.IOSize) {
		return "", 0, nil, fmt.Errorf("%w: --size %d is less than one I/O of %d bytes", ErrUsage, o.Size, o.IOSize)
	}
	f, err := os.CreateTemp(o.Dir, "tier0-gds-*.dat")
	if err != nil {
		return "", 0, nil, fmt.Errorf("--dir %s: %w", o.Dir, err)
	}
	name := f.Name()
	cleanup := func() { os.Remove(name) }
	chunk := make([]byte, 1<<20)
	rand.Read(chunk)
	for left := o.Size; left > 0; {
		n := min(left, int64(len(chunk)))
		if _, err := f.Write(chunk[:n]); err != nil {
			f.Close()
			cleanup()
			return "", 0, nil, fmt.Errorf("writing test file %s: %w", name, err)
		}
		chunk[0]++ // make every MiB distinct
		left -= n
	}
	if err := f.Sync(); err != nil {
		f.Close()
		cleanup()
		return "", 0, nil, fmt.Errorf("syncing test file %s: %w", name, err)
	}
	f.Close()
	return name, o.Size - o.Size%int64(o.IOSize), cleanup, nil
}

// prepareWorkDir writes cufile.json and points cuFile at it and at the log.
func prepareWorkDir(o Options) (dir string, keep bool, err error) {
	dir, keep = o.WorkDir, o.WorkDir != ""
	if dir == "" {
		if dir, err = os.MkdirTemp("", "tier0-gds-"); err != nil {
			return "", false, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	var base []byte
	if o.BaseConfig != "" {
		if base, err = os.ReadFile(o.BaseConfig); err != nil {
			return "", false, fmt.Errorf("base cufile.json: %w", err)
		}
	}
	cfg, err := CufileConfig(base, dir, !o.Strict)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w (fix it or pass another with --cufile-json)", o.BaseConfig, err)
	}
	jsonPath := filepath.Join(dir, "cufile.json")
	if err := os.WriteFile(jsonPath, cfg, 0o644); err != nil {
		return "", false, err
	}
	logPath := filepath.Join(dir, "cufile.log")
	os.Remove(logPath)
	os.Setenv("CUFILE_ENV_PATH_JSON", jsonPath)
	os.Setenv("CUFILE_LOGFILE_PATH", logPath)
	if o.Strict {
		os.Setenv("CUFILE_ALLOW_COMPAT_MODE", "false")
	}
	return dir, keep, nil
}

// enableRWStats turns on nvidia-fs read/write counters for the run where
// they are off and the parameter is writable; the returned func restores
// the old value.
func enableRWStats(dir string, ev *Evidence) func() {
	p := filepath.Join(dir, "rw_stats_enabled")
	old, err := os.ReadFile(p)
	if err != nil {
		ev.NvfsNote = fmt.Sprintf("cannot read %s: %v", p, err)
		return func() {}
	}
	if strings.TrimSpace(string(old)) == "1" {
		return func() {}
	}
	if err := os.WriteFile(p, []byte("1\n"), 0); err != nil {
		ev.NvfsNote = fmt.Sprintf("rw_stats_enabled is 0 and could not be set: %v", err)
		return func() {}
	}
	ev.Notes = append(ev.Notes, "enabled nvidia-fs rw_stats for the run")
	return func() { os.WriteFile(p, old, 0) }
}
