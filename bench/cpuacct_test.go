package bench

import (
	"math"
	"strings"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	// A command name with a space and a ')' in it, utime 250, stime 75.
	stat := "4242 (tier0d (A) x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 75 0 0 20 0 12 0 100 1000000 300 18446744073709551615"
	got, err := ParseProcStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	if got.UserS != 2.5 || got.SystemS != 0.75 {
		t.Errorf("ParseProcStat = %+v, want user 2.5 s, system 0.75 s", got)
	}
	for _, bad := range []string{"4242 tier0d S 1", "4242 (x) S 1 2 3", "4242 (x) S 1 2 3 4 5 6 7 8 9 10 a b c"} {
		if _, err := ParseProcStat(bad); err == nil || !strings.Contains(err.Error(), "/proc stat") {
			t.Errorf("ParseProcStat(%q) = %v; want an error naming the input", bad, err)
		}
	}
	self, err := ReadProcCPU("self")
	if err != nil || self.UserS < 0 {
		t.Errorf("ReadProcCPU(self) = %+v, %v", self, err)
	}
}

func TestCPUWatchAndCost(t *testing.T) {
	now := map[string]ProcCPU{"10": {1, 0.5}, "11": {3, 1}}
	w := &CPUWatch{read: func(pid string) (ProcCPU, error) { return now[pid], nil }}
	w.Watch("10", "tier0d A", "tier0d")
	w.Watch("11", "validate", "host")
	a := w.Read()
	now["10"] = ProcCPU{3, 1.5}
	now["11"] = ProcCPU{3.5, 1}
	uses := w.Since(a, w.Read())
	c := CPUCost{Processes: uses, Bytes: 4 << 30, Ops: 4096, WallS: 2}
	if got := c.Seconds("tier0d"); got != 3 {
		t.Errorf("tier0d seconds = %v, want 3", got)
	}
	if got := c.PerGiB("tier0d"); got != 0.75 {
		t.Errorf("per GiB = %v, want 0.75", got)
	}
	if got := c.PerMillionOps(""); math.Abs(got-3.5/0.004096) > 1e-9 {
		t.Errorf("per million ops = %v", got)
	}
	if got := c.Cores(""); got != 1.75 {
		t.Errorf("cores = %v, want 1.75", got)
	}
	c.Add(c)
	if c.Bytes != 8<<30 || c.Seconds("") != 7 || len(c.Processes) != 2 {
		t.Errorf("Add doubled = %+v", c)
	}
}

func TestCombineRepetitions(t *testing.T) {
	mk := func(bps float64, lat int64) Measurement {
		return Measurement{Layer: LayerFrontend, State: Healthy, Scenario: ScenarioSeqRead1M, IOSize: 1 << 20, BytesPerS: bps, IOPS: bps / (1 << 20),
			Latency: LatencySummary{MeanNs: lat}, Verify: &VerifyCounts{Checked: 10, OK: 10}}
	}
	m, err := Combine([]Measurement{mk(300, 9), mk(100, 30), mk(200, 10)})
	if err != nil {
		t.Fatal(err)
	}
	if m.BytesPerS != 200 || m.Latency.MeanNs != 10 || len(m.Runs) != 3 || m.Verify.Checked != 30 {
		t.Errorf("Combine = %+v; want median 200 B/s, median latency 10, 3 runs, 30 verified", m)
	}
	s := m.Spread(MetricBytes)
	if s != (Spread{Median: 200, Min: 100, Max: 300, N: 3}) {
		t.Errorf("spread = %+v", s)
	}
	if !s.Overlaps(Spread{Min: 290, Max: 400}) || s.Overlaps(Spread{Min: 301, Max: 400}) {
		t.Errorf("Overlaps wrong")
	}
	if _, err := Combine([]Measurement{mk(1, 1), {Layer: LayerRaw, Scenario: ScenarioSeqRead1M}}); err == nil {
		t.Error("combining two scenarios succeeded")
	}
	one := mk(5, 5)
	if s := one.Spread(MetricBytes); s.N != 1 || s.Median != 5 {
		t.Errorf("spread of an unrepeated measurement = %+v", s)
	}
}

func TestCPUCostNetOfIdle(t *testing.T) {
	idle := &CPUCost{Processes: []CPUUse{{Process: "tier0d A", UserS: 0.5, SystemS: 0.5}}, WallS: 10} // 0.1 core idle
	c := CPUCost{Processes: []CPUUse{{Process: "tier0d A", UserS: 3, SystemS: 1}, {Process: "validate", UserS: 1}}, WallS: 20, Bytes: 1 << 30}
	n := c.Net(idle)
	if got := n.Seconds("") - 1; math.Abs(got-2) > 1e-9 {
		t.Errorf("net tier0d A = %v CPU-s, want 4 - 0.1 x 20 = 2", got)
	}
	if n.Processes[1].Seconds() != 1 || c.Processes[0].Seconds() != 4 {
		t.Errorf("Net changed a process without idle figures, or its receiver: %+v / %+v", n, c)
	}
	if got := c.Net(nil); got.Seconds("") != 5 {
		t.Errorf("Net(nil) = %v", got.Seconds(""))
	}
	busy := CPUCost{Processes: []CPUUse{{Process: "tier0d A", UserS: 0.1}}, WallS: 20}
	if got := busy.Net(idle).Seconds(""); got != 0 {
		t.Errorf("net below zero: %v, want 0", got)
	}
}
