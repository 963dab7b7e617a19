package reports

import (
	"fmt"
	"math"
	"time"

	"tier0/bench"
)

// Kind says how a comparison value is expressed.
type Kind int

// Value kinds.
const (
	// Ratio: a fraction shown as a percentage (98.5%).
	Ratio Kind = iota
	// Change: a relative change shown signed (+0.6%).
	Change
	// Seconds: a duration.
	Seconds
)

// Row is one line of the side-by-side comparison with the seed.
type Row struct {
	Metric string
	// Group is "efficiency", "retention", "latency" or "time".
	Group string
	Kind  Kind
	// Tier0 is this run's value; NaN when it could not be computed, and
	// then Missing says why.
	Tier0   float64
	Missing string
	// Seed is the seed's value (NaN when it published none); SeedText is
	// how the seed states it.
	Seed     float64
	SeedText string
	// Basis says what tier0's value divides by what.
	Basis string
	// Lo and Hi are the range of tier0's value over the repetitions
	// (numerator's extremes over the denominator's opposite ones); Runs
	// the repetitions behind it (1: no spread known).
	Lo, Hi float64
	Runs   int
	// Noise: the two figures' ranges overlap, so the difference between
	// them is within run-to-run noise and not a finding.
	Noise bool
	// Theory is the drive-bound theoretical value (NaN when not derived);
	// TheoryText how it is derived.
	Theory     float64
	TheoryText string
	// BoundHealthy and BoundDegraded are, under the drive model, the
	// fractions of the modelled drives' capacity the two figures reached,
	// healthy and with one node lost (an efficiency row: the frontend and
	// the block layer, healthy; NaN: no model or no theory).
	BoundHealthy, BoundDegraded float64
}

// CPUBound reports whether, under the drive model (modelled), one of the
// row's figures reached below modelBound of the modelled drives' capacity:
// then this machine's CPUs or tier0's own path set it, not the model, and
// the row is no finding.
func (r Row) CPUBound(modelled bool) bool {
	return modelled && (r.BoundHealthy < modelBound || r.BoundDegraded < modelBound)
}

// Impossible reports whether the row's figures, beyond noise, are ones the
// design rules out: a node loss that speeds I/O up or makes it faster, a
// layer on top faster than the one below (judge's first test).
func (r Row) Impossible() bool {
	if !r.Has() || r.Noise || r.Runs <= 1 {
		return false
	}
	one := 1.0
	if r.Kind == Change {
		one = 0
	}
	switch r.Group {
	case "retention", "efficiency":
		return r.Lo > one+claimTolerance
	case "latency":
		return r.Hi < one-claimTolerance
	}
	return false
}

// SideText is Tier0Text as the side-by-side table prints it beside the
// seed's figure: a figure the design rules out or the model did not set
// says so first, as its verdict does.
func (r Row) SideText(modelled bool) string {
	switch {
	case r.Impossible():
		return "impossible for the design (this machine's CPUs set it), not a finding: " + r.Tier0Text()
	case r.Has() && r.CPUBound(modelled):
		return "CPU-bound, not a finding: " + r.Tier0Text()
	}
	return r.Tier0Text()
}

// Has reports whether tier0's value is available.
func (r Row) Has() bool { return !math.IsNaN(r.Tier0) }

// Tier0Text formats tier0's value with its range, or "n/a (reason)".
// A value whose figures are within noise of each other says so first.
func (r Row) Tier0Text() string {
	if !r.Has() {
		return "n/a (" + r.Missing + ")"
	}
	v := formatValue(r.Kind, r.Tier0)
	switch {
	case r.Kind == Seconds:
		return v
	case r.Runs <= 1:
		return v + " (1 run: spread unknown)"
	case r.Noise:
		return fmt.Sprintf("within noise: %s (range %s to %s, %d runs)", v, formatValue(r.Kind, r.Lo), formatValue(r.Kind, r.Hi), r.Runs)
	}
	return fmt.Sprintf("%s (range %s to %s, %d runs)", v, formatValue(r.Kind, r.Lo), formatValue(r.Kind, r.Hi), r.Runs)
}

