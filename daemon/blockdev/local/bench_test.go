package local

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tier0/daemon/blockdev"
)

// The local-device benchmarks compare tier0's O_DIRECT device with fio on
// the same file, in the same run, at the same queue depth (fio: libaio
// with iodepth=benchQD; tier0: benchQD goroutines). The usual ns/op and
// MB/s come from the b.N loop; the comparison runs fio and tier0 for the
// same time slice, three times each, interleaved, and reports the medians
// (tier0-MB/s or IOPS, fio-MB/s or fio-IOPS) and their ratio tier0/fio
// (goal: >= 0.9). scripts/bench.d/blockdev.sh runs them.
//
// TIER0_BENCH_DIR picks the directory of the 256 MiB test file (default
// /var/tmp; it must support O_DIRECT); TIER0_BENCH_FIO_RUNTIME sets the
// length of one comparison slice (default 1s).

const (
	benchFileSize = 256 << 20
	benchQD       = 16
)

var (
	benchOnce sync.Once
	benchPath string
	benchErr  error
	fioMu     sync.Mutex
	fioCache  = map[string][2]fioResult{} // workload -> {tier0, fio}
)

// benchFile creates (once per process) a fully written 256 MiB file, so
// that reads hit the medium rather than unallocated extents.
func benchFile(b *testing.B) string {
	benchOnce.Do(func() {
		dir := os.Getenv("TIER0_BENCH_DIR")
		if dir == "" {
			dir = "/var/tmp"
		}
		benchPath = filepath.Join(dir, fmt.Sprintf("tier0-bench-%d.img", os.Getpid()))
		d, err := Open(benchPath, Options{Size: benchFileSize, Create: true})
		if err != nil {
			benchErr = err
			return
		}
		defer d.Close()
		buf := blockdev.AlignedBuffer(4 << 20)
		rand.New(rand.NewSource(1)).Read(buf)
		for off := int64(0); off < benchFileSize; off += int64(len(buf)) {
			if _, err := d.WriteAt(buf, off); err != nil {
				benchErr = err
				return
			}
		}
		benchErr = d.Flush()
	})
	if benchErr != nil {
		b.Skipf("cannot prepare the bench file (set TIER0_BENCH_DIR to a disk-backed directory): %v", benchErr)
	}
	return benchPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchPath != "" {
		os.Remove(benchPath)
	}
	os.Exit(code)
}

type fioResult struct {
	bwBytes  float64 // bytes per second
	iops     float64
	cpuPerIO float64 // microseconds of CPU (user+system) per I/O
}

