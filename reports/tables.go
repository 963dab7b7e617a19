package reports

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/olekukonko/tablewriter"
	"github.com/olekukonko/tablewriter/tw"

	"tier0/bench"
	"tier0/internal/units"
)

// table is the format-neutral form of every table in the reports: the
// terminal, Markdown and HTML renderers all draw from it, so the three
// always show the same figures.
type table struct {
	Title  string
	Header []string
	Rows   [][]string
	Note   string
}

var scenarioOrder = []string{bench.ScenarioSeqRead1M, bench.ScenarioSeqWrite1M, bench.ScenarioRandRead4K, bench.ScenarioRandWrite4K, bench.ScenarioMixed4K, bench.ScenarioGDSRead}

func rank[T comparable](order []T, v T) int {
	if i := slices.Index(order, v); i >= 0 {
		return i
	}
	return len(order)
}

// StatusText is how a check status is shown: never anything that could be
// mistaken for a pass unless it is one.
func StatusText(s bench.CheckStatus) string {
	switch s {
	case bench.Pass:
		return "PASS"
	case bench.Fail:
		return "FAIL"
	case bench.NotRun:
		return "NOT RUN"
	}
	return "UNKNOWN (" + string(s) + ")"
}

func checkSummary(res *bench.Results) string {
	var p, f, n int
	for _, c := range res.Checks {
		switch c.Status {
		case bench.Pass:
			p++
		case bench.Fail:
			f++
		default:
			n++
		}
	}
	return fmt.Sprintf("%d passed, %d failed, %d not run", p, f, n)
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

func buildTables(res *bench.Results, ref *Reference) []table {
	var out []table

	vt := table{Title: "Verdict", Header: []string{"seed claim", "verdict"},
		Note: verdictNote(res)}
	for _, v := range Verdicts(res, ref) {
		vt.Rows = append(vt.Rows, []string{v.Claim, v.Sentence})
	}
	out = append(out, vt)

	checks := table{Title: "Checks", Header: []string{"check", "status", "reason"}, Note: checkSummary(res)}
	for _, c := range res.Checks {
		checks.Rows = append(checks.Rows, []string{c.Name, StatusText(c.Status), c.Reason})
	}
	if len(checks.Rows) == 0 {
		checks.Note = "no checks recorded"
	}
	out = append(out, checks)

	cmpT := table{Title: "Side by side with the seed", Header: []string{"metric", "tier0 (median, range)", "seed", "drive-bound theory", "tier0 basis"},
		Note: "Seed: " + ref.Name + ". The seed's \"raw block layer\" is its RAID volumes over NVMe-oF; its shared layer is IBM Storage Scale. tier0's counterparts are the block layer (array on its owner) and the frontend (NVMe/TCP namespace). A ratio is \"within noise\" when the ranges of its two figures over the repetitions overlap: it is then no finding. Under the drive model a ratio is \"CPU-bound, not a finding\" when one of its figures reached under 75% of the modelled drives' capacity: this machine, not the model, set it. The theory column is what the arrays' geometry gives when the drives alone bound the rate (see docs/BENCH.md); it describes this run's figures only when they came from the drive model."}
	for _, r := range Compare(res, ref) {
		th := r.TheoryValue()
		if th != "—" && r.TheoryText != "" {
			th += " (" + r.TheoryText + ")"
		}
		cmpT.Rows = append(cmpT.Rows, []string{r.Metric, r.SideText(res.Run.Model != nil), r.SeedText, th, r.Basis})
	}
	out = append(out, cmpT)
	if ct, ok := cpuTable(res); ok {
		out = append(out, ct)
	}
	if pt, ok := projectionTable(res, ref); ok {
		out = append(out, pt)
	}

	ms := slices.Clone(res.Measurements)
	slices.SortStableFunc(ms, func(a, b bench.Measurement) int {
		return cmp.Or(
			cmp.Compare(rank(scenarioOrder, a.Scenario), rank(scenarioOrder, b.Scenario)),
			cmp.Compare(rank([]bench.Layer{bench.LayerRaw, bench.LayerBlock, bench.LayerFrontend}, a.Layer), rank([]bench.Layer{bench.LayerRaw, bench.LayerBlock, bench.LayerFrontend}, b.Layer)),
			cmp.Compare(rank([]bench.State{bench.Healthy, bench.Degraded}, a.State), rank([]bench.State{bench.Healthy, bench.Degraded}, b.State)),
		)
	})
	mt := table{Title: "Measurements", Header: []string{"scenario", "layer", "state", "tool", "runs", "GiB/s", "MiB/s range", "IOPS", "IOPS range", "mean", "p99", "p99.9", "errors", "verify"},
		Note: "GiB/s, IOPS and mean latency are medians over the runs; the ranges are the runs' extremes; p99 and p99.9 are those of the median run."}
	for _, m := range ms {
		bs, is := m.Spread(bench.MetricBytes), m.Spread(bench.MetricIOPS)
		mt.Rows = append(mt.Rows, []string{m.Scenario, string(m.Layer), m.Label, m.Tool, fmt.Sprint(bs.N), fmtGiBs(m),
			fmt.Sprintf("%.1f–%.1f", bs.Min/(1<<20), bs.Max/(1<<20)), fmtIOPS(m.IOPS), fmtIOPS(is.Min) + "–" + fmtIOPS(is.Max),
			fmtNs(m.Latency.MeanNs), fmtNs(m.Latency.P99Ns), fmtNs(m.Latency.P999Ns), fmt.Sprint(m.Errors), fmtVerify(m.Verify)})
	}
	if len(ms) == 0 {
		mt.Note = "no measurements recorded"
	}
	out = append(out, mt)

	if f := res.Failover; f != nil {
		ft := table{Title: "Failover", Header: []string{"array", "from", "to", "moved", "degraded", "longest stall", "verified", "bad"},
			Note: fmt.Sprintf("node %s killed at %s; first I/O on the moved array at %s; failover time %s",
				f.Node, fmtTime(f.KilledAt), fmtTime(f.FirstIOAt), failoverText(f))}
		for _, a := range f.Arrays {
			ft.Rows = append(ft.Rows, []string{a.Array, a.From, a.To, yesNo(a.Moved), yesNo(a.Degraded), fmtNs(int64(a.Stall)),
				fmt.Sprint(a.Verify.Checked), fmt.Sprint(a.Verify.Bad(false))})
		}
		out = append(out, ft)
	}
	if len(res.Rebuilds) > 0 {
		rt := table{Title: "Rebuild", Header: []string{"array", "start", "end", "duration", "bytes", "rate"}}
		for _, r := range res.Rebuilds {
			dur, rate := "not finished", "—"
			if d := r.Duration(); d > 0 {
				dur = fmtDuration(d)
				rate = fmt.Sprintf("%.1f MiB/s", float64(r.Bytes)/d.Seconds()/(1<<20))
			}
			rt.Rows = append(rt.Rows, []string{r.Array, fmtTime(r.Start), fmtTime(r.End), dur, units.FormatBytes(r.Bytes), rate})
		}
		out = append(out, rt)
	}
	gt := table{Title: "GPUDirect Storage", Header: []string{"status", "reason", "verdict"}}
	if g := res.GDS; g != nil {
		gt.Rows = append(gt.Rows, []string{StatusText(g.Status), g.Reason, compactJSON(g.Verdict, 300)})
	} else {
		gt.Rows = append(gt.Rows, []string{StatusText(bench.NotRun), "no GDS result in these results", "—"})
	}
	gt.Note = fmt.Sprintf("Seed: %.1f GiB/s aggregate into GPU memory (5 nodes, 1 GPU each); single GPU %.1f GiB/s GPU_DIRECT vs %.1f GiB/s CPU_ONLY; %d operations verified on the nvfs path, %d POSIX fallbacks.",
		ref.GDS.AggregateReadGiBs, ref.GDS.SingleGPU.GPUDirectGiBs, ref.GDS.SingleGPU.CPUOnlyGiBs, ref.GDS.VerifiedOps, ref.GDS.PosixFallbacks)
	out = append(out, gt)

	st := table{Title: "Seed reference figures", Header: []string{"figure", "seed"}, Note: "absolute figures of a 5-node InfiniBand cluster; compare ratios, not these, with a local run"}
	hh := ref.Healthy
	st.Rows = [][]string{
		{"sequential read, raw block layer", fmt.Sprintf("%.1f GiB/s", hh.SeqReadGiBs.RawBlock)},
		{"sequential read, file system", fmt.Sprintf("%.1f GiB/s", hh.SeqReadGiBs.Filesystem)},
		{"sequential write, file system", fmt.Sprintf("%.1f GiB/s", hh.SeqWriteGiBs.Filesystem)},
		{"4 KiB random read, file system", fmtIOPS(hh.RandRead4KIOPS.Filesystem) + " IOPS"},
		{"4 KiB random write, file system", fmtIOPS(hh.RandWrite4KIOPS.Filesystem) + " IOPS"},
		{"one node lost", ref.OneNodeLost.FailedArrayBehaviour + "; data loss: " + ref.OneNodeLost.DataLoss},
	}
	out = append(out, st)
	return out
}

func failoverText(f *bench.FailoverRecord) string {
	if f.FirstIOAt.IsZero() {
		return "n/a (no I/O completed on the moved array)"
	}
	return fmtDuration(f.Duration)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func compactJSON(b json.RawMessage, limit int) string {
	if len(b) == 0 {
		return "—"
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return "(invalid JSON)"
	}
	s := buf.String()
	if len(s) > limit {
		s = s[:limit] + "…"
	}
	return s
}

func runSummary(res *bench.Results) []string {
	r, e := res.Run, res.Environment
	lines := []string{
		fmt.Sprintf("Run %s, site %s%s, %s → %s.", orDash(r.ID), orDash(r.Site), paren(r.Mode), fmtTime(r.Started), fmtTime(r.Finished)),
	}
	if r.Topology != "" {
		lines = append(lines, "Topology: "+r.Topology+".")
	}
	cpus := "CPUs the run may use: not recorded"
	if e.CPUs != nil {
		cpus = "this run may use " + e.CPUs.String()
	}
	lines = append(lines, fmt.Sprintf("Host %s: %s, %d cores / %d threads on the host, %s; %s memory, %s %s, kernel %s, %s, tier0 %s.",
		orDash(e.Host), orDash(e.CPU), e.PhysicalCores, e.LogicalCores, cpus, units.FormatBytes(int64(e.MemoryBytes)), e.OS, e.Arch, orDash(e.Kernel), e.GoVersion, orDash(e.Tier0Version)))
	if r.Repeat > 1 {
		lines = append(lines, fmt.Sprintf("Each scenario ran %d times; figures are medians with their range.", r.Repeat))
	}
	if m := r.Model; m != nil {
		lines = append(lines, "Model: "+modelText(m))
		if m.Calibration != nil {
			lines = append(lines, m.Calibration.Text())
		}
		if ms, ok := MeasuredModelScale(res); ok {
			lines = append(lines, ms.Text())
		}
	} else {
		lines = append(lines, "Model: none; the drives ran unshaped, so the figures are this machine's (on a real cluster: the hardware's).")
	}
	for _, n := range r.Notes {
		lines = append(lines, "Note: "+n)
	}
	return lines
}

// modelText describes the drive and link model in one sentence.
func modelText(m *bench.ModelInfo) string {
	d := m.Drive
	s := fmt.Sprintf("every drive shaped to the %s profile scaled by %g: %.1f MiB/s read, %.1f MiB/s write, %s read IOPS, %s write IOPS, %s read and %s write latency",
		m.Profile, m.Scale, d.ReadBytesPerS/(1<<20), d.WriteBytesPerS/(1<<20), fmtIOPS(d.ReadIOPS), fmtIOPS(d.WriteIOPS), fmtNs(d.ReadLatNs), fmtNs(d.WriteLatNs))
	if m.LinkBytesPerS > 0 {
		s += fmt.Sprintf("; each node's link %.1f MiB/s", m.LinkBytesPerS/(1<<20))
	}
	if m.Source != "" {
		s += " (" + m.Source + ")"
	}
	if m.How != "" {
		s += "; " + m.How
	}
	return s + ". Every throughput, IOPS and latency figure of this report comes from the model, not from this machine's hardware."
}

func verdictNote(res *bench.Results) string {
	n := "One sentence per claim of the seed. Confirmed within noise: the seed's value lies within tier0's range over the repetitions (±5 points for the seed's rounding), or the two figures are within noise of each other and the seed's value is ≈100% (≈0% for a change)."
	if res.Run.Repeat <= 1 {
		n += " This run measured each scenario once: no spread is known, so no figure can be told apart from noise."
	}
	return n
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// WriteTables prints the run summary and every table for a terminal.
func WriteTables(w io.Writer, res *bench.Results) error {
	ref, err := Seed()
	if err != nil {
		return err
	}
	for _, l := range runSummary(res) {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	for _, t := range buildTables(res, ref) {
		if _, err := fmt.Fprintf(w, "\n%s\n", strings.ToUpper(t.Title)); err != nil {
			return err
		}
		tbl := tablewriter.NewTable(w, tablewriter.WithHeaderAutoFormat(tw.Off), tablewriter.WithRowAutoWrap(tw.WrapNormal), tablewriter.WithMaxWidth(160))
		tbl.Header(anySlice(t.Header)...)
		for _, r := range t.Rows {
			if err := tbl.Append(r); err != nil {
				return fmt.Errorf("table %s: %w", t.Title, err)
			}
		}
		if err := tbl.Render(); err != nil {
			return fmt.Errorf("table %s: %w", t.Title, err)
		}
		if t.Note != "" {
			if _, err := fmt.Fprintln(w, t.Note); err != nil {
				return err
			}
		}
	}
	return nil
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
