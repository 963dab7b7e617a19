package validate

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"tier0/bench"
	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/internal/units"
)

// regionOf is the length of the region of dev that the run uses (0: all).
func (r *runner) regionOf(dev blockdev.Device) int64 {
	if r.t.region <= 0 || r.t.region >= dev.Size() {
		return 0
	}
	return r.t.region
}

// scenarios are the seed's four measurements, writes before reads so that
// the reads find written blocks.
func (r *runner) scenarios(gen uint64, verify bool) []bench.Scenario {
	o := bench.Options{Duration: r.t.bench, SeqQueueDepth: r.t.seqQD, RandQueueDepth: r.t.randQD, Verify: verify, Generation: gen, MinGeneration: 1}
	return []bench.Scenario{bench.SeqWrite1M(o), bench.SeqRead1M(o), bench.RandWrite4K(o), bench.RandRead4K(o)}
}

// benchLayer runs the four scenarios on targets, each r.t.repeat times
// (the whole set in turn, so that drift spreads over every scenario), and
// records them under one check: each scenario's repetitions combined
// (median and range) with the CPU time every watched process spent in
// them. gen is the verify generation the writes stamp (0: no verify).
func (r *runner) benchLayer(name string, layer bench.Layer, state bench.State, targets []bench.Target, gen uint64) {
	var probs []string
	scs := r.scenarios(gen, gen > 0)
	reps := make([][]bench.Measurement, len(scs))
	cost := make([]bench.CPUCost, len(scs))
	for rep := 0; rep < max(1, r.t.repeat); rep++ {
		for i, sc := range scs {
			if r.ctx.Err() != nil {
				break
			}
			before, t0 := r.cpu.Read(), time.Now()
			m, ts, res, err := sc.Run(r.ctx, layer, state, targets)
			cost[i].Add(bench.CPUCost{Processes: r.cpu.Since(before, r.cpu.Read()), Bytes: m.Bytes, Ops: m.Ops, WallS: time.Since(t0).Seconds()})
			if res == nil {
				probs = append(probs, err.Error())
				continue
			}
			if rep == 0 {
				r.res.AddSeries(ts)
			}
			reps[i] = append(reps[i], m)
			if err != nil {
				probs = append(probs, err.Error())
			}
			if res.Errors > 0 {
				probs = append(probs, fmt.Sprintf("%s: %d I/O errors (first: %s)", sc.Name, res.Errors, res.FirstError.Message))
			}
			if verr := res.VerifyErr(); verr != nil {
				probs = append(probs, fmt.Sprintf("%s: %v", sc.Name, verr))
			}
		}
	}
	var figs []string
	for i := range scs {
		if len(reps[i]) == 0 {
			continue
		}
		m, err := bench.Combine(reps[i])
		if err != nil {
			probs = append(probs, err.Error())
			continue
		}
		c := cost[i]
		m.CPU = &c
		r.res.Add(m)
		figs = append(figs, figure(m))
	}
	if len(probs) > 0 {
		r.check(name, bench.Fail, strings.Join(probs, "; "))
		return
	}
	r.check(name, bench.Pass, fmt.Sprintf("%d targets, median of %d runs: %s", len(targets), max(1, r.t.repeat), strings.Join(figs, ", ")))
}

func figure(m bench.Measurement) string {
	if m.IOSize >= 1<<20 {
		return fmt.Sprintf("%s %.0f MiB/s", m.Scenario, m.BytesPerS/(1<<20))
	}
	return fmt.Sprintf("%s %.0f IOPS (p99 %s)", m.Scenario, m.IOPS, time.Duration(m.Latency.P99Ns).Round(time.Microsecond))
}

