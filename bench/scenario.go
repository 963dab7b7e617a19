package bench

import (
	"context"
	"fmt"
	"time"
)

// Layer says which layer of the stack a measurement ran against.
type Layer string

// The layers the validation measures.
const (
	// LayerRaw: the drives themselves (local, or each node's drives).
	LayerRaw Layer = "raw"
	// LayerBlock: the RAID array on its owner node, below the frontend.
	LayerBlock Layer = "block"
	// LayerFrontend: the array's cluster-wide namespace over NVMe/TCP with
	// multipath, as an application host sees it.
	LayerFrontend Layer = "frontend"
)

// State is the health of the cluster during a measurement.
type State string

// Cluster states.
const (
	Healthy  State = "healthy"
	Degraded State = "degraded"
)

// Label is the human wording of a state, as the seed document puts it.
func (s State) Label() string {
	if s == Degraded {
		return "one node lost"
	}
	return "healthy"
}

// Scenario names, shared with fio and the reports.
const (
	ScenarioSeqRead1M   = "seq-read-1m"
	ScenarioSeqWrite1M  = "seq-write-1m"
	ScenarioRandRead4K  = "rand-read-4k"
	ScenarioRandWrite4K = "rand-write-4k"
	ScenarioMixed4K     = "mixed-4k"
	ScenarioGDSRead     = "gds-read"
)

// Tools that produce measurements.
const (
	ToolLoadgen = "tier0-loadgen"
	ToolFio     = "fio"
	ToolGdsio   = "gdsio"
)

// Options tune the standard scenarios. Zero values take the defaults noted.
type Options struct {
	// SeqQueueDepth is the workers per device for 1 MiB scenarios
	// (default 8); RandQueueDepth for 4 KiB ones (default 32).
	SeqQueueDepth, RandQueueDepth int
	// Duration of each scenario (default 10 s).
	Duration time.Duration
	// Interval of the time series (default 1 s).
	Interval time.Duration
	// Verify makes write scenarios stamp Generation and read scenarios check
	// blocks of at least MinGeneration. Use it after a fill (see Fill) or a
	// write scenario over the same region.
	Verify         bool
	Generation     uint64
	MinGeneration  uint64
	TolerateErrors bool
	Seed           uint64
}

