package reports

import (
	"fmt"
	"math"

	"tier0/bench"
)

// arrayRates are the arrays of a run with their healthy and one-node-lost
// capacities for a scenario, in units of one drive's rate, when every
// array is bound by its drives (a closed loop of fixed queue depth per
// array, as validate runs). Derived for RAID-5 (one parity member) only.
//
// Per array of w = k+1 members (k data):
//   - sequential read: healthy w (every member streams its data chunks);
//     degraded w−1 (each surviving member reads all its chunks, data and
//     parity, and every stripe's missing chunk is rebuilt from them: k
//     useful chunks per w−1 member reads, at w−1 members' rate);
//   - sequential write (full stripes): healthy k (k of w chunks written
//     are data); degraded k (the missing member's chunk is skipped: w−1
//     writes carry k useful chunks);
//   - random read: healthy w; degraded (w−1)/E, E = (1−1/w)·1 + (1/w)·k
//     member reads per read (a read of the lost member's data costs k);
//   - random write (read-modify-write): healthy w/c, c = 2/r + 2/W drive
//     time per write (2 reads, 2 writes; r, W: a drive's read and write
//     IOPS); degraded (w−1)/E[c]: lost data member (1/w): (k−1)/r + 1/W;
//     lost parity (1/w): 1/W; otherwise 2/r + 2/W.
//
// An array that moved to another node complete keeps its healthy rate.
func arrayRates(res *bench.Results, scenario string) (healthy, degraded float64, why string) {
	f := res.Failover
	if f == nil || len(f.Arrays) == 0 {
		return 0, 0, "no failover record"
	}
	shape := map[string]bench.ArrayShape{}
	for _, a := range res.Run.Arrays {
		shape[a.Name] = a
	}
	r, w := 1.0, 1.0 // drive read and write IOPS (ratios only matter)
	if m := res.Run.Model; m != nil && m.Drive.ReadIOPS > 0 && m.Drive.WriteIOPS > 0 {
		r, w = m.Drive.ReadIOPS, m.Drive.WriteIOPS
	}
	for _, a := range f.Arrays {
		s, ok := shape[a.Array]
		if !ok {
			return 0, 0, fmt.Sprintf("no shape recorded for array %s", a.Array)
		}
		if s.Parity != 1 {
			return 0, 0, fmt.Sprintf("array %s is %s: derived for RAID-5 only", a.Array, s.Level)
		}
		n, k := float64(s.Data+1), float64(s.Data)
		var h, d float64
		switch scenario {
		case bench.ScenarioSeqRead1M:
			h, d = n, n-1
		case bench.ScenarioSeqWrite1M:
			h, d = k, k
		case bench.ScenarioRandRead4K:
			h, d = n, (n-1)/((1-1/n)+k/n)
		case bench.ScenarioRandWrite4K:
			full := 2/r + 2/w
			h = n / full
			d = (n - 1) / ((1/n)*((k-1)/r+1/w) + (1/n)*(1/w) + ((n-2)/n)*full)
		default:
			return 0, 0, "no theory for " + scenario
		}
		healthy += h
		if a.Degraded {
			degraded += d
		} else {
			degraded += h
		}
	}
	return healthy, degraded, ""
}

// retentionTheory is the drive-bound retention with one node lost.
func retentionTheory(res *bench.Results, scenario string) (float64, string) {
	h, d, why := arrayRates(res, scenario)
	if why != "" {
		return math.NaN(), why
	}
	return d / h, fmt.Sprintf("drive-bound: %.2f of %.2f drive-rates (%s)", d, h, theoryBasis(scenario))
}

// latencyTheory is the drive-bound mean latency change with one node
// lost: at a fixed queue depth per array, mean latency is the total
// queue depth over the total rate (Little's law), so it grows as the
// inverse of the retention.
func latencyTheory(res *bench.Results, scenario string) (float64, string) {
	h, d, why := arrayRates(res, scenario)
	if why != "" || d <= 0 {
		return math.NaN(), why
	}
	return h/d - 1, "drive-bound, fixed queue depth: 1 ÷ retention − 1 (Little's law)"
}

func theoryBasis(scenario string) string {
	switch scenario {
	case bench.ScenarioSeqRead1M:
		return "a degraded RAID-5 array streams from its w−1 survivors"
	case bench.ScenarioSeqWrite1M:
		return "full-stripe writes carry k data chunks healthy or degraded"
	case bench.ScenarioRandRead4K:
		return "a read of the lost member costs k member reads"
	case bench.ScenarioRandWrite4K:
		return "read-modify-write, 2 reads + 2 writes; cheaper when the lost member holds the data or the parity"
	}
	return ""
}

// boundBy is, under the drive model, the fraction of the modelled drives'
// capacity the measured figures reached, healthy and with one node lost
// (NaN when there is no model or no theory). Well below 1, something
// else than the modelled drives set the figure.
func boundBy(res *bench.Results, scenario string) (healthy, degraded float64) {
	l := served(res, scenario, bench.Healthy, bench.Degraded)
	return boundAt(res, l, bench.Healthy, scenario), boundAt(res, l, bench.Degraded, scenario)
}

// boundAt is the fraction of the modelled drives' capacity that layer's
// figure reached in state (NaN without a model, a theory or the figure).
func boundAt(res *bench.Results, layer bench.Layer, state bench.State, scenario string) float64 {
	nan := math.NaN()
	m := res.Run.Model
	if m == nil {
		return nan
	}
	h, d, why := arrayRates(res, scenario)
	if why != "" {
		return nan
	}
	unit, k := 1.0, bench.MetricIOPS
	switch scenario {
	case bench.ScenarioSeqRead1M:
		unit, k = m.Drive.ReadBytesPerS, bench.MetricBytes
	case bench.ScenarioSeqWrite1M:
		unit, k = m.Drive.WriteBytesPerS, bench.MetricBytes
	case bench.ScenarioRandRead4K:
		unit = m.Drive.ReadIOPS
	}
	capacity := h
	if state == bench.Degraded {
		capacity = d
	}
	if mm, ok := res.Find(layer, state, scenario); ok && capacity > 0 && unit > 0 {
		return mm.Spread(k).Median / (capacity * unit)
	}
	return nan
}
