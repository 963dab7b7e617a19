package reports

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"tier0/bench"
)

// Figure is one rendered plot.
type Figure struct {
	// Name is a file-name-safe identifier ("retention", "failover-throughput").
	Name    string
	Title   string
	Caption string
	PNG     []byte
}

var palette = []color.Color{
	color.RGBA{31, 119, 180, 255},  // blue
	color.RGBA{214, 39, 40, 255},   // red
	color.RGBA{127, 127, 127, 255}, // grey
	color.RGBA{44, 160, 44, 255},   // green
	color.RGBA{255, 127, 14, 255},  // orange
	color.RGBA{148, 103, 189, 255}, // purple
	color.RGBA{140, 86, 75, 255},   // brown
	color.RGBA{23, 190, 207, 255},  // cyan
}

const figW, figH = 18 * vg.Centimeter, 9 * vg.Centimeter

func render(p *plot.Plot) ([]byte, error) {
	wt, err := p.WriterTo(figW, figH, "png")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Figures renders every plot the results have data for, in report order:
// retention (healthy vs degraded vs seed), efficiency vs seed, throughput
// and latency through the failover, latency CDFs per scenario, rebuild
// progress.
func Figures(res *bench.Results, ref *Reference) ([]Figure, error) {
	rows := Compare(res, ref)
	var figs []Figure
	add := func(f Figure, err error) error {
		if err != nil {
			return fmt.Errorf("plot %s: %w", f.Name, err)
		}
		if f.PNG != nil {
			figs = append(figs, f)
		}
		return nil
	}
	if err := add(retentionFigure(rows)); err != nil {
		return nil, err
	}
	if err := add(efficiencyFigure(rows)); err != nil {
		return nil, err
	}
	for _, ts := range timelineSeries(res) {
		tp, lat, err := timelineFigures(ts, res)
		if err := add(tp, err); err != nil {
			return nil, err
		}
		if err := add(lat, nil); err != nil {
			return nil, err
		}
	}
	for _, sc := range scenarioOrder {
		if err := add(cdfFigure(res, sc)); err != nil {
			return nil, err
		}
	}
	if err := add(rebuildFigure(res)); err != nil {
		return nil, err
	}
	return figs, nil
}

func retentionFigure(rows []Row) (Figure, error) {
	f := Figure{Name: "retention", Title: "One node lost: fraction of healthy kept, tier0 vs seed",
		Caption: "Throughput (sequential) or IOPS (random) with one node lost, as a fraction of healthy: tier0's median with its range over the repetitions as an error bar, the seed's published retention, and the drive-bound theory where derived. The dashed line is healthy (1.0); a tier0 point above it beyond its error bar is not physics but this machine. A missing tier0 point means the measurement is absent (see the comparison table)."}
	return dotFigure(f, rows, "retention", "fraction of healthy")
}

func efficiencyFigure(rows []Row) (Figure, error) {
	f := Figure{Name: "efficiency", Title: "Layer efficiency vs seed",
		Caption: "Sequential bandwidth of a layer as a fraction of the layer below it: tier0's median with its range as an error bar, and the seed's file system over its raw block layer. The dashed line is 1.0 (no loss)."}
	return dotFigure(f, rows, "efficiency", "fraction of the layer below")
}

// errPoints are points with vertical error bars.
type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// dotFigure draws, per row of group, tier0's median with its range, the
// seed's value and the theory as markers side by side, a dashed line at
// 1.0, and the legend above the data (the y axis leaves it room).
func dotFigure(f Figure, rows []Row, group, ylabel string) (Figure, error) {
	var labels []string
	var t0, seed, theory plotter.XYs
	var errs plotter.YErrors
	ymax, have := 1.0, false
	i := 0
	for _, r := range rows {
		if r.Group != group {
			continue
		}
		x := float64(i)
		labels = append(labels, shortMetric(r.Metric))
		i++
		if r.Has() {
			have = true
			lo, hi := r.Lo, r.Hi
			if r.Runs <= 1 || math.IsNaN(lo) || math.IsNaN(hi) {
				lo, hi = r.Tier0, r.Tier0
			}
			t0 = append(t0, plotter.XY{X: x - 0.2, Y: r.Tier0})
			errs = append(errs, struct{ Low, High float64 }{r.Tier0 - lo, hi - r.Tier0})
			ymax = math.Max(ymax, hi)
		}
		if !math.IsNaN(r.Seed) {
			seed = append(seed, plotter.XY{X: x + 0.2, Y: r.Seed})
			ymax = math.Max(ymax, r.Seed)
		}
		if !math.IsNaN(r.Theory) {
			theory = append(theory, plotter.XY{X: x, Y: r.Theory})
			ymax = math.Max(ymax, r.Theory)
		}
	}
	if !have { // nothing of tier0's to show
		return f, nil
	}
	p := plot.New()
	p.Title.Text = f.Title
	p.Y.Label.Text = ylabel
	p.NominalX(labels...)
	p.X.Min, p.X.Max = -0.6, float64(len(labels))-0.4
	one, err := plotter.NewLine(plotter.XYs{{X: -0.6, Y: 1}, {X: float64(len(labels)) - 0.4, Y: 1}})
	if err != nil {
		return f, err
	}
	one.Color = palette[2]
	one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(one)
	add := func(name string, xys plotter.XYs, shape draw.GlyphDrawer, c int) error {
		if len(xys) == 0 {
			return nil
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return err
		}
		sc.Shape, sc.Color, sc.Radius = shape, palette[c], vg.Points(4)
		p.Add(sc)
		p.Legend.Add(name, sc)
		return nil
	}
	if len(t0) > 0 {
		eb, err := plotter.NewYErrorBars(errPoints{t0, errs})
		if err != nil {
			return f, err
		}
		eb.Color, eb.Width, eb.CapWidth = palette[0], vg.Points(1.5), vg.Points(8)
		p.Add(eb)
	}
	if err := add("tier0 (median, range)", t0, draw.CircleGlyph{}, 0); err != nil {
		return f, err
	}
	if err := add("seed", seed, draw.TriangleGlyph{}, 1); err != nil {
		return f, err
	}
	if err := add("drive-bound theory", theory, draw.CrossGlyph{}, 3); err != nil {
		return f, err
	}
	// Room above the data for the legend (three lines, top left).
	p.Y.Min, p.Y.Max = 0, ymax*1.35
	p.Legend.Top, p.Legend.Left = true, true
	f.PNG, err = render(p)
	return f, err
}

func shortMetric(m string) string {
	r := map[string]string{
		"Sequential read efficiency":                     "seq read fe/blk",
		"Sequential write efficiency":                    "seq write fe/blk",
		"Block layer ÷ raw drives, sequential read":      "seq read blk/raw",
		"Block layer ÷ raw drives, sequential write":     "seq write blk/raw",
		"Retained with one node lost, sequential read":   "seq read",
		"Retained with one node lost, sequential write":  "seq write",
		"Retained with one node lost, random read IOPS":  "rand read",
		"Retained with one node lost, random write IOPS": "rand write",
	}
	if s, ok := r[m]; ok {
		return s
	}
	return m
}

// timelineSeries returns the series to draw as timelines: the failover's
// first, then every other series that carries markers.
func timelineSeries(res *bench.Results) []bench.TimeSeries {
	var out []bench.TimeSeries
	var id string
	if res.Failover != nil && res.Failover.SeriesID != "" {
		id = res.Failover.SeriesID
		if ts, ok := res.SeriesByID(id); ok {
			out = append(out, ts)
		}
	}
	for _, ts := range res.Series {
		if ts.ID != id && len(ts.Markers) > 0 {
			out = append(out, ts)
		}
	}
	return out
}

func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}