func (o Options) withDefaults() Options {
	if o.SeqQueueDepth <= 0 {
		o.SeqQueueDepth = 8
	}
	if o.RandQueueDepth <= 0 {
		o.RandQueueDepth = 32
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	return o
}

// Scenario is a named load-generator configuration.
type Scenario struct {
	Name   string
	Config Config
}

func (o Options) scenario(name string, p Pattern, size, qd int) Scenario {
	o = o.withDefaults()
	return Scenario{Name: name, Config: Config{
		Pattern: p, IOSize: size, QueueDepth: qd, Duration: o.Duration, Interval: o.Interval,
		Verify: o.Verify, Generation: o.Generation, MinGeneration: o.MinGeneration,
		TolerateErrors: o.TolerateErrors, Seed: o.Seed,
	}}
}

// SeqRead1M: sequential 1 MiB reads (bandwidth).
func SeqRead1M(o Options) Scenario {
	o = o.withDefaults()
	return o.scenario(ScenarioSeqRead1M, SeqRead, 1<<20, o.SeqQueueDepth)
}

// SeqWrite1M: sequential 1 MiB writes (bandwidth).
func SeqWrite1M(o Options) Scenario {
	o = o.withDefaults()
	return o.scenario(ScenarioSeqWrite1M, SeqWrite, 1<<20, o.SeqQueueDepth)
}

// RandRead4K: 4 KiB random reads (IOPS and latency).
func RandRead4K(o Options) Scenario {
	o = o.withDefaults()
	return o.scenario(ScenarioRandRead4K, RandRead, 4096, o.RandQueueDepth)
}

// RandWrite4K: 4 KiB random writes (IOPS and latency).
func RandWrite4K(o Options) Scenario {
	o = o.withDefaults()
	return o.scenario(ScenarioRandWrite4K, RandWrite, 4096, o.RandQueueDepth)
}

// Mixed4K: 4 KiB random I/O, readFraction reads.
func Mixed4K(o Options, readFraction float64) Scenario {
	o = o.withDefaults()
	s := o.scenario(ScenarioMixed4K, Mixed, 4096, o.RandQueueDepth)
	s.Config.ReadFraction = readFraction
	return s
}

// Standard returns the seed's four measurements in the order the seed
// reports them: sequential read, sequential write, random read, random
// write. Writes come before the reads of the same size in a run that
// verifies; callers that verify should order them accordingly (see Fill).
func Standard(o Options) []Scenario {
	return []Scenario{SeqRead1M(o), SeqWrite1M(o), RandRead4K(o), RandWrite4K(o)}
}

// Fill writes every byte of each target's region once, sequentially in
// 1 MiB verify blocks of generation gen, so that later verify reads of any
// pattern find valid blocks.
func Fill(ctx context.Context, gen uint64, qd int, targets []Target) (*Result, error) {
	if qd <= 0 {
		qd = 4
	}
	return Run(ctx, Config{Pattern: SeqWrite, IOSize: 1 << 20, QueueDepth: qd, Passes: 1, Verify: true, Generation: gen}, targets)
}

// Run runs the scenario against targets and condenses the outcome into a
// Measurement keyed by (layer, state, scenario) and a TimeSeries with the
// same key (its ID is Measurement.SeriesID). The raw Result is returned too.
// A verification failure does not make err non-nil: it is in
// Measurement.Verify and Result.VerifyErr.
func (s Scenario) Run(ctx context.Context, layer Layer, state State, targets []Target) (Measurement, TimeSeries, *Result, error) {
	res, err := Run(ctx, s.Config, targets)
	if res == nil {
		return Measurement{}, TimeSeries{}, nil, fmt.Errorf("scenario %s on %s/%s: %w", s.Name, layer, state, err)
	}
	m := MeasurementFrom(res, layer, state, s.Name)
	ts := SeriesFrom(m.SeriesID, res)
	ts.Layer, ts.State, ts.Scenario = layer, state, s.Name
	if err != nil {
		err = fmt.Errorf("scenario %s on %s/%s: %w", s.Name, layer, state, err)
	}
	return m, ts, res, err
}

// MeasurementFrom condenses a load-generator result.
func MeasurementFrom(res *Result, layer Layer, state State, scenario string) Measurement {
	m := Measurement{
		Layer: layer, State: state, Scenario: scenario, Label: state.Label(), Tool: ToolLoadgen,
		Pattern: res.Config.Pattern, IOSize: res.Config.IOSize, QueueDepth: res.Config.QueueDepth,
		DurationS: res.Elapsed.Seconds(), Bytes: res.Bytes, Ops: res.Ops, Errors: res.Errors,
		BytesPerS: res.BytesPerSecond(), IOPS: res.IOPS(), Latency: res.Latency.Summary(),
		FirstError: res.FirstError,
		SeriesID:   fmt.Sprintf("%s/%s/%s", layer, state, scenario),
	}
	for _, t := range res.Targets {
		m.Targets = append(m.Targets, t.ID)
	}
	if res.Config.Verify {
		v := res.Verify
		m.Verify = &v
	}
	return m
}

// SeriesFrom turns a result's buckets into a TimeSeries (throughput, IOPS,
// mean and p99 latency and errors per bucket). The run's marks (Handle.Mark)
// become markers; the caller may add more with TimeSeries.Mark.
func SeriesFrom(id string, res *Result) TimeSeries {
	iv := res.Config.Interval
	ts := TimeSeries{ID: id, Start: res.Start, IntervalS: iv.Seconds()}
	for _, m := range res.Marks {
		ts.Mark(m.At, m.Label)
	}
	for _, b := range res.Series {
		// The last bucket is usually cut short by the end of the run: its
		// rates are over the part of it that the run covered.
		from := time.Duration(b.Index) * iv
		width := iv
		if rest := res.Elapsed - from; rest < width && rest > 0 {
			width = rest
		}
		p := SeriesPoint{
			T:         from.Seconds(),
			BytesPerS: float64(b.Bytes) / width.Seconds(),
			IOPS:      float64(b.Ops) / width.Seconds(),
			Errors:    b.Errors,
		}
		if b.Latency.Count() > 0 {
			p.MeanLatNs = int64(b.Latency.Mean())
			p.P99LatNs = int64(b.Latency.Quantile(0.99))
		}
		ts.Points = append(ts.Points, p)
	}
	return ts
}
