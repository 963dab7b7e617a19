package local

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// The local-device benchmarks compare tier0's O_DIRECT device with fio on
// the same file, in the same run, at the same queue depth (fio: libaio
// with iodepth=benchQD; tier0: benchQD goroutines). Each reports the
// device's MB/s (and IOPS) plus fio's figure and the ratio tier0/fio as
// extra metrics (goal: ratio >= 0.9). scripts/bench.d/blockdev.sh runs them.
//
// TIER0_BENCH_DIR picks the directory of the 256 MiB test file (default
// /var/tmp; it must support O_DIRECT); TIER0_BENCH_FIO_RUNTIME sets fio's
// run time (default 3s).

const (
	benchFileSize = 256 << 20
	benchQD       = 16
)

var (
	benchOnce sync.Once
	benchPath string
	benchErr  error
	fioMu     sync.Mutex
	fioCache  = map[string]fioResult{}
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
	bwBytes float64 // bytes per second
	iops    float64
}

// runFio measures the same workload with fio (cached per workload).
func runFio(b *testing.B, path, rw string, bs int) (fioResult, bool) {
	key := fmt.Sprintf("%s/%d", rw, bs)
	fioMu.Lock()
	defer fioMu.Unlock()
	if r, ok := fioCache[key]; ok {
		return r, true
	}
	if _, err := exec.LookPath("fio"); err != nil {
		b.Logf("fio not installed (scripts/deps.d/base.sh installs it): no baseline")
		return fioResult{}, false
	}
	runtime := os.Getenv("TIER0_BENCH_FIO_RUNTIME")
	if runtime == "" {
		runtime = "3s"
	}
	out, err := exec.Command("fio", "--name=tier0-baseline", "--filename="+path, "--direct=1",
		"--rw="+rw, fmt.Sprintf("--bs=%d", bs), "--ioengine=libaio", fmt.Sprintf("--iodepth=%d", benchQD),
		fmt.Sprintf("--size=%d", benchFileSize), "--time_based", "--runtime="+runtime,
		"--randrepeat=0", "--norandommap", "--output-format=json").Output()
	if err != nil {
		b.Logf("fio failed: %v", err)
		return fioResult{}, false
	}
	var rep struct {
		Jobs []struct {
			Read, Write struct {
				BwBytes float64 `json:"bw_bytes"`
				IOPS    float64 `json:"iops"`
			}
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Jobs) == 0 {
		b.Logf("cannot parse fio output: %v", err)
		return fioResult{}, false
	}
	j := rep.Jobs[0]
	r := fioResult{bwBytes: j.Read.BwBytes + j.Write.BwBytes, iops: j.Read.IOPS + j.Write.IOPS}
	fioCache[key] = r
	return r, true
}

func benchLocal(b *testing.B, rw string, bs int) {
	path := benchFile(b)
	fio, haveFio := runFio(b, path, rw, bs)
	d, err := Open(path, Options{MaxInFlight: benchQD})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	write := rw == "write" || rw == "randwrite"
	random := rw == "randread" || rw == "randwrite"
	blocks := int64(benchFileSize / bs)
	var next atomic.Int64
	var ops atomic.Int64
	b.SetBytes(int64(bs))
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < benchQD; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := blockdev.AlignedBuffer(bs)
			rng := rand.New(rand.NewSource(int64(w)))
			for ops.Add(1) <= int64(b.N) {
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
					b.Error(err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	b.StopTimer()
	bw := float64(b.N) * float64(bs) / el
	iops := float64(b.N) / el
	if bs <= 64<<10 {
		b.ReportMetric(iops, "IOPS")
	}
	if haveFio && fio.bwBytes > 0 {
		if bs <= 64<<10 {
			b.ReportMetric(fio.iops, "fio-IOPS")
		} else {
			b.ReportMetric(fio.bwBytes/1e6, "fio-MB/s")
		}
		b.ReportMetric(bw/fio.bwBytes, "ratio")
	}
}

func BenchmarkLocal(b *testing.B) {
	b.Run("seq-read-1M", func(b *testing.B) { benchLocal(b, "read", 1<<20) })
	b.Run("seq-write-1M", func(b *testing.B) { benchLocal(b, "write", 1<<20) })
	b.Run("rand-read-4K", func(b *testing.B) { benchLocal(b, "randread", 4096) })
	b.Run("rand-write-4K", func(b *testing.B) { benchLocal(b, "randwrite", 4096) })
}
