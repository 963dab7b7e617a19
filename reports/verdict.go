package reports

import (
	"fmt"
	"math"
	"strings"

	"tier0/bench"
)

// Outcomes of a seed claim.
const (
	Confirmed    = "confirmed within noise"
	NotConfirmed = "not confirmed"
	NotMeasured  = "not measured"
)

// claimTolerance is how far (absolute, as a fraction) tier0's range may
// miss the seed's value and still confirm it: the seed publishes rounded
// figures ("≈70%").
const claimTolerance = 0.05

// modelBound is the fraction of the modelled drives' capacity below which
// a figure is not bound by the model.
const modelBound = 0.75

func pct(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100*v)
}

// Verdict is the outcome of one seed claim in this run.
type Verdict struct {
	Claim    string
	Outcome  string
	Sentence string
}

// claim names the seed claims and the comparison rows that test each.
type claim struct {
	text    string
	metrics []string
	checks  []string // for claims tested by checks rather than ratios
}

var seedClaims = []claim{
	{text: "Sequential read through the shared layer keeps the block layer's bandwidth (131.7 vs 131.2 GiB/s)", metrics: []string{"Sequential read efficiency"}},
	{text: "Sequential write through the shared layer keeps ≈98.5% of the block layer's", metrics: []string{"Sequential write efficiency"}},
	{text: "With one node lost, sequential workloads keep ≈70% of healthy bandwidth", metrics: []string{"Retained with one node lost, sequential read", "Retained with one node lost, sequential write"}},
	{text: "With one node lost, random I/O falls in proportion to the nodes (≈80%)", metrics: []string{"Retained with one node lost, random read IOPS", "Retained with one node lost, random write IOPS"}},
	{text: "With one node lost, mean random latency rises by only 0.6%", metrics: []string{"Mean latency change, random read", "Mean latency change, random write"}},
	{text: "The storage stays available through the loss of a node, without data loss", checks: []string{"failover: owned arrays moved complete", "failover: I/O continued", "failover: acknowledged blocks verify", "final verify of every array"}},
	{text: "The file system on top stays mounted and available through the loss of a node", checks: []string{"file system through failover"}},
	{text: "GPUDirect Storage reads reach GPU memory on the nvidia-fs path, with no POSIX fallback", checks: []string{"gpudirect storage"}},
}

// Verdicts judges every seed claim against res: one outcome and one
// sentence each.
func Verdicts(res *bench.Results, ref *Reference) []Verdict {
	rows := map[string]Row{}
	for _, r := range Compare(res, ref) {
		rows[r.Metric] = r
	}
	checks := map[string]bench.Check{}
	for _, c := range res.Checks {
		checks[c.Name] = c
	}
	var out []Verdict
	for _, c := range seedClaims {
		if len(c.checks) > 0 {
			out = append(out, checkVerdict(c, checks))
			continue
		}
		out = append(out, ratioVerdict(c, rows, res.Run.Model != nil))
	}
	return out
}

func checkVerdict(c claim, checks map[string]bench.Check) Verdict {
	v := Verdict{Claim: c.text}
	var failed, notRun []string
	for _, name := range c.checks {
		ch, ok := checks[name]
		switch {
		case !ok || ch.Status == bench.NotRun:
			why := "not recorded"
			if ok {
				why = oneLineText(ch.Reason, 140)
			}
			notRun = append(notRun, fmt.Sprintf("%s (%s)", name, why))
		case ch.Status == bench.Fail:
			failed = append(failed, fmt.Sprintf("%s: %s", name, oneLineText(ch.Reason, 140)))
		}
	}
	switch {
	case len(failed) > 0:
		v.Outcome, v.Sentence = NotConfirmed, "Not confirmed: "+strings.Join(failed, "; ")+"."
	case len(notRun) > 0:
		v.Outcome, v.Sentence = NotMeasured, "Not measured: "+strings.Join(notRun, "; ")+"."
	default:
		v.Outcome, v.Sentence = Confirmed, "Confirmed: "+strings.Join(c.checks, ", ")+" passed."
	}
	return v
}

