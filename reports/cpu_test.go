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
