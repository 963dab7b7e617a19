package validate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	"tier0/bench"
	"tier0/daemon/config"
	"tier0/internal/localcluster"
)

// The start-up calibration of the model's scale (issue 17, docs/BENCH.md):
// the largest scale at which the whole topology stays bound by the
// modelled drives and links, not by this machine's CPUs.
//
// It measures what the CPUs deliver with the drives out of the way (the
// model at scale 1: a Micron 7450 per drive is far more than two cores
// can drive through five tier0d) and sets the scale where the modelled
// capacity is calibrationShare of that. It does not step down through
// candidate scales measuring each: on a fresh cluster the arrays' initial
// parity sync holds about 70% of every modelled drive's time for as long
// as it runs (a 64 KiB chunk read per member per stripe against 4 KiB
// reads; 20 s at 1/2000, 90 s at 1/9000), so a short measurement at a
// candidate scale measures the sync, not the CPUs (a first version saw
// 11% of the model at 0.0005 and 26% at 0.00011); at scale 1 the sync is
// done in well under a second.
const (
	// calibrationShare is the share of the CPUs' measured capacity the
	// model's capacity is set to: at half, the CPUs' queueing adds little
	// to the modelled service times, and the scenarios, which also verify
	// every block, keep headroom above the verdict's 75%.
	calibrationShare = 0.5
	// floorShare: at the floor, a member write queued behind the deepest
	// queue of the run's sequential writes completes within this share of
	// policies.member_io_timeout.
	floorShare = 0.5
)

// measureFunc runs the calibration workload at scale s and returns the
// rate it achieved and the modelled drives' capacity for it at s (I/Os
// per second).
type measureFunc func(ctx context.Context, s float64) (achieved, modelled float64, err error)

// chooseScale measures the workload at scale 1 (the CPUs' capacity C
// against the model's capacity M there) and chooses calibrationShare·C/M,
// at most ceiling (the site's model.scale) and at least floor; a scale
// raised to the floor is CPU-bound when the model's capacity there
// exceeds what the CPUs delivered.
func chooseScale(ctx context.Context, ceiling, floor float64, measure measureFunc) (bench.ModelCalibration, error) {
	cal := bench.ModelCalibration{Ceiling: ceiling, Floor: floor, Target: calibrationShare}
	achieved, modelled, err := measure(ctx, 1)
	if err != nil {
		return cal, fmt.Errorf("calibration at scale 1: %w", err)
	}
	if modelled <= 0 || achieved <= 0 {
		return cal, fmt.Errorf("calibration at scale 1: %.0f of %.0f IOPS: nothing to scale by", achieved, modelled)
	}
	cal.Steps = append(cal.Steps, bench.CalibrationStep{Scale: 1, Modelled: modelled, Achieved: achieved})
	s := calibrationShare * achieved / modelled
	switch {
	case s >= ceiling:
		cal.Chosen = ceiling
	case s >= floor:
		cal.Chosen = s
	default:
		// Raised to the floor: CPU-bound when the model's capacity there
		// exceeds what the CPUs delivered (no figure can reach it); between
		// the share and that, the margin is thinner than aimed at and the
		// verdict's per-figure check tells.
		cal.Chosen = floor
		cal.CPUBound = floor*modelled > achieved
	}
	if cal.Chosen < floor {
		cal.Chosen = floor // a ceiling below the floor
	}
	return cal, nil
}

// modelFloor is the smallest scale the run may use: at it, a member
// write queued behind the deepest queue of the run's sequential writes
// (qd writes of ioSize per array in flight, each putting ioSize/k bytes
// on every member; the arrays sharing a drive add up) is done within
// floorShare of member_io_timeout. Below it the model itself would make
// member I/O time out and members drop out of their arrays.
func modelFloor(cfg *config.Config, qd int, ioSize int64) (float64, string) {
	timeout := cfg.Policies.MemberIOTimeout.D()
	if timeout <= 0 {
		timeout = config.DefaultMemberIOTimeout
	}
	queued := map[string]float64{} // drive → bytes in flight
	for _, a := range cfg.Arrays {
		k := len(a.Members) - a.Parity()
		if k <= 0 {
			continue
		}
		for _, m := range a.Members {
			queued[m] += float64(qd) * float64(ioSize) / float64(k)
		}
	}
	floor, worst := 0.0, ""
	for d, bytes := range queued {
		f, _, _, ok := cfg.DriveModelAt(d, 1)
		if !ok || f.WriteBytesPerS <= 0 {
			continue
		}
		if s := bytes / (f.WriteBytesPerS * timeout.Seconds() * floorShare); s > floor || s == floor && d < worst {
			floor, worst = s, d
		}
	}
	if floor == 0 {
		return 0, ""
	}
	return floor, fmt.Sprintf("at it, the %.2f MiB of sequential writes queued on drive %s drain within %.0f%% of member_io_timeout %s", queued[worst]/(1<<20), worst, 100*floorShare, timeout)
}

