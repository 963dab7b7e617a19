package perf

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/local"
)

// counting wraps a device and counts the I/Os at each offset.
type counting struct {
	blockdev.Device
	mu            sync.Mutex
	reads, writes map[int64]int
	failAt        int64
	badLen        bool
}

func newCounting(t *testing.T, size int64) *counting {
	m, err := local.NewMemory(size, 4096)
	if err != nil {
		t.Fatal(err)
	}
	return &counting{Device: m, reads: map[int64]int{}, writes: map[int64]int{}, failAt: -1}
}

func (c *counting) note(m map[int64]int, p []byte, off int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m[off]++
	if len(p) != 8192 {
		c.badLen = true
	}
	if off == c.failAt {
		return blockdev.ErrIO
	}
	return nil
}

func (c *counting) ReadAt(p []byte, off int64) (int, error) {
	if err := c.note(c.reads, p, off); err != nil {
		return 0, err
	}
	return c.Device.ReadAt(p, off)
}

func (c *counting) WriteAt(p []byte, off int64) (int, error) {
	if err := c.note(c.writes, p, off); err != nil {
		return 0, err
	}
	return c.Device.WriteAt(p, off)
}

func TestSequentialWriteCoversRegionOnce(t *testing.T) {
	d := newCounting(t, 4<<20)
	r, err := Run(context.Background(), d, Config{Workload: SeqWrite, BlockSize: 8192, QueueDepth: 8, Ops: 128, Region: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if r.IOs != 128 || r.Bytes != 1<<20 || len(d.writes) != 128 || len(d.reads) != 0 || d.badLen {
		t.Fatalf("result %+v, %d offsets written, %d read, bad length %v; want 128 distinct 8 KiB writes", r, len(d.writes), len(d.reads), d.badLen)
	}
	for off, n := range d.writes {
		if n != 1 || off%8192 != 0 || off >= 1<<20 {
			t.Fatalf("offset %d written %d times; want each 8 KiB slot of the first MiB once", off, n)
		}
	}
	if r.Latency.P50 > r.Latency.P99 || r.Latency.P99 > r.Latency.P999 || r.Latency.P999 > r.Latency.Max*1.04 || r.Latency.Max <= 0 {
		t.Fatalf("latency percentiles out of order: %+v", r.Latency)
	}
	if r.CPUPerIO <= 0 || r.IOPS <= 0 || r.MiBps <= 0 {
		t.Fatalf("no rates or CPU figures: %+v", r)
	}
}

func TestRandomReadStaysInRegionForDuration(t *testing.T) {
	d := newCounting(t, 4<<20)
	r, err := Run(context.Background(), d, Config{Workload: RandRead, BlockSize: 8192, QueueDepth: 4, Duration: 50 * time.Millisecond, Region: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if r.IOs == 0 || len(d.writes) != 0 {
		t.Fatalf("result %+v, %d writes; want reads only", r, len(d.writes))
	}
	var total int64
	for off, n := range d.reads {
		if off%8192 != 0 || off >= 1<<20 {
			t.Fatalf("read at %d: outside the 8 KiB slots of the first MiB", off)
		}
		total += int64(n)
	}
	if total != r.IOs {
		t.Fatalf("device saw %d reads, result says %d", total, r.IOs)
	}
}

func TestErrorStopsRun(t *testing.T) {
	d := newCounting(t, 1<<20)
	d.failAt = 5 * 8192
	r, err := Run(context.Background(), d, Config{Workload: SeqRead, BlockSize: 8192, QueueDepth: 1, Duration: time.Minute})
	if !errors.Is(err, blockdev.ErrIO) || !strings.Contains(err.Error(), "at 40960") {
		t.Fatalf("error %v, want the device's ErrIO naming offset 40960", err)
	}
	if r.IOs != 5 {
		t.Fatalf("%d I/Os completed; want the 5 before the failing one (the run stops there)", r.IOs)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Workload: "mixed", BlockSize: 4096, Ops: 1}, `"mixed"`},
		{Config{Workload: RandRead, BlockSize: 1000, Ops: 1}, "block size 1000"},
		{Config{Workload: RandRead, BlockSize: 4096, QueueDepth: -1, Ops: 1}, "queue depth -1"},
		{Config{Workload: RandRead, BlockSize: 4096}, "duration"},
		{Config{Workload: RandRead, BlockSize: 8192, Region: 4096, Ops: 1}, "region"},
	} {
		if err := tc.c.Validate(1<<20, 4096); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %s", tc.c, err, tc.want)
		}
	}
}

// TestDurationCountsFromStart: a timed run lasts at least its duration
// from the first I/O, however long preparing the write buffers took (the
// timer used to start before that, so a short write run with large
// buffers ended before its first I/O and reported nothing).
func TestDurationCountsFromStart(t *testing.T) {
	d := newCounting(t, 4<<20)
	const dur = 50 * time.Millisecond
	r, err := Run(context.Background(), d, Config{Workload: SeqWrite, BlockSize: 1 << 20, QueueDepth: 32, Duration: dur})
	if err != nil {
		t.Fatal(err)
	}
	if r.Seconds < dur.Seconds() || r.IOs == 0 {
		t.Fatalf("a %v write run measured %.4f s and %d I/Os; want at least %v of I/O", dur, r.Seconds, r.IOs, dur)
	}
}