// cpuNow is this process's CPU time so far (user+system, getrusage).
func cpuNow() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runFio measures the workload with fio for the given time.
func runFio(path, rw string, bs int, runtime time.Duration) (fioResult, error) {
	out, err := exec.Command("fio", "--name=tier0-baseline", "--filename="+path, "--direct=1",
		"--rw="+rw, fmt.Sprintf("--bs=%d", bs), "--ioengine=libaio", fmt.Sprintf("--iodepth=%d", benchQD),
		fmt.Sprintf("--size=%d", benchFileSize), "--time_based", fmt.Sprintf("--runtime=%dms", runtime.Milliseconds()),
		"--randrepeat=0", "--norandommap", "--output-format=json").Output()
	if err != nil {
		return fioResult{}, fmt.Errorf("fio: %w", err)
	}
	var rep struct {
		Jobs []struct {
			Read, Write struct {
				BwBytes  float64 `json:"bw_bytes"`
				IOPS     float64 `json:"iops"`
				TotalIOs float64 `json:"total_ios"`
			}
			Usr     float64 `json:"usr_cpu"` // percent of the job's run time
			Sys     float64 `json:"sys_cpu"`
			Runtime float64 `json:"job_runtime"` // milliseconds
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Jobs) == 0 {
		return fioResult{}, fmt.Errorf("cannot parse fio output: %v", err)
	}
	j := rep.Jobs[0]
	r := fioResult{bwBytes: j.Read.BwBytes + j.Write.BwBytes, iops: j.Read.IOPS + j.Write.IOPS}
	if ios := j.Read.TotalIOs + j.Write.TotalIOs; ios > 0 {
		r.cpuPerIO = (j.Usr + j.Sys) / 100 * j.Runtime * 1e3 / ios
	}
	return r, nil
}

// workload runs benchQD workers on d until ops requests are done (ops > 0)
// or until the deadline, and returns the requests done and the time taken.
func workload(d *Device, rw string, bs int, ops int64, deadline time.Time) (int64, time.Duration, error) {
	write := rw == "write" || rw == "randwrite"
	random := rw == "randread" || rw == "randwrite"
	blocks := int64(benchFileSize / bs)
	var next, issued, done atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < benchQD; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := blockdev.AlignedBuffer(bs)
			rng := rand.New(rand.NewSource(int64(w) + start.UnixNano()))
			for {
				if ops > 0 && issued.Add(1) > ops || ops == 0 && time.Now().After(deadline) {
					return
				}
				var blk int64
				if random {
					blk = rng.Int63n(blocks)
				} else {
					blk = next.Add(1) % blocks
				}
				var err error
				if write {
					_, err = d.WriteAt(buf, blk*int64(bs))
				} else {
					_, err = d.ReadAt(buf, blk*int64(bs))
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				done.Add(1)
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return done.Load(), el, err
	}
	return done.Load(), el, nil
}

// baseline compares tier0 and fio on the workload, interleaved (fio,
// tier0, fio, tier0, fio, tier0) so that a machine whose load drifts
// treats both alike, and returns the medians (cached per workload).
func baseline(b *testing.B, d *Device, path, rw string, bs int) (ours, fio fioResult, ok bool) {
	key := fmt.Sprintf("%s/%d", rw, bs)
	fioMu.Lock()
	defer fioMu.Unlock()
	if r, hit := fioCache[key]; hit {
		return r[0], r[1], true
	}
	if _, err := exec.LookPath("fio"); err != nil {
		b.Logf("fio not installed (scripts/deps.d/base.sh installs it): no baseline")
		return ours, fio, false
	}
	slice := time.Second
	if s := os.Getenv("TIER0_BENCH_FIO_RUNTIME"); s != "" {
		if v, err := time.ParseDuration(s); err == nil {
			slice = v
		}
	}
	var fioBW, fioIOPS, fioCPU, ourBW, ourIOPS, ourCPU []float64
	for i := 0; i < 3; i++ {
		f, err := runFio(path, rw, bs, slice)
		if err != nil {
			b.Logf("%v: no baseline", err)
			return ours, fio, false
		}
		fioBW, fioIOPS, fioCPU = append(fioBW, f.bwBytes), append(fioIOPS, f.iops), append(fioCPU, f.cpuPerIO)
		c0 := cpuNow()
		n, el, err := workload(d, rw, bs, 0, time.Now().Add(slice))
		if err != nil {
			b.Fatal(err)
		}
		if n > 0 {
			ourCPU = append(ourCPU, float64(cpuNow()-c0)/1e3/float64(n))
		}
		ourIOPS = append(ourIOPS, float64(n)/el.Seconds())
		ourBW = append(ourBW, float64(n)*float64(bs)/el.Seconds())
	}
	ours = fioResult{median(ourBW), median(ourIOPS), median(ourCPU)}
	fio = fioResult{median(fioBW), median(fioIOPS), median(fioCPU)}
	fioCache[key] = [2]fioResult{ours, fio}
	return ours, fio, true
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	slices.Sort(s)
	return s[len(s)/2]
}

func benchLocal(b *testing.B, rw string, bs int) {
	path := benchFile(b)
	d, err := Open(path, Options{MaxInFlight: benchQD})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ours, fio, haveFio := baseline(b, d, path, rw, bs)
	b.SetBytes(int64(bs))
	var sub0, q0, reap0 int64
	if d.ring != nil {
		sub0, q0, reap0 = d.ring.submitCalls.Load(), d.ring.queued.Load(), d.ring.reapCalls.Load()
	}
	b.ResetTimer()
	if _, _, err := workload(d, rw, bs, int64(b.N), time.Time{}); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	if d.ring != nil {
		if q := d.ring.queued.Load() - q0; q > 0 {
			// system calls per I/O on the AIO path (batching: < 1)
			b.ReportMetric(float64(d.ring.submitCalls.Load()-sub0)/float64(q), "submits/io")
			b.ReportMetric(float64(d.ring.reapCalls.Load()-reap0)/float64(q), "reaps/io")
		}
	}
	if !haveFio || fio.bwBytes <= 0 {
		return
	}
	if bs <= 64<<10 {
		b.ReportMetric(ours.iops, "IOPS")
		b.ReportMetric(fio.iops, "fio-IOPS")
	} else {
		b.ReportMetric(ours.bwBytes/1e6, "tier0-MB/s")
		b.ReportMetric(fio.bwBytes/1e6, "fio-MB/s")
	}
	b.ReportMetric(ours.bwBytes/fio.bwBytes, "ratio")
	// CPU time per I/O moves much less with the load of other processes
	// than the rates do: tier0's (the whole test process) and fio's.
	if ours.cpuPerIO > 0 && fio.cpuPerIO > 0 {
		b.ReportMetric(ours.cpuPerIO, "cpu-us/io")
		b.ReportMetric(fio.cpuPerIO, "fio-cpu-us/io")
		b.ReportMetric(fio.cpuPerIO/ours.cpuPerIO, "cpu-ratio")
	}
}

func BenchmarkLocal(b *testing.B) {
	b.Run("seq-read-1M", func(b *testing.B) { benchLocal(b, "read", 1<<20) })
	b.Run("seq-write-1M", func(b *testing.B) { benchLocal(b, "write", 1<<20) })
	b.Run("rand-read-4K", func(b *testing.B) { benchLocal(b, "randread", 4096) })
	b.Run("rand-write-4K", func(b *testing.B) { benchLocal(b, "randwrite", 4096) })
}