// markerXs returns (seconds from the series start, label) of its markers and,
// for the failover series, the kill and first-I/O instants.
func markerXs(ts bench.TimeSeries, res *bench.Results) ([]float64, []string) {
	var xs []float64
	var ls []string
	for _, m := range ts.Markers {
		xs = append(xs, m.At.Sub(ts.Start).Seconds())
		ls = append(ls, m.Label)
	}
	if f := res.Failover; f != nil && f.SeriesID == ts.ID {
		if !f.KilledAt.IsZero() && !slices.Contains(ls, "node "+f.Node+" killed") {
			xs = append(xs, f.KilledAt.Sub(ts.Start).Seconds())
			ls = append(ls, "node "+f.Node+" killed")
		}
		if !f.FirstIOAt.IsZero() && !slices.Contains(ls, "first I/O on moved array") {
			xs = append(xs, f.FirstIOAt.Sub(ts.Start).Seconds())
			ls = append(ls, "first I/O on moved array")
		}
	}
	return xs, ls
}

func addMarkers(p *plot.Plot, xs []float64, ls []string, ymin, ymax float64) error {
	for i, x := range xs {
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: ymin}, {X: x, Y: ymax}})
		if err != nil {
			return err
		}
		l.Color = palette[(i+1)%len(palette)]
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(ls[i], l)
	}
	return nil
}