// rawBench measures the drive files directly before any tier0d opens
// them, then removes them so that the cluster starts on blank drives.
func (r *runner) rawBench() error {
	devs, err := openDrives(r.cfg, r.log)
	if err != nil {
		r.check(CheckRaw, bench.Fail, err.Error())
		return err
	}
	var targets []bench.Target
	for _, d := range devs {
		targets = append(targets, bench.Target{ID: d.name, Dev: d.dev})
	}
	r.benchLayer(CheckRaw, bench.LayerRaw, bench.Healthy, targets, 0)
	for _, d := range devs {
		_ = d.dev.Close()
		if err := os.Remove(d.path); err != nil {
			return fmt.Errorf("removing raw-bench drive file %s: %w", d.path, err)
		}
	}
	return r.ctx.Err()
}

// blockBench measures each array at its owner: through the owner's
// frontend controller alone (one path, no multipath), since the RAID runs
// inside tier0d and is not reachable from this process.
func (r *runner) blockBench() {
	st, err := r.status()
	if err != nil {
		r.check(CheckBlock, bench.Fail, err.Error())
		return
	}
	var targets []bench.Target
	var ctrls []*host.Controller
	defer func() {
		for _, c := range ctrls {
			c.Close()
		}
	}()
	for _, a := range st.Arrays {
		n, ok := r.cfg.Node(a.Owner)
		if !ok {
			r.check(CheckBlock, bench.Fail, fmt.Sprintf("array %s: owner %q is not in the site config", a.Name, a.Owner))
			return
		}
		ctx, cancel := context.WithTimeout(r.ctx, 10*time.Second)
		c, err := host.Dial(ctx, n.AdvertiseAddr(n.Frontend), r.hostOptions(a.Name))
		cancel()
		if err != nil {
			r.check(CheckBlock, bench.Fail, fmt.Sprintf("array %s on its owner %s: %v", a.Name, a.Owner, err))
			return
		}
		ctrls = append(ctrls, c)
		ns, err := c.Namespace(1)
		if err != nil {
			r.check(CheckBlock, bench.Fail, fmt.Sprintf("array %s on its owner %s: %v", a.Name, a.Owner, err))
			return
		}
		targets = append(targets, bench.Target{ID: arrayID(a.Name), Dev: ns, Length: r.regionOf(ns)})
	}
	note := "block layer measured through each owner's frontend NVMe/TCP controller alone (one path, no multipath): the RAID runs inside tier0d and is not reachable from the validating process"
	if !slices.Contains(r.res.Run.Notes, note) {
		r.res.Run.Notes = append(r.res.Run.Notes, note)
	}
	r.benchLayer(CheckBlock, bench.LayerBlock, bench.Healthy, targets, 1)
}

// fill writes verify blocks (generation 1) over every array.
func (r *runner) fill() error {
	t0 := time.Now()
	res, err := bench.Fill(r.ctx, 1, r.t.fillQD, r.frontTargets())
	if err == nil && res.Errors > 0 {
		err = fmt.Errorf("%d write errors (first: %s)", res.Errors, res.FirstError.Message)
	}
	if err != nil {
		err = fmt.Errorf("fill: %w", err)
		r.check(CheckFill, bench.Fail, err.Error())
		return err
	}
	r.check(CheckFill, bench.Pass, fmt.Sprintf("%d arrays, %s in %.1f s (%.0f MiB/s)", len(r.arrays), units.FormatBytes(res.Bytes), time.Since(t0).Seconds(), res.BytesPerSecond()/(1<<20)))
	return r.ctx.Err()
}

// idleCPU records what the watched processes spend with the cluster up
// and no load, so that the report can charge each measurement only the
// CPU time its work cost (heartbeats, leases and polls excluded).
func (r *runner) idleCPU() {
	d := 5 * time.Second
	if r.o.Short {
		d = 2 * time.Second
	}
	before, t0 := r.cpu.Read(), time.Now()
	sleepCtx(r.ctx, d)
	r.res.Run.IdleCPU = &bench.CPUCost{Processes: r.cpu.Since(before, r.cpu.Read()), WallS: time.Since(t0).Seconds()}
}

// driveFile is one drive of the raw bench.
type driveFile struct {
	name, path string
	dev        blockdev.Device
}
