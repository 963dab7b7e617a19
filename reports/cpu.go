package reports

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"tier0/bench"
)

// cpuTable lists, per measurement that recorded it, the CPU cost of the
// tier0d processes (every layer of the storage: backend target, backend
// host + RAID, frontend target) and of the host side (the load
// generator with its NVMe/TCP host and multipath; on the raw layer, its
// file I/O): CPU-seconds per GiB moved and per million I/Os.
func cpuTable(res *bench.Results) (table, bool) {
	t := table{Title: "CPU cost", Header: []string{"scenario", "layer", "state", "tier0d CPU-s/GiB", "tier0d CPU-s/M I/O", "host CPU-s/GiB", "host CPU-s/M I/O", "cores busy (tier0d + host)", "per process (CPU-s)"},
		Note: "From each process's own accounting (/proc/PID/stat, user + system) over all repetitions of the scenario, less what each process spends idle with the cluster up (measured before the benches; heartbeats, leases, polls), when recorded. tier0d runs every storage layer of a node in one process (backend target, backend host and RAID, frontend target); the layers' costs show as the differences between the raw, block and frontend rows. A machine short of CPUs inflates these figures (contention, spinning): read them beside its usable CPUs. \"below idle\": tier0d's CPU time rose less than " + fmt.Sprintf("%.0f%%", 100*bench.MinAboveIdle) + " above what it spends idle over the same time, which is within the idle cost's own variation, so its work cost is not measured by this run."}
	ms := slices.Clone(res.Measurements)
	slices.SortStableFunc(ms, func(a, b bench.Measurement) int {
		return cmp.Or(cmp.Compare(rank(scenarioOrder, a.Scenario), rank(scenarioOrder, b.Scenario)),
			cmp.Compare(rank([]bench.Layer{bench.LayerRaw, bench.LayerBlock, bench.LayerFrontend}, a.Layer), rank([]bench.Layer{bench.LayerRaw, bench.LayerBlock, bench.LayerFrontend}, b.Layer)),
			cmp.Compare(rank([]bench.State{bench.Healthy, bench.Degraded}, a.State), rank([]bench.State{bench.Healthy, bench.Degraded}, b.State)))
	})
	for _, m := range ms {
		if m.CPU == nil {
			continue
		}
		net := m.CPU.Net(res.Run.IdleCPU)
		c := &net
		resolved := m.CPU.Resolved(res.Run.IdleCPU, bench.RoleTier0d)
		var procs []string
		for _, p := range c.Processes {
			procs = append(procs, fmt.Sprintf("%s %.2f", strings.TrimPrefix(p.Process, "tier0d "), p.Seconds()))
		}
		dash := func(v float64, tier0d bool) string {
			if tier0d && !resolved {
				return "below idle"
			}
			return fmt.Sprintf("%.3g", v)
		}
		t.Rows = append(t.Rows, []string{m.Scenario, string(m.Layer), m.Label,
			dash(c.PerGiB(bench.RoleTier0d), true), dash(c.PerMillionOps(bench.RoleTier0d), true),
			dash(c.PerGiB(bench.RoleHost), false), dash(c.PerMillionOps(bench.RoleHost), false),
			fmt.Sprintf("%.2f + %.2f", c.Cores(bench.RoleTier0d), c.Cores(bench.RoleHost)), strings.Join(procs, ", ")})
	}
	return t, len(t.Rows) > 0
}

// projectionTable scales the healthy frontend CPU cost to the seed's
// published figures: the cores per node its 5-node cluster would need at
// 131.7 GiB/s, 46.9 GiB/s, 5.83M and 3.12M IOPS if tier0 cost there what
// it cost here.
func projectionTable(res *bench.Results, ref *Reference) (table, bool) {
	nodes := float64(ref.Topology.Nodes)
	if nodes <= 0 {
		nodes = 5
	}
	have := "this run's machine: usable CPUs not recorded"
	if c := res.Environment.CPUs; c != nil {
		have = "this run's machine: " + c.String()
	}
	t := table{Title: "CPU projection to the seed's cluster", Header: []string{"workload", "seed figure", "tier0d cost here", "tier0d cores per node", "host cores per node", "total per node"},
		Note: fmt.Sprintf("Cores per node = cost per GiB (or per million I/Os) measured here, net of idle, × the seed's figure ÷ %g nodes. The seed does not publish its nodes' CPUs (GPU servers of its class, 8 GPUs each, commonly have 64–128 cores); %s. The projection assumes cost scales linearly with the rate, which holds for per-byte work (checksums, parity, copies) and overstates it where this machine's CPU contention inflated the cost. \"not resolved\": tier0d's CPU time in the scenario did not rise clearly above its idle cost (the model's scaled-down drives move too few bytes for that), so no per-GiB or per-I/O cost can be projected from this run; the target's own cost per I/O is measured by make bench (bench/perf, docs/PERFORMANCE.md).", nodes, have)}
	h := ref.Healthy
	for _, x := range []struct {
		sc, what string
		rate     float64
		iops     bool
	}{
		{bench.ScenarioSeqRead1M, "sequential read", h.SeqReadGiBs.Filesystem, false},
		{bench.ScenarioSeqWrite1M, "sequential write", h.SeqWriteGiBs.Filesystem, false},
		{bench.ScenarioRandRead4K, "4 KiB random read", h.RandRead4KIOPS.Filesystem, true},
		{bench.ScenarioRandWrite4K, "4 KiB random write", h.RandWrite4KIOPS.Filesystem, true},
	} {
		m, ok := res.Find(bench.LayerFrontend, bench.Healthy, x.sc)
		if !ok || m.CPU == nil || x.rate <= 0 {
			continue
		}
		resolved := m.CPU.Resolved(res.Run.IdleCPU, bench.RoleTier0d)
		gross, idleExp := m.CPU.Seconds(bench.RoleTier0d), m.CPU.IdleExpected(res.Run.IdleCPU, bench.RoleTier0d)
		net := m.CPU.Net(res.Run.IdleCPU)
		m.CPU = &net
		var costT, costH float64
		var seed, unit string
		if x.iops {
			costT, costH = m.CPU.PerMillionOps(bench.RoleTier0d), m.CPU.PerMillionOps(bench.RoleHost)
			seed, unit = fmtIOPS(x.rate)+" IOPS", "CPU-s per million I/Os"
			x.rate /= 1e6
		} else {
			costT, costH = m.CPU.PerGiB(bench.RoleTier0d), m.CPU.PerGiB(bench.RoleHost)
			seed, unit = fmt.Sprintf("%.1f GiB/s", x.rate), "CPU-s per GiB"
		}
		ct, chost := costT*x.rate/nodes, costH*x.rate/nodes
		if !resolved {
			t.Rows = append(t.Rows, []string{x.what, seed, fmt.Sprintf("not resolved: %.3g CPU-s against %.3g CPU-s idle over the same time", gross, idleExp), "not measured", fmt.Sprintf("%.1f", chost), fmt.Sprintf("%.1f + tier0d not measured", chost)})
			continue
		}
		t.Rows = append(t.Rows, []string{x.what, seed, fmt.Sprintf("%.3g %s", costT, unit), fmt.Sprintf("%.1f", ct), fmt.Sprintf("%.1f", chost), fmt.Sprintf("%.1f", ct+chost)})
	}
	return t, len(t.Rows) > 0
}
