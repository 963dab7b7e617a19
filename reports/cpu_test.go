package reports

import (
	"strings"
	"testing"
	"time"

	"tier0/bench"
)

// TestCPUCostIsNetOfIdle: the cost per GiB charges only the work: five
// tier0d burning 0.1 core each with nothing to do must not make a slow
// modelled run look expensive per byte.
func TestCPUCostIsNetOfIdle(t *testing.T) {
	res := bench.NewResults("r", "s", time.Unix(0, 0), bench.Environment{})
	res.Run.IdleCPU = &bench.CPUCost{Processes: []bench.CPUUse{{Process: "tier0d A", Role: bench.RoleTier0d, UserS: 1}}, WallS: 10}
	m := rep(bench.LayerFrontend, bench.Healthy, bench.ScenarioSeqRead1M, []float64{100}, []float64{1000})
	m.CPU = &bench.CPUCost{Processes: []bench.CPUUse{{Process: "tier0d A", Role: bench.RoleTier0d, UserS: 3}, {Process: "validate", Role: bench.RoleHost, UserS: 0.5}}, Bytes: 2 << 30, Ops: 2048, WallS: 20}
	res.Add(m)
	tb, ok := cpuTable(res)
	if !ok {
		t.Fatal("no CPU table")
	}
	// (3 - 0.1 x 20) / 2 GiB = 0.5 CPU-s per GiB; host 0.25.
	if row := strings.Join(tb.Rows[0], "|"); !strings.Contains(row, "|0.5|") || !strings.Contains(row, "|0.25|") {
		t.Errorf("CPU row %q; want tier0d 0.5 and host 0.25 CPU-s per GiB (net of idle)", row)
	}
	ref, _ := Seed()
	pt, ok := projectionTable(res, ref)
	if !ok || !strings.Contains(strings.Join(pt.Rows[0], "|"), "0.5 CPU-s per GiB|13.2|") {
		t.Errorf("projection %v; want 0.5 x 131.7 / 5 = 13.2 tier0d cores per node", pt.Rows)
	}
}

// TestCPUProjectionUnresolvedAboveIdle: when tier0d's CPU time during a
// scenario does not rise clearly above what it spends idle (a model scaled
// so far down that the drives move a few MiB/s), its cost per GiB is not
// measured here. The projection must say so, not project 0 cores per node
// (a demo printed "0 CPU-s per GiB | 0.0" tier0d cores for the seed's
// 131.7 GiB/s).
func TestCPUProjectionUnresolvedAboveIdle(t *testing.T) {
	res := bench.NewResults("r", "s", time.Unix(0, 0), bench.Environment{})
	res.Run.IdleCPU = &bench.CPUCost{Processes: []bench.CPUUse{{Process: "tier0d A", Role: bench.RoleTier0d, UserS: 1}}, WallS: 10}
	m := rep(bench.LayerFrontend, bench.Healthy, bench.ScenarioSeqRead1M, []float64{100}, []float64{1000})
	// 2.05 CPU-s over 20 s against 0.1 core idle: 0.05 CPU-s above idle, 2.5% of it
	m.CPU = &bench.CPUCost{Processes: []bench.CPUUse{{Process: "tier0d A", Role: bench.RoleTier0d, UserS: 2.05}, {Process: "validate", Role: bench.RoleHost, UserS: 0.5}}, Bytes: 2 << 30, Ops: 2048, WallS: 20}
	res.Add(m)
	ref, _ := Seed()
	pt, ok := projectionTable(res, ref)
	if !ok {
		t.Fatal("no projection table")
	}
	row := strings.Join(pt.Rows[0], "|")
	if strings.Contains(row, "|0.0|") || strings.Contains(row, "0.025 CPU-s per GiB") || !strings.Contains(row, "not resolved") {
		t.Errorf("projection row %q; want tier0d's cost reported as not resolved above its idle cost, not a figure", row)
	}
	tb, _ := cpuTable(res)
	if r := strings.Join(tb.Rows[0], "|"); !strings.Contains(r, "below idle") {
		t.Errorf("CPU row %q; want tier0d's cost marked below idle noise", r)
	}
}
