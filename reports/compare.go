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
}

// Has reports whether tier0's value is available.
func (r Row) Has() bool { return !math.IsNaN(r.Tier0) }

// Tier0Text formats tier0's value, or "n/a (reason)".
func (r Row) Tier0Text() string {
	if !r.Has() {
		return "n/a (" + r.Missing + ")"
	}
	return formatValue(r.Kind, r.Tier0)
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

func value(m bench.Measurement, iops bool) float64 {
	if iops {
		return m.IOPS
	}
	return m.BytesPerS
}

// ratio computes num/den of two measurements' throughput (or IOPS).
func ratio(res *bench.Results, nl bench.Layer, ns bench.State, dl bench.Layer, ds bench.State, scenario string, iops bool) (float64, string) {
	n, ok := res.Find(nl, ns, scenario)
	if !ok {
		return math.NaN(), fmt.Sprintf("no %s %s %s measurement", nl, ns, scenario)
	}
	d, ok := res.Find(dl, ds, scenario)
	if !ok {
		return math.NaN(), fmt.Sprintf("no %s %s %s measurement", dl, ds, scenario)
	}
	if value(d, iops) <= 0 {
		return math.NaN(), fmt.Sprintf("%s %s %s measured zero", dl, ds, scenario)
	}
	return value(n, iops) / value(d, iops), ""
}

func latChange(res *bench.Results, scenario string) (float64, string, bench.Layer) {
	l := served(res, scenario, bench.Healthy, bench.Degraded)
	h, ok := res.Find(l, bench.Healthy, scenario)
	if !ok {
		return math.NaN(), fmt.Sprintf("no %s healthy %s measurement", l, scenario), l
	}
	d, ok := res.Find(l, bench.Degraded, scenario)
	if !ok {
		return math.NaN(), fmt.Sprintf("no %s degraded %s measurement", l, scenario), l
	}
	if h.Latency.MeanNs <= 0 {
		return math.NaN(), fmt.Sprintf("%s healthy %s has no latency", l, scenario), l
	}
	return float64(d.Latency.MeanNs)/float64(h.Latency.MeanNs) - 1, "", l
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
		add(Row{Metric: x.metric, Group: "efficiency", Kind: Ratio, Tier0: v, Missing: why, Seed: x.seed, SeedText: x.seedText,
			Basis: "frontend ÷ block, healthy, " + x.sc})
	}
	for _, x := range []struct{ metric, sc string }{
		{"Block layer ÷ raw drives, sequential read", bench.ScenarioSeqRead1M},
		{"Block layer ÷ raw drives, sequential write", bench.ScenarioSeqWrite1M},
	} {
		v, why := ratio(res, bench.LayerBlock, bench.Healthy, bench.LayerRaw, bench.Healthy, x.sc, false)
		add(Row{Metric: x.metric, Group: "efficiency", Kind: Ratio, Tier0: v, Missing: why, Seed: nan, SeedText: "not published",
			Basis: "block ÷ raw, healthy, " + x.sc})
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
		add(Row{Metric: x.metric, Group: "retention", Kind: Ratio, Tier0: v, Missing: why, Seed: x.seed,
			SeedText: fmt.Sprintf("≈%.0f%%", 100*x.seed), Basis: fmt.Sprintf("%s degraded ÷ healthy, %s", l, x.sc)})
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
		add(Row{Metric: x.metric, Group: "latency", Kind: Change, Tier0: v, Missing: why, Seed: x.seed, SeedText: x.seedText,
			Basis: fmt.Sprintf("%s degraded ÷ healthy − 1, %s", l, x.sc)})
	}

	fo := Row{Metric: "Failover time", Group: "time", Kind: Seconds, Tier0: nan, Seed: nan,
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

	rb := Row{Metric: "Rebuild time", Group: "time", Kind: Seconds, Tier0: nan, Seed: nan, SeedText: lost.RebuildAfterRestore,
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
