package bench

import (
	"fmt"
)

// ModelCalibration is how a local run under the drive model chose its
// scale at start-up (validate's calibration, docs/BENCH.md): the
// CPU-heaviest workload run briefly with the drives' model out of the way
// (scale 1), so that this machine's CPUs bound it, and the scale set where
// the modelled capacity is a share of what the CPUs delivered, at most the
// site's model.scale and at least a floor derived from
// policies.member_io_timeout.
type ModelCalibration struct {
	// Given: the scale was fixed by --model-scale or TIER0_MODEL_SCALE
	// and not calibrated.
	Given bool `json:"given,omitempty"`
	// Ceiling is the site's model.scale, the largest scale tried.
	Ceiling float64 `json:"ceiling"`
	// Floor is the smallest scale allowed, FloorWhy its derivation.
	Floor    float64 `json:"floor"`
	FloorWhy string  `json:"floor_why,omitempty"`
	// Workload is what was measured ("rand-read-4k through every array's
	// frontend"); Target the share of the CPUs' measured capacity that the
	// model's capacity is set to.
	Workload string  `json:"workload,omitempty"`
	Target   float64 `json:"target,omitempty"`
	// Steps are the measurements, in order.
	Steps []CalibrationStep `json:"steps,omitempty"`
	// Chosen is the scale the run used.
	Chosen float64 `json:"chosen"`
	// CPUBound: the chosen scale was raised to the floor, where the
	// model's capacity exceeds what the CPUs delivered: this machine, not
	// the model, bounds the workload, and the figures it sets are
	// CPU-bound, not findings.
	CPUBound bool `json:"cpu_bound,omitempty"`
	// Error says why the calibration could not measure (the run then used
	// Chosen = Ceiling, unverified).
	Error string `json:"error,omitempty"`
}

// CalibrationStep is one calibration measurement.
type CalibrationStep struct {
	Scale float64 `json:"scale"`
	// Modelled is the modelled drives' capacity for the workload at
	// Scale, Achieved what the run reached (I/Os per second).
	Modelled float64 `json:"modelled_iops"`
	Achieved float64 `json:"achieved_iops"`
}

// Fraction is the share of the modelled capacity the step reached (0
// when nothing was modelled).
func (s CalibrationStep) Fraction() float64 {
	if s.Modelled <= 0 {
		return 0
	}
	return s.Achieved / s.Modelled
}

// Text is the report's sentence about the scale: which one, and how it
// was chosen.
func (c *ModelCalibration) Text() string {
	if c == nil {
		return ""
	}
	floor := fmt.Sprintf("the floor %.2g (%s)", c.Floor, c.FloorWhy)
	if c.Given {
		s := fmt.Sprintf("Scale %.2g, given with --model-scale or TIER0_MODEL_SCALE: not calibrated", c.Chosen)
		if c.Floor > 0 && c.Chosen < c.Floor {
			s += fmt.Sprintf("; it is below %s, so member I/Os may time out", floor)
		}
		return s + "."
	}
	if c.Error != "" || len(c.Steps) == 0 {
		return fmt.Sprintf("Scale %.2g, the site's model.scale, unverified: the start-up calibration could not measure (%s).", c.Chosen, c.Error)
	}
	st := c.Steps[len(c.Steps)-1]
	probe := fmt.Sprintf("with the drives' model out of the way (scale %g) %s delivered %.0f IOPS, this machine's CPUs' capacity (the model there: %.0f)", st.Scale, c.Workload, st.Achieved, st.Modelled)
	want := c.Target * st.Achieved / st.Modelled * st.Scale
	modelled := c.Chosen / st.Scale * st.Modelled
	switch {
	case c.CPUBound:
		return fmt.Sprintf("Scale %.2g, chosen at start-up, %s: %s; the model at %.0f%% of it needs scale %.2g, below the floor, so at the floor the modelled %.0f IOPS are %.0f%% of what the CPUs deliver. Figures the model does not bind are CPU-bound, not findings.",
			c.Chosen, floor, probe, 100*c.Target, want, modelled, 100*modelled/st.Achieved)
	case c.Chosen <= c.Floor && want < c.Floor:
		return fmt.Sprintf("Scale %.2g, chosen at start-up, %s: %s; the model at %.0f%% of it needs scale %.2g, below the floor, so at the floor the modelled %.0f IOPS are %.0f%% of what the CPUs deliver, a thinner margin than aimed at: the verdict's check of each figure against the modelled capacity tells which ones the model bound.",
			c.Chosen, floor, probe, 100*c.Target, want, modelled, 100*modelled/st.Achieved)
	case c.Chosen >= c.Ceiling && want > c.Ceiling:
		return fmt.Sprintf("Scale %.2g, chosen at start-up: the site's model.scale, the largest allowed; %s, and the model at %.0f%% of it would allow %.2g (%s).",
			c.Chosen, probe, 100*c.Target, want, floor)
	}
	return fmt.Sprintf("Scale %.2g, chosen at start-up: %s; at this scale the modelled capacity, %.0f IOPS, is %.0f%% of it (at most the site's model.scale %.2g, at least %s).",
		c.Chosen, probe, modelled, 100*c.Target, c.Ceiling, floor)
}
