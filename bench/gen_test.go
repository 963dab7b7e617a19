package bench

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

const mib = 1 << 20

func fill(t *testing.T, gen uint64, targets ...Target) *Result {
	t.Helper()
	res, err := Run(context.Background(), Config{Pattern: SeqWrite, IOSize: 256 << 10, QueueDepth: 3, Passes: 1, Verify: true, Generation: gen}, targets)
	if err != nil {
		t.Fatalf("fill: %v", err)
	}
	return res
}

func TestFillThenVerifyAllUnits(t *testing.T) {
	a, b := newMemDev(4*mib, 512), newMemDev(3*mib, 4096)
	targets := []Target{{ID: "A1", Dev: a}, {ID: "B1", Dev: b, Offset: mib}}
	wr := fill(t, 7, targets...)
	if want := int64(4*mib + 2*mib); wr.WriteBytes != want {
		t.Fatalf("one pass wrote %d bytes, want exactly the regions' %d", wr.WriteBytes, want)
	}
	res, err := Run(context.Background(), Config{Pattern: SeqRead, IOSize: mib, QueueDepth: 4, Passes: 1, Verify: true, MinGeneration: 7}, targets)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64((4*mib + 2*mib) / VerifyUnit); res.Verify.Checked != want || res.Verify.OK != want {
		t.Fatalf("verify %+v, want %d checked and ok", res.Verify, want)
	}
	if err := res.VerifyErr(); err != nil {
		t.Fatal(err)
	}
	// B1's first MiB lies outside its region and was never written.
	if !allZero(b.data[:mib]) {
		t.Fatal("fill wrote outside the target region")
	}
}

func TestVerifyCatchesCorruption(t *testing.T) {
	d := newMemDev(2*mib, 512)
	targets := []Target{{ID: "C2", Dev: d}}
	fill(t, 1, targets...)
	d.flip(5*VerifyUnit + 1000) // payload byte of unit 5
	d.flip(9 * VerifyUnit)      // magic of unit 9
	res, err := Run(context.Background(), Config{Pattern: RandRead, IOSize: 64 << 10, QueueDepth: 2, Passes: 3, Verify: true}, targets)
	if err != nil {
		t.Fatal(err)
	}
	// Three random passes over 32 slots almost surely read both units, but
	// a sequential pass makes the count exact.
	seq, err := Run(context.Background(), Config{Pattern: SeqRead, IOSize: 64 << 10, QueueDepth: 2, Passes: 1, Verify: true}, targets)
	if err != nil {
		t.Fatal(err)
	}
	if seq.Verify.Corrupt != 2 || seq.Verify.OK != seq.Verify.Checked-2 {
		t.Fatalf("sequential verify %+v: want exactly 2 corrupt units", seq.Verify)
	}
	if !errors.Is(seq.VerifyErr(), ErrVerify) {
		t.Fatalf("VerifyErr = %v, want ErrVerify", seq.VerifyErr())
	}
	if res.Verify.Corrupt == 0 {
		t.Fatalf("random verify read %d units and found no corruption", res.Verify.Checked)
	}
}

