package bench

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram is a log-linear latency histogram in the style of HdrHistogram:
// values below 32 ns are kept exactly; above that every power of two is
// split into 16 linear sub-buckets, so a recorded value is known to within
// about 3% (one part in 32) across the whole uint64 range. All 976 counters
// are allocated up front; Record does no allocation and only atomic adds, so
// many workers may record into one Histogram at once.
//
// The zero value is not ready for use; call NewHistogram.
type Histogram struct {
	counts []atomic.Uint64
	total  atomic.Uint64
	sum    atomic.Uint64 // nanoseconds; wraps only after ~584 years of latency
	min    atomic.Uint64
	max    atomic.Uint64
}

const (
	histSubBits  = 5
	histSubCount = 1 << histSubBits // 32
	histHalf     = histSubCount / 2 // 16
	// histBuckets covers every uint64: 32 exact values plus 16 sub-buckets
	// for each shift 1..59.
	histBuckets = histSubCount + (64-histSubBits)*histHalf
)

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	h := &Histogram{counts: make([]atomic.Uint64, histBuckets)}
	h.min.Store(math.MaxUint64)
	return h
}

func histIndex(v uint64) int {
	if v < histSubCount {
		return int(v)
	}
	s := bits.Len64(v) - histSubBits // shift that leaves v>>s in [16, 32)
	return histSubCount + (s-1)*histHalf + int(v>>uint(s)) - histHalf
}

// histBounds returns the smallest and largest value that map to bucket i.
func histBounds(i int) (lo, hi uint64) {
	if i < histSubCount {
		return uint64(i), uint64(i)
	}
	s := (i-histSubCount)/histHalf + 1
	sub := uint64((i-histSubCount)%histHalf + histHalf)
	lo = sub << uint(s)
	hi = lo + (1 << uint(s)) - 1
	return lo, hi
}

// Record adds one observation. Negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	h.counts[histIndex(v)].Add(1)
	h.total.Add(1)
	h.sum.Add(v)
	for {
		m := h.min.Load()
		if v >= m || h.min.CompareAndSwap(m, v) {
			break
		}
	}
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			break
		}
	}
}

// Merge adds every observation of o into h. o must not be recorded into
// concurrently if an exact snapshot is wanted.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if c := o.counts[i].Load(); c != 0 {
			h.counts[i].Add(c)
		}
	}
	h.total.Add(o.total.Load())
	h.sum.Add(o.sum.Load())
	if n := o.total.Load(); n > 0 {
		omin, omax := o.min.Load(), o.max.Load()
		for {
			m := h.min.Load()
			if omin >= m || h.min.CompareAndSwap(m, omin) {
				break
			}
		}
		for {
			m := h.max.Load()
			if omax <= m || h.max.CompareAndSwap(m, omax) {
				break
			}
		}
	}
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.total.Load() }

// Mean is the exact arithmetic mean (the sum is kept exactly).
func (h *Histogram) Mean() time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Min and Max are the exact extremes; zero when empty.
func (h *Histogram) Min() time.Duration {
	if h.total.Load() == 0 {
		return 0
	}
	return time.Duration(h.min.Load())
}

// Max: see Min.
func (h *Histogram) Max() time.Duration {
	if h.total.Load() == 0 {
		return 0
	}
	return time.Duration(h.max.Load())
}

// Quantile returns the value at quantile q in [0, 1]: the midpoint of the
// bucket holding the ceil(q*count)-th smallest observation, clamped to the
// exact min and max. Zero when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			lo, hi := histBounds(i)
			v := lo + (hi-lo)/2
			if mn := h.min.Load(); v < mn {
				v = mn
			}
			if mx := h.max.Load(); v > mx {
				v = mx
			}
			return time.Duration(v)
		}
	}
	return time.Duration(h.max.Load())
}

// CDFPoint is one step of a cumulative distribution: Fraction of the
// observations were at most LatencyNs.
type CDFPoint struct {
	LatencyNs int64   `json:"latency_ns"`
	Fraction  float64 `json:"fraction"`
}

// CDF returns one point per non-empty bucket (the bucket's upper bound,
// clamped to the exact max), in increasing order. At most 976 points; a
// typical latency distribution yields a few dozen.
func (h *Histogram) CDF() []CDFPoint {
	n := h.total.Load()
	if n == 0 {
		return nil
	}
	var out []CDFPoint
	var seen uint64
	mx := h.max.Load()
	for i := range h.counts {
		c := h.counts[i].Load()
		if c == 0 {
			continue
		}
		seen += c
		_, hi := histBounds(i)
		if hi > mx {
			hi = mx
		}
		out = append(out, CDFPoint{LatencyNs: int64(hi), Fraction: float64(seen) / float64(n)})
	}
	return out
}

// LatencySummary is the JSON form of a histogram: the figures a report shows
// and the CDF it plots.
type LatencySummary struct {
	Count  uint64     `json:"count"`
	MeanNs int64      `json:"mean_ns"`
	MinNs  int64      `json:"min_ns"`
	MaxNs  int64      `json:"max_ns"`
	P50Ns  int64      `json:"p50_ns"`
	P90Ns  int64      `json:"p90_ns"`
	P99Ns  int64      `json:"p99_ns"`
	P999Ns int64      `json:"p99_9_ns"`
	CDF    []CDFPoint `json:"cdf,omitempty"`
}

// Summary condenses h into a LatencySummary, CDF included.
func (h *Histogram) Summary() LatencySummary {
	return LatencySummary{
		Count:  h.Count(),
		MeanNs: int64(h.Mean()),
		MinNs:  int64(h.Min()),
		MaxNs:  int64(h.Max()),
		P50Ns:  int64(h.Quantile(0.50)),
		P90Ns:  int64(h.Quantile(0.90)),
		P99Ns:  int64(h.Quantile(0.99)),
		P999Ns: int64(h.Quantile(0.999)),
		CDF:    h.CDF(),
	}
}