// TheoryValue formats the theoretical value, or "—".
func (r Row) TheoryValue() string {
	if math.IsNaN(r.Theory) {
		return "—"
	}
	return formatValue(r.Kind, r.Theory)
}

func formatValue(k Kind, v float64) string {
	switch k {
	case Change:
		return fmt.Sprintf("%+.1f%%", v*100)
	case Seconds:
		return fmtDuration(time.Duration(v * float64(time.Second)))
	}
	return fmt.Sprintf("%.1f%%", v*100)
}

// served returns the layer an application sees for scenario: the frontend
// when it was measured in every given state, else the block layer.
func served(res *bench.Results, scenario string, states ...bench.State) bench.Layer {
	for _, st := range states {
		if _, ok := res.Find(bench.LayerFrontend, st, scenario); !ok {
			return bench.LayerBlock
		}
	}
	return bench.LayerFrontend
}

// spreadRatio is num/den of two figures with repetitions: the ratio of
// the medians, the range from the extremes, and whether the two ranges
// overlap (the difference is within noise).
type spreadRatio struct {
	v, lo, hi float64
	runs      int
	noise     bool
}

func ratioOf(n, d bench.Spread) spreadRatio {
	r := spreadRatio{v: n.Median / d.Median, lo: n.Min / d.Max, hi: n.Max / d.Min, runs: min(n.N, d.N)}
	r.noise = r.runs > 1 && n.Overlaps(d)
	return r
}

// ratio computes num/den of two measurements' throughput (or IOPS).
func ratio(res *bench.Results, nl bench.Layer, ns bench.State, dl bench.Layer, ds bench.State, scenario string, iops bool) (spreadRatio, string) {
	k := bench.MetricBytes
	if iops {
		k = bench.MetricIOPS
	}
	bad := spreadRatio{v: math.NaN(), lo: math.NaN(), hi: math.NaN()}
	n, ok := res.Find(nl, ns, scenario)
	if !ok {
		return bad, fmt.Sprintf("no %s %s %s measurement", nl, ns, scenario)
	}
	d, ok := res.Find(dl, ds, scenario)
	if !ok {
		return bad, fmt.Sprintf("no %s %s %s measurement", dl, ds, scenario)
	}
	if d.Spread(k).Min <= 0 {
		return bad, fmt.Sprintf("%s %s %s measured zero", dl, ds, scenario)
	}
	return ratioOf(n.Spread(k), d.Spread(k)), ""
}

func latChange(res *bench.Results, scenario string) (spreadRatio, string, bench.Layer) {
	bad := spreadRatio{v: math.NaN(), lo: math.NaN(), hi: math.NaN()}
	l := served(res, scenario, bench.Healthy, bench.Degraded)
	h, ok := res.Find(l, bench.Healthy, scenario)
	if !ok {
		return bad, fmt.Sprintf("no %s healthy %s measurement", l, scenario), l
	}
	d, ok := res.Find(l, bench.Degraded, scenario)
	if !ok {
		return bad, fmt.Sprintf("no %s degraded %s measurement", l, scenario), l
	}
	if h.Spread(bench.MetricMeanLat).Min <= 0 {
		return bad, fmt.Sprintf("%s healthy %s has no latency", l, scenario), l
	}
	r := ratioOf(d.Spread(bench.MetricMeanLat), h.Spread(bench.MetricMeanLat))
	r.v, r.lo, r.hi = r.v-1, r.lo-1, r.hi-1
	return r, "", l
}

// set fills a row's tier0 value from a spread ratio.
func (row *Row) set(r spreadRatio, missing string) {
	row.Tier0, row.Missing, row.Lo, row.Hi, row.Runs, row.Noise = r.v, missing, r.lo, r.hi, r.runs, r.noise
}

