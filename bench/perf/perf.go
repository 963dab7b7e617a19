package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tier0/bench"
	"tier0/daemon/blockdev"
)

// Workloads.
const (
	RandRead  = "randread"
	RandWrite = "randwrite"
	SeqRead   = "read"
	SeqWrite  = "write"
)

// Config is one run.
type Config struct {
	Workload   string        // RandRead, RandWrite, SeqRead or SeqWrite
	BlockSize  int           // bytes per I/O, a multiple of the device's block size
	QueueDepth int           // I/Os in flight (workers); default 32
	Duration   time.Duration // run this long ...
	Ops        int64         // ... or this many I/Os (when > 0, Duration is ignored)
	// Region limits the I/O to [0, Region) of the device (0: all of it).
	Region int64
	// Seed makes the random offsets repeatable (0: a fixed default).
	Seed uint64
}

// Latency is a summary in microseconds.
type Latency struct {
	Mean float64 `json:"mean_us"`
	P50  float64 `json:"p50_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p99_9_us"`
	Max  float64 `json:"max_us"`
}

// Result is what a run measured. CPU figures are this whole process's
// (getrusage RUSAGE_SELF): with an in-process target they include it.
type Result struct {
	Workload   string  `json:"workload"`
	BlockSize  int     `json:"block_size"`
	QueueDepth int     `json:"queue_depth"`
	IOs        int64   `json:"ios"`
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
	IOPS       float64 `json:"iops"`
	MiBps      float64 `json:"mib_per_s"`
	Latency    Latency `json:"latency"`
	// CPUUser and CPUSys are seconds of CPU time the process used during
	// the run; CPUPerIO is their sum in microseconds per I/O, CPUPerMiB
	// per MiB moved.
	CPUUser   float64 `json:"cpu_user_s"`
	CPUSys    float64 `json:"cpu_sys_s"`
	CPUPerIO  float64 `json:"cpu_us_per_io"`
	CPUPerMiB float64 `json:"cpu_us_per_mib"`
}

// String is the one-line human summary.
func (r Result) String() string {
	return fmt.Sprintf("%s bs=%d qd=%d: %d I/Os in %.2f s, %.0f IOPS, %.1f MiB/s; latency us p50 %.0f p99 %.0f p99.9 %.0f max %.0f; CPU %.2f us/IO (user %.2f s, sys %.2f s)",
		r.Workload, r.BlockSize, r.QueueDepth, r.IOs, r.Seconds, r.IOPS, r.MiBps,
		r.Latency.P50, r.Latency.P99, r.Latency.P999, r.Latency.Max, r.CPUPerIO, r.CPUUser, r.CPUSys)
}

// Validate checks cfg against a device of the given size and block size
// and fills in defaults.
func (c *Config) Validate(size int64, blockSize int) error {
	switch c.Workload {
	case RandRead, RandWrite, SeqRead, SeqWrite:
	default:
		return fmt.Errorf("workload %q: expected randread, randwrite, read or write", c.Workload)
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = 32
	}
	if c.QueueDepth < 1 || c.QueueDepth > 4096 {
		return fmt.Errorf("queue depth %d: expected 1 to 4096", c.QueueDepth)
	}
	if c.BlockSize <= 0 || c.BlockSize%blockSize != 0 {
		return fmt.Errorf("block size %d: expected a positive multiple of the device's %d-byte blocks", c.BlockSize, blockSize)
	}
	if c.Region == 0 || c.Region > size {
		c.Region = size
	}
	c.Region = c.Region / int64(c.BlockSize) * int64(c.BlockSize)
	if c.Region < int64(c.BlockSize) {
		return fmt.Errorf("region of %d bytes holds no %d-byte I/O: use a larger device or region", c.Region, c.BlockSize)
	}
	if c.Ops <= 0 && c.Duration <= 0 {
		return errors.New("give a duration or an I/O count")
	}
	if c.Seed == 0 {
		c.Seed = 0x7469657230 // "tier0"
	}
	return nil
}

func cpuTimes() (user, sys time.Duration) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// Run runs cfg on dev until the duration or I/O count is done, ctx ends,
// or an I/O fails (the first error is returned with what was measured).
func Run(ctx context.Context, dev blockdev.Device, cfg Config) (Result, error) {
	if err := cfg.Validate(dev.Size(), dev.BlockSize()); err != nil {
		return Result{}, err
	}
	write := cfg.Workload == RandWrite || cfg.Workload == SeqWrite
	random := cfg.Workload == RandRead || cfg.Workload == RandWrite
	slots := uint64(cfg.Region / int64(cfg.BlockSize))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		issued, seq atomic.Int64
		stop        atomic.Bool
		errOnce     sync.Once
		firstErr    error
		wg          sync.WaitGroup
	)
	go func() { <-ctx.Done(); stop.Store(true) }()
	hists := make([]*bench.Histogram, cfg.QueueDepth)
	bufs := make([][]byte, cfg.QueueDepth)
	for w := range bufs {
		hists[w] = bench.NewHistogram()
		bufs[w] = blockdev.AlignedBuffer(cfg.BlockSize)
		if write {
			r := rand.New(rand.NewPCG(cfg.Seed, uint64(w)))
			for i := 0; i+8 <= len(bufs[w]); i += 8 {
				binary.LittleEndian.PutUint64(bufs[w][i:], r.Uint64())
			}
		}
	}
	u0, s0 := cpuTimes()
	start := time.Now()
	// The clock starts now, after the buffers are ready.
	if cfg.Ops <= 0 {
		t := time.AfterFunc(cfg.Duration, cancel)
		defer t.Stop()
	}
	for w := 0; w < cfg.QueueDepth; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf, h := bufs[w], hists[w]
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(w)+1<<32))
			for !stop.Load() {
				if cfg.Ops > 0 && issued.Add(1) > cfg.Ops {
					return
				}
				var slot uint64
				if random {
					slot = rng.Uint64N(slots)
				} else {
					slot = uint64(seq.Add(1)-1) % slots
				}
				off := int64(slot) * int64(cfg.BlockSize)
				t := time.Now()
				var err error
				if write {
					_, err = dev.WriteAt(buf, off)
				} else {
					_, err = dev.ReadAt(buf, off)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("%s of %d bytes at %d: %w", cfg.Workload, cfg.BlockSize, off, err) })
					stop.Store(true)
					return
				}
				h.Record(time.Since(t))
			}
		}(w)
	}
	wg.Wait()
	el := time.Since(start)
	u1, s1 := cpuTimes()
	all := bench.NewHistogram()
	for _, h := range hists {
		all.Merge(h)
	}
	n := int64(all.Count())
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	r := Result{Workload: cfg.Workload, BlockSize: cfg.BlockSize, QueueDepth: cfg.QueueDepth, IOs: n,
		Bytes: n * int64(cfg.BlockSize), Seconds: el.Seconds(),
		Latency: Latency{Mean: us(all.Mean()), P50: us(all.Quantile(0.5)), P99: us(all.Quantile(0.99)),
			P999: us(all.Quantile(0.999)), Max: us(all.Max())},
		CPUUser: (u1 - u0).Seconds(), CPUSys: (s1 - s0).Seconds()}
	if el > 0 {
		r.IOPS = float64(n) / el.Seconds()
		r.MiBps = float64(r.Bytes) / (1 << 20) / el.Seconds()
	}
	if n > 0 {
		cpu := float64((u1-u0)+(s1-s0)) / 1e3
		r.CPUPerIO = cpu / float64(n)
		r.CPUPerMiB = cpu / (float64(r.Bytes) / (1 << 20))
	}
	return r, firstErr
}
