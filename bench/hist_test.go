package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistIndexBounds(t *testing.T) {
	// Every bucket's bounds map back to it, and buckets tile uint64.
	var prevHi uint64
	for i := 0; i < histBuckets; i++ {
		lo, hi := histBounds(i)
		if histIndex(lo) != i || histIndex(hi) != i {
			t.Fatalf("bucket %d bounds [%d, %d] map to %d, %d", i, lo, hi, histIndex(lo), histIndex(hi))
		}
		if i > 0 && lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		prevHi = hi
	}
	if prevHi != math.MaxUint64 {
		t.Fatalf("last bucket ends at %d, want MaxUint64", prevHi)
	}
}

// Oracle: quantiles agree with an exact sort within the 1/32 bucket width.
func TestHistQuantileOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := NewHistogram()
	var vals []int64
	var sum int64
	for i := 0; i < 20000; i++ {
		v := int64(math.Exp(rng.NormFloat64()*1.5 + 11)) // ~60 µs log-normal
		vals = append(vals, v)
		sum += v
		h.Record(time.Duration(v))
	}
	slices.Sort(vals)
	if h.Count() != uint64(len(vals)) {
		t.Fatalf("count %d, want %d", h.Count(), len(vals))
	}
	if got, want := int64(h.Mean()), sum/int64(len(vals)); got != want {
		t.Fatalf("mean %d, want exact %d", got, want)
	}
	if int64(h.Min()) != vals[0] || int64(h.Max()) != vals[len(vals)-1] {
		t.Fatalf("min/max %d/%d, want %d/%d", h.Min(), h.Max(), vals[0], vals[len(vals)-1])
	}
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(math.Ceil(q*float64(len(vals))))-1]
		got := int64(h.Quantile(q))
		if rel := math.Abs(float64(got-exact)) / float64(exact); rel > 1.0/32 {
			t.Errorf("q%.3f = %d, exact %d (%.1f%% off, want ≤ 3.1%%)", q, got, exact, rel*100)
		}
	}
	cdf := h.CDF()
	if len(cdf) == 0 || cdf[len(cdf)-1].Fraction != 1 || cdf[len(cdf)-1].LatencyNs != vals[len(vals)-1] {
		t.Fatalf("CDF must end at (max, 1): %+v", cdf[len(cdf)-1])
	}
	for i := 1; i < len(cdf); i++ {
		if cdf[i].LatencyNs <= cdf[i-1].LatencyNs || cdf[i].Fraction <= cdf[i-1].Fraction {
			t.Fatalf("CDF not increasing at %d: %+v %+v", i, cdf[i-1], cdf[i])
		}
	}
	m := NewHistogram()
	m.Merge(h)
	m.Merge(h)
	if m.Count() != 2*h.Count() || m.Quantile(0.5) != h.Quantile(0.5) || m.Max() != h.Max() {
		t.Fatalf("merge of h twice: count %d p50 %v max %v", m.Count(), m.Quantile(0.5), m.Max())
	}
}

func TestHistRecordAllocFree(t *testing.T) {
	h := NewHistogram()
	if n := testing.AllocsPerRun(1000, func() { h.Record(12345 * time.Nanosecond) }); n != 0 {
		t.Fatalf("Record allocates %.1f times per call, want 0", n)
	}
}

func BenchmarkHistRecord(b *testing.B) {
	h := NewHistogram()
	b.RunParallel(func(pb *testing.PB) {
		v := time.Duration(1000)
		for pb.Next() {
			h.Record(v)
			v = (v*7 + 13) % 10_000_000
		}
	})
}