// Compare computes the side-by-side rows: efficiency of the frontend over
// the block layer (the seed's file system over its raw block layer), of the
// block layer over the raw drives, retention with one node lost, latency
// change, failover and rebuild time.
func Compare(res *bench.Results, ref *Reference) []Row {
	nan := math.NaN()
	h := ref.Healthy
	lost := ref.OneNodeLost
	var rows []Row
	add := func(r Row) { rows = append(rows, r) }

	for _, x := range []struct {
		metric, sc string
		seed       float64
		seedText   string
	}{
		{"Sequential read efficiency", bench.ScenarioSeqRead1M, h.SeqReadGiBs.Filesystem / h.SeqReadGiBs.RawBlock,
			fmt.Sprintf("%.1f%% (%.1f of %.1f GiB/s, file system ÷ raw block)", 100*h.SeqReadGiBs.Filesystem/h.SeqReadGiBs.RawBlock, h.SeqReadGiBs.Filesystem, h.SeqReadGiBs.RawBlock)},
		{"Sequential write efficiency", bench.ScenarioSeqWrite1M, h.SeqWriteGiBs.FilesystemOverRawBlk,
			fmt.Sprintf("%.1f%% (file system ÷ raw block)", 100*h.SeqWriteGiBs.FilesystemOverRawBlk)},
	} {
		v, why := ratio(res, bench.LayerFrontend, bench.Healthy, bench.LayerBlock, bench.Healthy, x.sc, false)
		// Under the model both layers must reach it, or the ratio compares
		// two CPU limits (BoundDegraded holds the block layer's here).
		row := Row{Metric: x.metric, Group: "efficiency", Kind: Ratio, Seed: x.seed, SeedText: x.seedText,
			Basis: "frontend ÷ block, healthy, " + x.sc, Theory: nan,
			BoundHealthy: boundAt(res, bench.LayerFrontend, bench.Healthy, x.sc), BoundDegraded: boundAt(res, bench.LayerBlock, bench.Healthy, x.sc)}
		row.set(v, why)
		add(row)
	}
	for _, x := range []struct{ metric, sc string }{
		{"Block layer ÷ raw drives, sequential read", bench.ScenarioSeqRead1M},
		{"Block layer ÷ raw drives, sequential write", bench.ScenarioSeqWrite1M},
	} {
		v, why := ratio(res, bench.LayerBlock, bench.Healthy, bench.LayerRaw, bench.Healthy, x.sc, false)
		row := Row{Metric: x.metric, Group: "efficiency", Kind: Ratio, Seed: nan, SeedText: "not published",
			Basis: "block ÷ raw, healthy, " + x.sc, Theory: nan, BoundHealthy: nan, BoundDegraded: nan}
		row.set(v, why)
		add(row)
	}
	for _, x := range []struct {
		metric, sc string
		iops       bool
		seed       float64
	}{
		{"Retained with one node lost, sequential read", bench.ScenarioSeqRead1M, false, lost.Retained.Sequential},
		{"Retained with one node lost, sequential write", bench.ScenarioSeqWrite1M, false, lost.Retained.Sequential},
		{"Retained with one node lost, random read IOPS", bench.ScenarioRandRead4K, true, lost.Retained.Random},
		{"Retained with one node lost, random write IOPS", bench.ScenarioRandWrite4K, true, lost.Retained.Random},
	} {
		l := served(res, x.sc, bench.Healthy, bench.Degraded)
		v, why := ratio(res, l, bench.Degraded, l, bench.Healthy, x.sc, x.iops)
		row := Row{Metric: x.metric, Group: "retention", Kind: Ratio, Seed: x.seed,
			SeedText: fmt.Sprintf("≈%.0f%%", 100*x.seed), Basis: fmt.Sprintf("%s degraded ÷ healthy, %s", l, x.sc)}
		row.Theory, row.TheoryText = retentionTheory(res, x.sc)
		row.BoundHealthy, row.BoundDegraded = boundBy(res, x.sc)
		row.set(v, why)
		add(row)
	}
	seqLo, seqHi := lost.SequentialLatencyIncrease[0], lost.SequentialLatencyIncrease[1]
	for _, x := range []struct {
		metric, sc string
		seed       float64
		seedText   string
	}{
		{"Mean latency change, random read", bench.ScenarioRandRead4K, lost.RandomLatencyIncrease, fmt.Sprintf("%+.1f%%", 100*lost.RandomLatencyIncrease)},
		{"Mean latency change, random write", bench.ScenarioRandWrite4K, lost.RandomLatencyIncrease, fmt.Sprintf("%+.1f%%", 100*lost.RandomLatencyIncrease)},
		{"Mean latency change, sequential read", bench.ScenarioSeqRead1M, (seqLo + seqHi) / 2, fmt.Sprintf("+%.0f–%.0f%%", 100*seqLo, 100*seqHi)},
		{"Mean latency change, sequential write", bench.ScenarioSeqWrite1M, (seqLo + seqHi) / 2, fmt.Sprintf("+%.0f–%.0f%%", 100*seqLo, 100*seqHi)},
	} {
		v, why, l := latChange(res, x.sc)
		row := Row{Metric: x.metric, Group: "latency", Kind: Change, Seed: x.seed, SeedText: x.seedText,
			Basis: fmt.Sprintf("%s degraded ÷ healthy − 1, %s", l, x.sc)}
		row.Theory, row.TheoryText = latencyTheory(res, x.sc)
		row.BoundHealthy, row.BoundDegraded = boundBy(res, x.sc)
		row.set(v, why)
		add(row)
	}

	fo := Row{Metric: "Failover time", Group: "time", Kind: Seconds, Tier0: nan, Seed: nan, Theory: nan, BoundHealthy: nan, BoundDegraded: nan, Runs: 1,
		SeedText: "not published (outstanding I/O completed after a temporary latency increase)",
		Basis:    "node killed → first I/O completed on the moved array"}
	if f := res.Failover; f == nil {
		fo.Missing = "no failover record"
	} else if f.FirstIOAt.IsZero() {
		fo.Missing = "no I/O completed on the moved array after the kill"
	} else {
		fo.Tier0 = f.Duration.Seconds()
	}
	add(fo)

	rb := Row{Metric: "Rebuild time", Group: "time", Kind: Seconds, Tier0: nan, Seed: nan, Theory: nan, BoundHealthy: nan, BoundDegraded: nan, Runs: 1, SeedText: lost.RebuildAfterRestore,
		Basis: "longest array rebuild, start → end"}
	switch {
	case len(res.Rebuilds) == 0:
		rb.Missing = "no rebuild record"
	default:
		var longest time.Duration
		for _, r := range res.Rebuilds {
			if r.End.IsZero() {
				rb.Missing = fmt.Sprintf("rebuild of %s did not finish", r.Array)
				longest = -1
				break
			}
			longest = max(longest, r.Duration())
		}
		if longest >= 0 {
			rb.Tier0 = longest.Seconds()
		}
	}
	add(rb)
	return rows
}

func fmtDuration(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return fmt.Sprintf("%.1f min", d.Minutes())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%d ns", int64(d))
}

func fmtNs(ns int64) string {
	if ns <= 0 {
		return "—"
	}
	return fmtDuration(time.Duration(ns))
}

func fmtGiBs(m bench.Measurement) string {
	g := m.GiBPerS()
	switch {
	case g >= 10:
		return fmt.Sprintf("%.1f", g)
	case g >= 0.1:
		return fmt.Sprintf("%.2f", g)
	}
	return fmt.Sprintf("%.4f", g)
}

func fmtIOPS(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtVerify(v *bench.VerifyCounts) string {
	if v == nil {
		return "—"
	}
	out := fmt.Sprintf("%d ok", v.OK)
	if bad := v.Bad(true); bad > 0 {
		out = fmt.Sprintf("%d BAD of %d", bad, v.Checked)
	}
	if v.Unwritten > 0 {
		out += fmt.Sprintf(", %d unwritten", v.Unwritten)
	}
	return out
}