// randReadCapacity is the modelled capacity for healthy 4 KiB random
// reads of every array at scale s: each member drive serving reads at the
// larger of its IOPS and its bandwidth cost (a drive shared by arrays
// counts once).
func randReadCapacity(cfg *config.Config, s float64) float64 {
	seen := map[string]bool{}
	total := 0.0
	for _, a := range cfg.Arrays {
		for _, m := range a.Members {
			if seen[m] {
				continue
			}
			seen[m] = true
			f, _, _, ok := cfg.DriveModelAt(m, s)
			if !ok {
				continue
			}
			cost := 0.0
			if f.ReadIOPS > 0 {
				cost = 1 / f.ReadIOPS
			}
			if f.ReadBytesPerS > 0 {
				cost = math.Max(cost, 4096/f.ReadBytesPerS)
			}
			if cost > 0 {
				total += 1 / cost
			}
		}
	}
	return total
}

// setScale makes s the scale in force: for this process (the raw bench,
// the results) and for every tier0d started from now on.
func (r *runner) setScale(s float64) {
	v := strconv.FormatFloat(s, 'g', -1, 64)
	os.Setenv(config.EnvModelScale, v)
	if r.lc != nil {
		r.lc.SetEnv(config.EnvModelScale, v)
	}
}

// calibrate chooses the model's scale before anything is measured (local
// runs under a model only): the CPU-heaviest workload, 4 KiB random reads
// through every array's frontend, runs briefly on a throw-away cluster
// with the drives' model at scale 1 (chooseScale). A scale given with --model-scale or
// TIER0_MODEL_SCALE is kept, not calibrated. The choice and how it was
// made go into the results' model.
func (r *runner) calibrate() {
	if r.res.Run.Model == nil || r.lc == nil {
		return
	}
	floor, floorWhy := modelFloor(r.cfg, max(r.t.seqQD, r.t.fillQD), 1<<20)
	var cal bench.ModelCalibration
	if r.scaleGiven {
		cal = bench.ModelCalibration{Given: true, Ceiling: r.cfg.ModelScale(), Chosen: r.cfg.ModelScale(), Floor: floor, FloorWhy: floorWhy}
	} else {
		ceiling := r.cfg.Model.Scale
		if ceiling <= 0 {
			ceiling = 1
		}
		fmt.Fprintf(r.o.Out, "calibrating the model's scale (at most %.2g, at least %.2g): %s on a throw-away cluster, the drives' model at scale 1\n", ceiling, floor, calibrationWorkload)
		var err error
		measure := r.measureScale
		if measure == nil {
			measure = r.calibrationRun
		}
		cal, err = chooseScale(r.ctx, ceiling, floor, measure)
		if err != nil {
			cal.Error, cal.Chosen, cal.CPUBound = oneLine(err.Error(), 300), math.Max(ceiling, floor), false
		}
		cal.FloorWhy, cal.Workload = floorWhy, calibrationWorkload
	}
	r.setScale(cal.Chosen)
	r.res.Run.Model = modelInfo(r.cfg, true)
	r.res.Run.Model.Calibration = &cal
	fmt.Fprintln(r.o.Out, cal.Text())
	if cal.CPUBound {
		r.res.Run.Notes = append(r.res.Run.Notes, "CPU-bound: "+cal.Text())
	}
}

const calibrationWorkload = "rand-read-4k through every array's frontend"

// calibrationRun is the calibration's measurement: a cluster on blank
// drives at scale s, the frontends connected, 4 KiB random reads
// (unverified: the arrays are not filled) for a few seconds to let the
// initial parity sync finish, then as long again measured; then
// everything is stopped and the work files removed.
func (r *runner) calibrationRun(ctx context.Context, s float64) (achieved, modelled float64, err error) {
	r.setScale(s)
	// The calibration's tier0d processes are not the run's: their CPU
	// time is not watched.
	onStart := r.lc.OnStart(nil)
	defer func() {
		for a, m := range r.fronts {
			_ = m.Close()
			delete(r.fronts, a)
		}
		r.lc.Stop(r.t.stopGrace)
		r.lc.OnStart(onStart)
		if cerr := localcluster.CleanWork(r.cfg, r.work); cerr != nil && err == nil {
			err = fmt.Errorf("removing the calibration's files: %w", cerr)
		}
		if merr := os.MkdirAll(r.work, 0o755); merr != nil && err == nil {
			err = merr
		}
	}()
	for _, n := range r.cfg.Nodes {
		if err := r.lc.start(n.Name); err != nil {
			return 0, 0, err
		}
	}
	if _, err := r.waitFor(r.t.boot, r.healthy); err != nil {
		return 0, 0, fmt.Errorf("cluster not up after %s: %w", r.t.boot, err)
	}
	if err := r.connectFrontends(); err != nil {
		return 0, 0, err
	}
	d := 3 * time.Second
	if r.o.Short {
		d = time.Second
	}
	warm := bench.RandRead4K(bench.Options{Duration: d, RandQueueDepth: r.t.randQD})
	if _, _, _, err := warm.Run(ctx, bench.LayerFrontend, bench.Healthy, r.frontTargets()); err != nil {
		return 0, 0, err
	}
	sc := bench.RandRead4K(bench.Options{Duration: d, RandQueueDepth: r.t.randQD})
	m, _, res, err := sc.Run(ctx, bench.LayerFrontend, bench.Healthy, r.frontTargets())
	if err == nil && res != nil && res.Errors > 0 {
		err = fmt.Errorf("%d I/O errors (first: %s)", res.Errors, res.FirstError.Message)
	}
	if err != nil {
		return 0, 0, err
	}
	if m.IOPS <= 0 {
		return 0, 0, errors.New("no I/O completed")
	}
	return m.IOPS, randReadCapacity(r.cfg, s), nil
}