func TestVerifyMisplacedStaleUnwritten(t *testing.T) {
	d := newMemDev(mib, 4096)
	fill(t, 3, Target{ID: "D1", Dev: d, Length: mib / 2})
	check := func(id string, minGen uint64) VerifyCounts {
		res, err := Run(context.Background(), Config{Pattern: SeqRead, IOSize: 4096, Passes: 1, Verify: true, MinGeneration: minGen}, []Target{{ID: id, Dev: d}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Verify
	}
	half := int64(mib / 2 / VerifyUnit)
	if v := check("D1", 3); v.OK != half || v.Unwritten != half {
		t.Errorf("own id: %+v, want %d ok and %d unwritten", v, half, half)
	}
	if v := check("E1", 0); v.Misplaced != half {
		t.Errorf("other id: %+v, want %d misplaced", v, half)
	}
	if v := check("D1", 4); v.Stale != half {
		t.Errorf("min generation 4 over generation 3: %+v, want %d stale", v, half)
	}
}

func TestMixedVerifyWhileWriting(t *testing.T) {
	d := newMemDev(2*mib, 512)
	targets := []Target{{ID: "M", Dev: d}}
	fill(t, 1, targets...)
	res, err := Run(context.Background(), Config{Pattern: Mixed, ReadFraction: 0.5, IOSize: 4096, QueueDepth: 8, ByteLimit: 8 * mib, Verify: true, Generation: 2, MinGeneration: 1}, targets)
	if err != nil {
		t.Fatal(err)
	}
	if res.ReadOps == 0 || res.WriteOps == 0 {
		t.Fatalf("mixed run did %d reads and %d writes; want both", res.ReadOps, res.WriteOps)
	}
	if res.Bytes != 8*mib {
		t.Fatalf("byte limit 8 MiB, did %d", res.Bytes)
	}
	if err := res.VerifyErr(); err != nil {
		t.Fatalf("concurrent readers and writers on disjoint slots: %v", err)
	}
}

func TestErrorsToleratedAndCounted(t *testing.T) {
	d := newMemDev(mib, 512)
	var calls atomic.Int64
	d.setFail(func(off int64, write bool) error {
		if n := calls.Add(1); n > 50 && n <= 80 {
			return blockdev.ErrNoPath
		}
		return nil
	})
	res, err := Run(context.Background(), Config{Pattern: RandRead, IOSize: 4096, QueueDepth: 2, ByteLimit: 200 * 4096, TolerateErrors: true, ErrorBackoff: time.Microsecond, Interval: time.Hour}, []Target{{ID: "X", Dev: d}})
	if err != nil {
		t.Fatalf("tolerating run returned %v", err)
	}
	if res.Errors != 30 || res.Ops != 170 {
		t.Fatalf("errors %d ops %d, want 30 and 170", res.Errors, res.Ops)
	}
	if res.FirstError == nil || res.FirstError.Sentinel != "ErrNoPath" || res.Targets[0].FirstError == nil {
		t.Fatalf("first error %+v, want one classified ErrNoPath", res.FirstError)
	}
	if len(res.Series) != 1 || res.Series[0].Errors != 30 {
		t.Fatalf("series %+v, want one bucket with 30 errors", res.Series)
	}

	calls.Store(0)
	res, err = Run(context.Background(), Config{Pattern: SeqWrite, IOSize: 4096, QueueDepth: 1, Passes: 1}, []Target{{ID: "X", Dev: d}})
	if !errors.Is(err, blockdev.ErrNoPath) {
		t.Fatalf("intolerant run: err %v, want ErrNoPath", err)
	}
	if res == nil || res.Ops != 50 || res.Errors != 1 {
		t.Fatalf("intolerant run should stop at the first error with a partial result; got %+v", res)
	}
}

func TestSeriesAndStall(t *testing.T) {
	d := newMemDev(mib, 512)
	var calls atomic.Int64
	d.setFail(func(off int64, write bool) error {
		if calls.Add(1) == 200 {
			time.Sleep(120 * time.Millisecond) // a failover-like hang
		}
		return nil
	})
	res, err := Run(context.Background(), Config{Pattern: RandWrite, IOSize: 4096, QueueDepth: 1, Duration: 300 * time.Millisecond, Interval: 20 * time.Millisecond}, []Target{{ID: "S", Dev: d}})
	if err != nil {
		t.Fatal(err)
	}
	var ops, bytes int64
	empty := 0
	for i, b := range res.Series {
		if b.Index != i {
			t.Fatalf("bucket %d has index %d", i, b.Index)
		}
		ops += b.Ops
		bytes += b.Bytes
		if b.Ops == 0 {
			empty++
		}
	}
	if ops != res.Ops || bytes != res.Bytes {
		t.Fatalf("series sums %d ops %d bytes, totals %d %d", ops, bytes, res.Ops, res.Bytes)
	}
	if empty < 4 {
		t.Fatalf("a 120 ms hang at 20 ms buckets should leave ≥4 empty buckets, got %d", empty)
	}
	st := res.Targets[0].LongestStall
	if st.Duration < 120*time.Millisecond || st.To.Sub(st.From) != st.Duration {
		t.Fatalf("longest stall %+v, want ≥120ms", st)
	}
	if res.Latency.Max() < 120*time.Millisecond {
		t.Fatalf("max latency %v, want ≥120ms", res.Latency.Max())
	}
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	d := newMemDev(mib, 512)
	cfg := Config{Pattern: RandRead, IOSize: 4096, QueueDepth: 1, Interval: time.Hour}
	run := func(n int64) uint64 {
		cfg.ByteLimit = n * 4096
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		if _, err := Run(context.Background(), cfg, []Target{{ID: "H", Dev: d}}); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&b)
		return b.Mallocs - a.Mallocs
	}
	small, large := run(100), run(20100)
	if large > small+50 {
		t.Fatalf("20000 extra I/Os cost %d extra allocations; the hot path must not allocate", large-small)
	}
}

func TestConfigErrors(t *testing.T) {
	d := newMemDev(mib, 4096)
	cases := []struct {
		name string
		cfg  Config
		t    []Target
	}{
		{"pattern", Config{Pattern: "zigzag", IOSize: 4096, Passes: 1}, []Target{{ID: "a", Dev: d}}},
		{"no stop", Config{Pattern: SeqRead, IOSize: 4096}, []Target{{ID: "a", Dev: d}}},
		{"verify size", Config{Pattern: SeqRead, IOSize: 512, Passes: 1, Verify: true}, []Target{{ID: "a", Dev: d}}},
		{"block size", Config{Pattern: SeqRead, IOSize: 2048, Passes: 1}, []Target{{ID: "a", Dev: d}}},
		{"dup id", Config{Pattern: SeqRead, IOSize: 4096, Passes: 1}, []Target{{ID: "a", Dev: d}, {ID: "a", Dev: d}}},
		{"region", Config{Pattern: SeqRead, IOSize: 4096, Passes: 1}, []Target{{ID: "a", Dev: d, Offset: mib}}},
		{"no targets", Config{Pattern: SeqRead, IOSize: 4096, Passes: 1}, nil},
	}
	for _, c := range cases {
		if _, err := Run(context.Background(), c.cfg, c.t); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err %v, want ErrConfig", c.name, err)
		}
	}
}