// judge says whether one row confirms its seed value: ok, and a phrase.
// A figure that physics rules out (a node loss that speeds I/O up, a
// layer on top faster than the one below, beyond noise) never confirms.
func judge(r Row, modelled bool) (outcome, phrase string) {
	if !r.Has() {
		return NotMeasured, fmt.Sprintf("%s not measured (%s)", r.Metric, r.Missing)
	}
	fig := fmt.Sprintf("%s %s", lowerFirst(r.Metric), r.Tier0Text())
	one := 1.0
	if r.Kind == Change {
		one = 0
	}
	if !r.Noise && r.Runs > 1 {
		switch {
		case r.Group == "retention" && r.Lo > one+claimTolerance:
			return NotConfirmed, fig + " is impossible for the design (a node loss cannot speed I/O up): this machine's CPUs or run-to-run effects set it, not tier0"
		case r.Group == "efficiency" && r.Lo > one+claimTolerance:
			return NotConfirmed, fig + " is impossible for the design (a layer on top cannot be faster than the one below): this machine's CPUs set it, not tier0"
		case r.Group == "latency" && r.Hi < one-claimTolerance:
			return NotConfirmed, fig + " is impossible for the design (losing a node cannot make I/O faster): this machine's CPUs set it"
		}
	}
	if r.Group == "efficiency" && r.CPUBound(modelled) {
		return NotConfirmed, fmt.Sprintf("%s is not set by the model (CPU-bound, not a finding): the frontend reached %s and the block layer %s of the modelled drives' capacity, so the ratio compares this machine's limits, not the layers", fig, pct(r.BoundHealthy), pct(r.BoundDegraded))
	}
	if r.CPUBound(modelled) {
		return NotConfirmed, fmt.Sprintf("%s is not set by the model (CPU-bound, not a finding): healthy reached %s and one node lost %s of the modelled drives' capacity (theory %s), so this machine's CPUs or tier0's own path set it", fig, pct(r.BoundHealthy), pct(r.BoundDegraded), r.TheoryValue())
	}
	if modelled && !math.IsNaN(r.Theory) && r.Group == "retention" && r.Lo > r.Theory+claimTolerance {
		return NotConfirmed, fmt.Sprintf("%s exceeds the drive model's bound %s: the figure is not bound by the modelled drives", fig, r.TheoryValue())
	}
	theory := ""
	if !math.IsNaN(r.Theory) {
		theory = fmt.Sprintf("; drive-bound theory %s", r.TheoryValue())
	}
	if r.Runs <= 1 {
		return NotConfirmed, fmt.Sprintf("%s vs the seed's %s%s: measured once, so it cannot be told apart from noise (run with --repeat 3 or more)", fig, r.SeedText, theory)
	}
	lo, hi := r.Lo, r.Hi
	if r.Noise {
		// Within noise: the figures are consistent with no difference.
		lo, hi = math.Min(lo, one), math.Max(hi, one)
	}
	if r.Seed >= lo-claimTolerance && r.Seed <= hi+claimTolerance {
		return Confirmed, fig + theory
	}
	return NotConfirmed, fmt.Sprintf("%s vs the seed's %s%s", fig, r.SeedText, theory)
}

func ratioVerdict(c claim, rows map[string]Row, modelled bool) Verdict {
	v := Verdict{Claim: c.text, Outcome: Confirmed}
	var phrases []string
	measured := 0
	for _, m := range c.metrics {
		o, p := judge(rows[m], modelled)
		if _, ok := rows[m]; !ok {
			o, p = NotMeasured, m+" not computed"
		}
		phrases = append(phrases, p)
		switch o {
		case NotConfirmed:
			v.Outcome = NotConfirmed
		case NotMeasured:
			if v.Outcome == Confirmed {
				v.Outcome = NotMeasured
			}
		default:
			measured++
		}
	}
	if v.Outcome == NotMeasured && measured > 0 {
		v.Outcome = NotConfirmed // half a claim is not a confirmation
	}
	src := ""
	if modelled {
		src = " (figures from the drive and link model, see Model)"
	}
	v.Sentence = fmt.Sprintf("%s%s: %s.", capFirst(v.Outcome), src, strings.Join(phrases, "; "))
	return v
}

func lowerFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToLower(s[:1]) + s[1:]
}

func capFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func oneLineText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
