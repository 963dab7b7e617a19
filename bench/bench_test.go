package bench

import (
	"context"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// BenchmarkLoadgenOverhead runs b.N 4 KiB random reads against an in-memory
// device through the generator and reports its time per I/O as a ratio to
// a plain ReadAt loop over the same device measured in the same run
// ("x-direct"): the generator's own cost per I/O.
func BenchmarkLoadgenOverhead(b *testing.B) {
	dev := blockdev.NewMem(64<<20, 4096)
	buf := blockdev.AlignedBuffer(4096)
	n := int64(b.N)
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		if _, err := dev.ReadAt(buf, (i*7919)%(64<<20/4096)*4096); err != nil {
			b.Fatal(err)
		}
	}
	direct := time.Since(t0)
	b.ResetTimer()
	res, err := Run(context.Background(), Config{Pattern: RandRead, IOSize: 4096, QueueDepth: 1, ByteLimit: n * 4096}, []Target{{ID: "m", Dev: dev}})
	if err != nil {
		b.Fatal(err)
	}
	if res.Ops != n {
		b.Fatalf("ran %d I/Os, want %d", res.Ops, n)
	}
	b.ReportMetric(float64(res.Elapsed)/float64(max(direct, 1)), "x-direct")
}

// BenchmarkVerifyFill measures building verify blocks (header, pattern,
// CRC32C) per 4 KiB unit.
func BenchmarkVerifyFill(b *testing.B) {
	u := make([]byte, VerifyUnit)
	b.SetBytes(VerifyUnit)
	for i := 0; b.Loop(); i++ {
		FillUnit(u, 1, uint64(i), 1)
	}
}
