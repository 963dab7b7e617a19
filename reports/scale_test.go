package reports

import (
	"math"
	"strings"
	"testing"
	"time"

	"tier0/bench"
)

// TestMeasuredModelScale: the run's figures say up to which scale the
// model binds: random writes that reached 30% of the modelled capacity at
// scale 0.001 were set by this machine, so the model binds again at
// 0.0003; a run bound everywhere keeps its scale; the floor holds
// (issue 17: the scale was a guess in the site file, never measured).
func TestMeasuredModelScale(t *testing.T) {
	mk := func(scale float64, rw float64) *bench.Results {
		res := bench.NewResults("r", "s", time.Unix(0, 0), bench.Environment{})
		res.Run.Model = &bench.ModelInfo{Profile: "p", Scale: scale, Drive: bench.DriveFigures{ReadBytesPerS: 1 << 20, WriteBytesPerS: 1 << 20, ReadIOPS: 100, WriteIOPS: 100}}
		res.Failover = &bench.FailoverRecord{Node: "B"}
		for _, a := range []string{"A", "B", "C", "D", "E"} {
			res.Run.Arrays = append(res.Run.Arrays, bench.ArrayShape{Name: a, Level: "raid5", Data: 3, Parity: 1})
			res.Failover.Arrays = append(res.Failover.Arrays, bench.ArrayFailover{Array: a, Moved: a == "B", Degraded: a != "B"})
		}
		// Random reads at the drives' 2000 IOPS healthy, 1200 degraded;
		// random writes' capacity is 500 IOPS healthy.
		res.Add(rep(bench.LayerFrontend, bench.Healthy, bench.ScenarioRandRead4K, []float64{1900, 2000, 1950}, []float64{8000}))
		res.Add(rep(bench.LayerFrontend, bench.Degraded, bench.ScenarioRandRead4K, []float64{1150, 1180, 1200}, []float64{13000}))
		res.Add(rep(bench.LayerFrontend, bench.Healthy, bench.ScenarioRandWrite4K, []float64{rw, rw, rw}, []float64{100000}))
		res.Add(rep(bench.LayerFrontend, bench.Degraded, bench.ScenarioRandWrite4K, []float64{rw, rw, rw}, []float64{130000}))
		return res
	}
	ms, ok := MeasuredModelScale(mk(0.001, 150))
	if !ok || math.Abs(ms.Bound-0.0003) > 1e-6 || ms.Limit != bench.ScenarioRandWrite4K+" healthy" {
		t.Fatalf("CPU-bound random writes at 30%%: %+v (ok %v); want bound 0.0003 set by %s healthy", ms, ok, bench.ScenarioRandWrite4K)
	}
	if txt := ms.Text(); !strings.Contains(txt, "reached only 30%") || !strings.Contains(txt, "--model-scale 0.0003") {
		t.Errorf("text %q", txt)
	}
	if ms, _ := MeasuredModelScale(mk(0.001, 500)); ms.Bound != 0.001 || !strings.Contains(ms.Text(), "the model bound the whole topology") {
		t.Errorf("bound everywhere: %+v %q; want the run's own scale", ms, ms.Text())
	}
	if ms, _ := MeasuredModelScale(mk(0.0002, 150)); ms.Bound != minModelScale || !ms.Floored {
		t.Errorf("below the floor: %+v; want %g, floored", ms, minModelScale)
	}
	res := mk(0.001, 150)
	res.Run.Model = nil
	if _, ok := MeasuredModelScale(res); ok {
		t.Error("no model: want no measured scale")
	}
}

// TestReportStatesTheChosenScale: the summary says which scale the run
// used and how it was chosen at start-up (issue 17: the scale was only
// measured afterwards), and the measured scale is floored at the
// calibration's floor from member_io_timeout, naming CPU-bound figures.
func TestReportStatesTheChosenScale(t *testing.T) {
	res := bench.NewResults("r", "s", time.Unix(0, 0), bench.Environment{})
	res.Run.Model = &bench.ModelInfo{Profile: "p", Scale: 0.0002, Drive: bench.DriveFigures{ReadBytesPerS: 1 << 20, WriteBytesPerS: 1 << 20, ReadIOPS: 100, WriteIOPS: 100},
		Calibration: &bench.ModelCalibration{Ceiling: 0.0005, Floor: 0.0002, FloorWhy: "member_io_timeout 5s", Workload: "rand-read-4k", Target: 0.5, Chosen: 0.0002, CPUBound: true,
			Steps: []bench.CalibrationStep{{Scale: 1, Modelled: 2e7, Achieved: 3000}}}}
	res.Failover = &bench.FailoverRecord{Node: "B"}
	for _, a := range []string{"A", "B", "C", "D", "E"} {
		res.Run.Arrays = append(res.Run.Arrays, bench.ArrayShape{Name: a, Level: "raid5", Data: 3, Parity: 1})
		res.Failover.Arrays = append(res.Failover.Arrays, bench.ArrayFailover{Array: a, Moved: a == "B", Degraded: a != "B"})
	}
	res.Add(rep(bench.LayerFrontend, bench.Healthy, bench.ScenarioRandRead4K, []float64{600, 650, 620}, []float64{8000}))
	res.Add(rep(bench.LayerFrontend, bench.Degraded, bench.ScenarioRandRead4K, []float64{500, 510, 520}, []float64{13000}))
	got := strings.Join(runSummary(res), "\n")
	for _, want := range []string{"Scale 0.0002, chosen at start-up, the floor 0.0002 (member_io_timeout 5s)", "(scale 1) rand-read-4k delivered 3000 IOPS", "at the floor the modelled 4000 IOPS are 133% of what the CPUs deliver", "CPU-bound, not findings"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	ms, ok := MeasuredModelScale(res)
	if !ok || ms.Bound != 0.0002 || !ms.Floored || !strings.Contains(ms.Text(), "the floor of 0.0002") {
		t.Errorf("measured scale %+v %q; want floored at the calibration's 0.0002", ms, ms.Text())
	}
}