func TestMarkMeasuresResumption(t *testing.T) {
	d := newMemDev(mib, 512)
	var holdUntil atomic.Int64 // unix ns; requests issued before it wait for it
	d.setFail(func(off int64, write bool) error {
		if u := holdUntil.Load(); u != 0 {
			if wait := time.Until(time.Unix(0, u)); wait > 0 {
				time.Sleep(wait)
			}
		}
		return nil
	})
	h, err := Start(context.Background(), Config{Pattern: RandRead, IOSize: 4096, QueueDepth: 2, Duration: 400 * time.Millisecond, Interval: 50 * time.Millisecond}, []Target{{ID: "B", Dev: d}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	holdUntil.Store(time.Now().Add(150 * time.Millisecond).UnixNano())
	at, err := h.Mark("node B killed")
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Marks) != 1 || !res.Marks[0].At.Equal(at) || res.Marks[0].Label != "node B killed" {
		t.Fatalf("marks %+v", res.Marks)
	}
	// Everything issued after the mark waited for holdUntil.
	hold := time.Unix(0, holdUntil.Load()).Sub(at)
	d0, ok := res.Marks[0].Resumed("B")
	if !ok || d0 < hold-time.Millisecond || d0 > hold+time.Second {
		t.Fatalf("resumed after %v (ok %v), want just over the %v hold", d0, ok, hold)
	}
	rec, ok := FailoverFrom("B", res.Marks[0], "B", "s")
	if !ok || rec.Duration != d0 || !rec.KilledAt.Equal(at) {
		t.Fatalf("failover record %+v from mark %+v", rec, res.Marks[0])
	}
	if ts := SeriesFrom("s", res); len(ts.Markers) != 1 || !ts.Markers[0].At.Equal(at) {
		t.Fatalf("series markers %+v, want the mark", ts.Markers)
	}
	tm := res.Marks[0].Targets[0]
	if tm.FirstDone.After(tm.FirstIssued) || tm.FirstDone.Before(at) {
		t.Fatalf("first done %v, first issued %v, mark %v", tm.FirstDone, tm.FirstIssued, at)
	}
	for i := 1; i < MaxMarks; i++ {
		if _, err := h.Mark("x"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.Mark("one too many"); !errors.Is(err, ErrTooManyMarks) {
		t.Fatalf("mark %d: %v, want ErrTooManyMarks", MaxMarks+1, err)
	}
}
