package bench

import (
	"fmt"
	"slices"
)

// RunFigures are one repetition's headline figures of a scenario.
type RunFigures struct {
	BytesPerS float64 `json:"bytes_per_s"`
	IOPS      float64 `json:"iops"`
	MeanLatNs int64   `json:"mean_lat_ns"`
	P99LatNs  int64   `json:"p99_lat_ns"`
}

// Metric names one headline figure of a measurement.
type Metric int

// Metrics.
const (
	MetricBytes   Metric = iota // bytes per second
	MetricIOPS                  // operations per second
	MetricMeanLat               // mean latency, ns
)

// PrimaryMetric is what a scenario is about: bandwidth for 1 MiB I/O,
// IOPS for smaller.
func (m Measurement) PrimaryMetric() Metric {
	if m.IOSize >= 1<<20 {
		return MetricBytes
	}
	return MetricIOPS
}

func (f RunFigures) get(k Metric) float64 {
	switch k {
	case MetricIOPS:
		return f.IOPS
	case MetricMeanLat:
		return float64(f.MeanLatNs)
	}
	return f.BytesPerS
}

// Figures is the measurement's own headline figures as a RunFigures.
func (m Measurement) Figures() RunFigures {
	return RunFigures{BytesPerS: m.BytesPerS, IOPS: m.IOPS, MeanLatNs: m.Latency.MeanNs, P99LatNs: m.Latency.P99Ns}
}

// Spread is a figure's median and range over a measurement's repetitions.
type Spread struct {
	Median, Min, Max float64
	// N is the number of repetitions (1: no spread known).
	N int
}

// Overlaps reports whether the ranges of s and o share a value.
func (s Spread) Overlaps(o Spread) bool { return s.Min <= o.Max && o.Min <= s.Max }

// Spread of metric k over m's repetitions (m's own figure when it has
// none recorded).
func (m Measurement) Spread(k Metric) Spread {
	runs := m.Runs
	if len(runs) == 0 {
		runs = []RunFigures{m.Figures()}
	}
	vals := make([]float64, len(runs))
	for i, r := range runs {
		vals[i] = r.get(k)
	}
	return spreadOf(vals)
}

func spreadOf(vals []float64) Spread {
	s := slices.Clone(vals)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return Spread{}
	}
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Spread{Median: med, Min: s[0], Max: s[n-1], N: n}
}

// Combine condenses repetitions of one scenario (same layer, state and
// scenario) into one measurement: the repetition with the median primary
// figure supplies the latency distribution and counts, the headline
// figures are each the median over the repetitions, and Runs lists every
// repetition's figures so that reports can show the range.
func Combine(reps []Measurement) (Measurement, error) {
	if len(reps) == 0 {
		return Measurement{}, fmt.Errorf("bench: no repetitions to combine")
	}
	for _, r := range reps[1:] {
		if r.Layer != reps[0].Layer || r.State != reps[0].State || r.Scenario != reps[0].Scenario {
			return Measurement{}, fmt.Errorf("bench: combining %s/%s/%s with %s/%s/%s: not repetitions of one scenario", reps[0].Layer, reps[0].State, reps[0].Scenario, r.Layer, r.State, r.Scenario)
		}
	}
	var runs []RunFigures
	for _, r := range reps {
		if len(r.Runs) > 0 {
			runs = append(runs, r.Runs...)
		} else {
			runs = append(runs, r.Figures())
		}
	}
	k := reps[0].PrimaryMetric()
	order := slices.Clone(reps)
	slices.SortStableFunc(order, func(a, b Measurement) int {
		av, bv := a.Figures().get(k), b.Figures().get(k)
		switch {
		case av < bv:
			return -1
		case av > bv:
			return 1
		}
		return 0
	})
	m := order[(len(order)-1)/2]
	m.Runs = runs
	vals := func(k Metric) []float64 {
		out := make([]float64, len(runs))
		for i, r := range runs {
			out[i] = r.get(k)
		}
		return out
	}
	m.BytesPerS = spreadOf(vals(MetricBytes)).Median
	m.IOPS = spreadOf(vals(MetricIOPS)).Median
	m.Latency.MeanNs = int64(spreadOf(vals(MetricMeanLat)).Median)
	var errs int64
	var verify *VerifyCounts
	for _, r := range reps {
		errs += r.Errors
		if m.FirstError == nil && r.FirstError != nil {
			m.FirstError = r.FirstError
		}
		if r.Verify != nil {
			if verify == nil {
				verify = &VerifyCounts{}
			}
			verify.Checked += r.Verify.Checked
			verify.OK += r.Verify.OK
			verify.Corrupt += r.Verify.Corrupt
			verify.Misplaced += r.Verify.Misplaced
			verify.Stale += r.Verify.Stale
			verify.Unwritten += r.Verify.Unwritten
		}
	}
	m.Verify = verify
	m.Errors = errs
	return m, nil
}
