package reports

import (
	"fmt"
	"math"

	"tier0/bench"
)

// minModelScale is the floor of the measured scale: below it the modelled
// drives are so slow (under 1/10000 of a Micron 7450) that a scenario of a
// few seconds moves too few I/Os to measure.
const minModelScale = 1e-4

// ModelScale is the measured answer to "at which scale does this machine
// keep the whole topology bound by the modelled drives?".
type ModelScale struct {
	// Used is the scale the run used; Bound the largest at which, by this
	// run's figures, every scenario would have reached the model (never
	// above Used: a run bound everywhere says only "Used or more").
	Used, Bound float64
	// Lowest is the smallest fraction of the modelled capacity a
	// scenario reached, and Limit that scenario and state.
	Lowest float64
	Limit  string
	// Floored: Bound was raised to Floor, the start-up calibration's
	// floor (from member_io_timeout) when recorded, else minModelScale.
	Floored bool
	Floor   float64
}

// MeasuredModelScale derives the model-bound scale from a run under the
// drive model: a figure that reached only a fraction f of the modelled
// drives' capacity at scale s was set by something else (this machine's
// CPUs, tier0's own path), whose capacity does not change with s; at
// scale s·f the model's capacity falls to what that limit delivered, so
// the model binds again. The bound is s times the lowest f over the
// healthy and one-node-lost frontend figures of the four scenarios,
// floored at the start-up calibration's floor (from member_io_timeout)
// when the run recorded one, else at 1e-4. ok is false without a model or
// figures. It checks the scale chosen at start-up against the whole run.
func MeasuredModelScale(res *bench.Results) (ModelScale, bool) {
	m := res.Run.Model
	if m == nil || m.Scale <= 0 {
		return ModelScale{}, false
	}
	ms := ModelScale{Used: m.Scale, Lowest: math.Inf(1)}
	for _, sc := range []string{bench.ScenarioSeqRead1M, bench.ScenarioSeqWrite1M, bench.ScenarioRandRead4K, bench.ScenarioRandWrite4K} {
		h, d := boundBy(res, sc)
		for _, v := range []struct {
			f     float64
			state string
		}{{h, "healthy"}, {d, "one node lost"}} {
			if !math.IsNaN(v.f) && v.f > 0 && v.f < ms.Lowest {
				ms.Lowest, ms.Limit = v.f, sc+" "+v.state
			}
		}
	}
	if math.IsInf(ms.Lowest, 1) {
		return ModelScale{}, false
	}
	// At or above modelBound the figure counts as bound by the model (as
	// in the verdicts): no reason to lower the scale.
	ms.Bound = m.Scale
	if ms.Lowest < modelBound {
		ms.Bound = m.Scale * ms.Lowest
	}
	ms.Floor = minModelScale
	if c := m.Calibration; c != nil && c.Floor > 0 {
		ms.Floor = c.Floor
	}
	if ms.Bound < ms.Floor {
		ms.Bound, ms.Floored = ms.Floor, true
	}
	return ms, true
}

// Text is the report's sentence about the measured scale.
func (ms ModelScale) Text() string {
	if ms.Lowest >= modelBound {
		return fmt.Sprintf("Scale, measured: at %g every frontend figure reached at least %s of the modelled drives' capacity (lowest: %s), so the model bound the whole topology at this scale.",
			ms.Used, pct(ms.Lowest), ms.Limit)
	}
	s := fmt.Sprintf("Scale, measured: at %g the %s figure reached only %s of the modelled drives' capacity, so this machine, not the model, set it; the largest scale at which every figure would be bound by the model is about %.2g (--model-scale %.2g)",
		ms.Used, ms.Limit, pct(ms.Lowest), ms.Bound, ms.Bound)
	if ms.Floored {
		if ms.Floor != minModelScale {
			s += fmt.Sprintf(", the floor of %.2g: below it member I/Os would near member_io_timeout; these figures are CPU-bound, not findings", ms.Floor)
		} else {
			s += fmt.Sprintf(", the floor of %g: below it a scenario moves too few I/Os to measure", minModelScale)
		}
	}
	return s + "."
}