func timelineFigures(ts bench.TimeSeries, res *bench.Results) (Figure, Figure, error) {
	name := safeName(ts.ID)
	tp := Figure{Name: "timeline-throughput-" + name, Title: "Throughput through the failover: " + ts.ID,
		Caption: fmt.Sprintf("Completed I/O per %.3g s interval; dashed lines mark events.", ts.IntervalS)}
	lat := Figure{Name: "timeline-latency-" + name, Title: "Latency through the failover: " + ts.ID,
		Caption: "Mean and p99 latency of the I/Os completed in each interval (log scale); an interval with no completion has no point."}
	if len(ts.Points) == 0 {
		return tp, lat, nil
	}
	xs, ls := markerXs(ts, res)

	// Throughput in MiB/s (GiB/s hides a loopback run's scale).
	p := plot.New()
	p.Title.Text = tp.Title
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "MiB/s"
	var pts plotter.XYs
	ymax := 0.0
	for _, pt := range ts.Points {
		v := pt.BytesPerS / (1 << 20)
		pts = append(pts, plotter.XY{X: pt.T, Y: v})
		ymax = math.Max(ymax, v)
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return tp, lat, err
	}
	l.Color = palette[0]
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add("throughput", l)
	if err := addMarkers(p, xs, ls, 0, ymax*1.05+1e-9); err != nil {
		return tp, lat, err
	}
	// Headroom above the data for the legend.
	p.Y.Min, p.Y.Max = 0, ymax*1.45+1e-9
	p.Legend.Top = true
	if tp.PNG, err = render(p); err != nil {
		return tp, lat, err
	}

	p = plot.New()
	p.Title.Text = lat.Title
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "latency, µs"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	var mean, p99 plotter.XYs
	lo, hi := math.Inf(1), 0.0
	for _, pt := range ts.Points {
		if pt.MeanLatNs <= 0 {
			continue
		}
		m, q := float64(pt.MeanLatNs)/1e3, math.Max(float64(pt.P99LatNs)/1e3, 1e-3)
		mean = append(mean, plotter.XY{X: pt.T, Y: math.Max(m, 1e-3)})
		p99 = append(p99, plotter.XY{X: pt.T, Y: q})
		lo, hi = math.Min(lo, math.Max(m, 1e-3)), math.Max(hi, q)
	}
	if len(mean) == 0 {
		return tp, lat, nil
	}
	for i, s := range []struct {
		n   string
		xys plotter.XYs
	}{{"mean", mean}, {"p99", p99}} {
		ln, sc, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return tp, lat, err
		}
		ln.Color, sc.Color = palette[i*3%len(palette)], palette[i*3%len(palette)]
		sc.Shape = draw.CircleGlyph{}
		sc.Radius = vg.Points(1.5)
		p.Add(ln, sc)
		p.Legend.Add(s.n, ln)
	}
	if err := addMarkers(p, xs, ls, lo, hi); err != nil {
		return tp, lat, err
	}
	// Headroom above the data (log scale: a decade and a half).
	p.Y.Min, p.Y.Max = lo/1.5, hi*30
	p.Legend.Top = true
	lat.PNG, err = render(p)
	return tp, lat, err
}

func cdfFigure(res *bench.Results, scenario string) (Figure, error) {
	f := Figure{Name: "cdf-" + scenario, Title: "Latency CDF: " + scenario,
		Caption: "Fraction of I/Os completed within a latency (log scale), per layer and state."}
	p := plot.New()
	p.Title.Text = f.Title
	p.X.Label.Text = "latency, µs"
	p.Y.Label.Text = "fraction of I/Os"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	n := 0
	for _, m := range res.Measurements {
		if m.Scenario != scenario || len(m.Latency.CDF) == 0 {
			continue
		}
		var xys plotter.XYs
		for _, c := range m.Latency.CDF {
			xys = append(xys, plotter.XY{X: math.Max(float64(c.LatencyNs)/1e3, 1e-3), Y: c.Fraction})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return f, err
		}
		l.Color = palette[n%len(palette)]
		if m.State == bench.Degraded {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s %s (%s)", m.Layer, m.Label, m.Tool), l)
		n++
	}
	if n == 0 {
		return f, nil
	}
	// Bottom right: a CDF never reaches there (high latency, low fraction).
	p.Legend.Top, p.Legend.Left = false, false
	var err error
	f.PNG, err = render(p)
	return f, err
}

func rebuildFigure(res *bench.Results) (Figure, error) {
	f := Figure{Name: "rebuild", Title: "Rebuild progress",
		Caption: "Fraction of each array rebuilt against seconds since its rebuild started."}
	p := plot.New()
	p.Title.Text = f.Title
	p.X.Label.Text = "seconds since rebuild start"
	p.Y.Label.Text = "fraction rebuilt"
	p.Y.Min, p.Y.Max = 0, 1.05
	n := 0
	for _, r := range res.Rebuilds {
		if len(r.Samples) == 0 || r.Bytes <= 0 {
			continue
		}
		xys := plotter.XYs{{X: 0, Y: 0}}
		for _, s := range r.Samples {
			xys = append(xys, plotter.XY{X: s.At.Sub(r.Start).Seconds(), Y: float64(s.DoneBytes) / float64(r.Bytes)})
		}
		if last := r.Samples[len(r.Samples)-1]; !r.End.IsZero() && last.At.Before(r.End) {
			xys = append(xys, plotter.XY{X: r.End.Sub(r.Start).Seconds(), Y: 1}) // finished: all of it
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return f, err
		}
		l.Color = palette[n%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add("array "+r.Array, l)
		n++
	}
	if n == 0 {
		return f, nil
	}
	// Bottom right: progress curves rise from the bottom left.
	p.Legend.Top, p.Legend.Left = false, false
	var err error
	f.PNG, err = render(p)
	return f, err
}
