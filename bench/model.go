package bench

import (
	"fmt"
	"strings"
)

// ModelCalibration is how a local run under the drive model chose its
// scale at start-up (validate's calibration, docs/BENCH.md): the
// CPU-heaviest workload run briefly at a candidate scale, its achieved
// rate compared with the modelled drives' capacity, the scale stepped
// down until the model binds, never below a floor derived from
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
	// Workload is what each step measured ("rand-read-4k through every
	// array's frontend"); Target the fraction of the modelled capacity it
	// had to reach to count as bound by the model.
	Workload string  `json:"workload,omitempty"`
	Target   float64 `json:"target,omitempty"`
	// Steps are the measurements, in order.
	Steps []CalibrationStep `json:"steps,omitempty"`
	// Chosen is the scale the run used.
	Chosen float64 `json:"chosen"`
	// CPUBound: not even the chosen scale (the floor, or the last step)
	// reached Target: this machine, not the model, bounds the workload,
	// and the figures it sets are CPU-bound, not findings.
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
	if c.Error != "" {
		return fmt.Sprintf("Scale %.2g, the site's model.scale, unverified: the start-up calibration could not measure (%s).", c.Chosen, c.Error)
	}
	var steps []string
	for _, st := range c.Steps {
		steps = append(steps, fmt.Sprintf("%.2g: %.0f of %.0f IOPS (%.0f%%)", st.Scale, st.Achieved, st.Modelled, 100*st.Fraction()))
	}
	how := fmt.Sprintf("%s at each candidate scale, from the site's model.scale %.2g down, reached %s", c.Workload, c.Ceiling, strings.Join(steps, ", then "))
	switch {
	case c.CPUBound && c.Chosen <= c.Floor:
		return fmt.Sprintf("Scale %.2g, chosen at start-up, %s: even there the calibration workload reached less than %.0f%% of the modelled drives' capacity, so this machine's CPUs, not the model, bound it (%s). Figures below the verdict's bound are CPU-bound, not findings.",
			c.Chosen, floor, 100*c.Target, how)
	case c.CPUBound:
		return fmt.Sprintf("Scale %.2g, chosen at start-up, the last of %d calibration steps: it did not reach %.0f%% of the modelled drives' capacity (%s), so CPU-bound figures remain; %s.",
			c.Chosen, len(c.Steps), 100*c.Target, how, floor)
	}
	return fmt.Sprintf("Scale %.2g, chosen at start-up: the largest scale tried at which the calibration workload reached %.0f%% of the modelled drives' capacity (%s; %s).",
		c.Chosen, 100*c.Target, how, floor)
}
