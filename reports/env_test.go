package reports

import (
	"strings"
	"testing"
	"time"

	"tier0/bench"
)

// TestSummaryStatesTheCPUsTheRunMayUse: a run confined to 2 CPUs of a
// 254-thread host must say 2, not only the host's count (issue 17: a
// report read "254 cores").
func TestSummaryStatesTheCPUsTheRunMayUse(t *testing.T) {
	res := bench.NewResults("r", "local-5node", time.Unix(1700000000, 0), bench.Environment{PhysicalCores: 127, LogicalCores: 254})
	res.Environment.CPUs = &bench.CPULimits{Affinity: 2, Usable: 2}
	got := strings.Join(runSummary(res), "\n")
	if !strings.Contains(got, "this run may use 2 CPUs (affinity 2; no cgroup CPU quota)") {
		t.Errorf("summary does not state the run's CPUs:\n%s", got)
	}
	res.Environment.CPUs = nil
	got = strings.Join(runSummary(res), "\n")
	if !strings.Contains(got, "CPUs the run may use: not recorded") {
		t.Errorf("summary of an old results file hides that the run's CPUs are unknown:\n%s", got)
	}
}
