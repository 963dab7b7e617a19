package validate

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"tier0/internal/units"
	"time"

	"github.com/schollz/progressbar/v3"

	"tier0/bench"
	"tier0/daemon/api"
	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/local"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/gds"
)

// httpClient is the API client's transport: short timeouts, since a
// killed node must not hold a poll up.
var httpClient = http.Client{Timeout: 3 * time.Second}

// openDrives opens every drive file of the site as tier0d would.
func openDrives(cfg *config.Config, log *slog.Logger) ([]driveFile, error) {
	var out []driveFile
	for _, n := range cfg.Nodes {
		for _, d := range n.Drives {
			dev, err := local.Open(absIn(d.Path), local.Options{Size: int64(d.Size), Create: true, AllowBuffered: true, Logger: log})
			if err != nil {
				for _, o := range out {
					o.dev.Close()
				}
				return nil, fmt.Errorf("drive %s of node %s (%s): %w", d.Name, n.Name, d.Path, err)
			}
			var shaped blockdev.Device = dev
			if m, link, _, ok := cfg.DriveModelOf(d.Name); ok {
				// The raw bench measures the drives as tier0d opens them:
				// through their model (a node's drives share its link).
				shaped = blockdev.NewShaped(dev, blockdev.Model(m), nil, blockdev.SharedLink("validate-raw/"+cfg.Cluster+"/"+n.Name, link))
			}
			out = append(out, driveFile{name: d.Name, path: absIn(d.Path), dev: shaped})
		}
	}
	return out, nil
}

// failover kills the victim node under verified load and checks what the
// design promises: the arrays it owned move complete to survivors, the
// arrays with a member on it run degraded on their owners, I/O goes on,
// and every acknowledged block verifies.
func (r *runner) failover() error {
	before, err := r.status()
	if err != nil {
		return err
	}
	var owned, others []string
	owner := map[string]string{}
	for _, a := range before.Arrays {
		owner[a.Name] = a.Owner
		if a.Owner == r.victim {
			owned = append(owned, a.Name)
		} else {
			others = append(others, a.Name)
		}
	}
	targets := r.frontTargets()

	// Reads that verify every block (MinGeneration 1: intact, in place,
	// written), and one sequential writer per array whose acknowledged
	// prefix must read back at generation 2 afterwards.
	readCfg := bench.RandRead4K(bench.Options{RandQueueDepth: r.t.failoverQD}).Config
	readCfg.Duration = time.Hour // ended by ctx
	readCfg.Interval, readCfg.TolerateErrors = 100*time.Millisecond, true
	readCfg.Verify, readCfg.MinGeneration = true, 1
	writeCfg := bench.Config{Pattern: bench.SeqWrite, IOSize: 1 << 20, QueueDepth: 1, Passes: 1, Duration: time.Hour,
		Interval: 100 * time.Millisecond, TolerateErrors: true, Verify: true, Generation: 2}
	lctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	hr, err := bench.Start(lctx, readCfg, targets)
	if err != nil {
		return err
	}
	// The writers start shortly before the kill, so that they are still
	// sweeping (and the moved array's writer is in flight) when it comes.
	sleepCtx(r.ctx, r.t.preKill-r.t.preKill/4)
	hw, err := bench.Start(lctx, writeCfg, targets)
	if err != nil {
		cancel()
		hr.Wait()
		return err
	}
	stopLoad := func() (*bench.Result, *bench.Result) {
		cancel()
		rr, _ := hr.Wait()
		rw, _ := hw.Wait()
		return rr, rw
	}
	sleepCtx(r.ctx, r.t.preKill/4)
	label := fmt.Sprintf("node %s killed", r.victim)
	hr.Mark(label)
	hw.Mark(label)
	r.down[r.victim] = true
	killedAt, err := r.ctl.kill(r.victim)
	if err != nil {
		stopLoad()
		r.check(CheckMoved, bench.Fail, err.Error())
		return err
	}
	fmt.Fprintf(r.o.Out, "killed node %s (kill -9) at %s under load on every array\n", r.victim, killedAt.Format("15:04:05.000"))

	var movedAt time.Time
	moved := func(st api.Status) (bool, string) {
		for _, a := range st.Arrays {
			if slices.Contains(owned, a.Name) {
				if a.Owner == r.victim || a.Owner == "" || a.Phase != "active" {
					return false, fmt.Sprintf("array %s still %s/%s on %q", a.Name, a.State, a.Phase, a.Owner)
				}
			} else if a.State != cluster.StateDegraded || a.Phase != "active" {
				return false, fmt.Sprintf("array %s is %s/%s on %q, waiting for degraded/active", a.Name, a.State, a.Phase, a.Owner)
			}
		}
		return true, ""
	}
	after, werr := r.waitFor(r.t.failover, moved)
	if werr == nil {
		movedAt = time.Now()
		sleepCtx(r.ctx, r.t.postMove)
	}
	rr, rw := stopLoad()
	if r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	if werr != nil {
		after, _ = r.status()
	}

	// Where every array went.
	views := map[string]cluster.ArrayView{}
	for _, a := range after.Arrays {
		views[a.Name] = a
	}
	var movedOK, movedBad []string
	for _, name := range owned {
		a := views[name]
		var notOK []string
		for _, m := range a.Members {
			if m.State != cluster.MemberOK {
				notOK = append(notOK, m.Drive+" "+string(m.State))
			}
		}
		switch {
		case a.Owner == r.victim || a.Owner == "" || a.Phase != "active":
			movedBad = append(movedBad, fmt.Sprintf("array %s did not move: %s/%s on %q", name, a.State, a.Phase, a.Owner))
		case len(notOK) > 0 || a.State != cluster.StateOptimal:
			movedBad = append(movedBad, fmt.Sprintf("array %s moved to %s but is %s, not complete: %s", name, a.Owner, a.State, strings.Join(notOK, ", ")))
		default:
			movedOK = append(movedOK, fmt.Sprintf("array %s: %s -> %s, epoch %d, %d of %d members ok", name, r.victim, a.Owner, a.Epoch, len(a.Members), len(a.Members)))
		}
	}
	switch {
	case len(owned) == 0:
		r.check(CheckMoved, bench.Fail, fmt.Sprintf("node %s owned no array before the kill; expected its home array", r.victim))
	case len(movedBad) > 0:
		r.check(CheckMoved, bench.Fail, strings.Join(movedBad, "; "))
	default:
		r.check(CheckMoved, bench.Pass, fmt.Sprintf("%s (seen %.1f s after the kill)", strings.Join(movedOK, "; "), movedAt.Sub(killedAt).Seconds()))
	}
	var degOK, degBad []string
	for _, name := range others {
		a := views[name]
		var missing []string
		for _, m := range a.Members {
			if m.Node == r.victim && m.State == cluster.MemberMissing {
				missing = append(missing, m.Drive)
			}
		}
		if a.State == cluster.StateDegraded && a.Phase == "active" && a.Owner == owner[name] && len(missing) > 0 {
			degOK = append(degOK, fmt.Sprintf("%s on %s without %s", name, a.Owner, strings.Join(missing, ",")))
		} else {
			degBad = append(degBad, fmt.Sprintf("array %s: %s/%s on %q (was on %s), members missing on %s: %v", name, a.State, a.Phase, a.Owner, owner[name], r.victim, missing))
		}
	}
	if len(degBad) > 0 {
		r.check(CheckDegraded, bench.Fail, strings.Join(degBad, "; "))
	} else {
		r.check(CheckDegraded, bench.Pass, "degraded, still served by their owners: "+strings.Join(degOK, "; "))
	}

	// I/O went on, on every array, and nothing failed.
	rec := bench.FailoverRecord{Node: r.victim, KilledAt: killedAt, SeriesID: "failover"}
	var ioProbs, stalls []string
	if rr == nil || rw == nil || len(rr.Marks) == 0 {
		ioProbs = append(ioProbs, "the load did not run through the kill")
	} else {
		if len(owned) > 0 {
			if fr, ok := bench.FailoverFrom(r.victim, rr.Marks[0], arrayID(owned[0]), "failover"); ok {
				rec = fr
			}
		}
		for _, t := range rr.Marks[0].Targets {
			if t.FirstIssued.IsZero() {
				ioProbs = append(ioProbs, fmt.Sprintf("%s: no read issued after the kill completed", t.ID))
			}
		}
		for _, res := range []*bench.Result{rr, rw} {
			if res.Errors > 0 {
				ioProbs = append(ioProbs, fmt.Sprintf("%s: %d I/O errors (first: %s)", res.Config.Pattern, res.Errors, res.FirstError.Message))
			}
		}
		for _, t := range rr.Targets {
			stalls = append(stalls, fmt.Sprintf("%s %s", t.ID, t.LongestStall.Duration.Round(time.Millisecond)))
		}
		ts := bench.SeriesFrom("failover", rr)
		ts.Layer, ts.State, ts.Scenario = bench.LayerFrontend, bench.Degraded, bench.ScenarioRandRead4K
		if !rec.FirstIOAt.IsZero() {
			ts.Mark(rec.FirstIOAt, "first I/O on array "+owned[0])
		}
		r.res.AddSeries(ts)
	}
	if len(ioProbs) > 0 {
		r.check(CheckIOContinued, bench.Fail, strings.Join(ioProbs, "; "))
	} else {
		r.check(CheckIOContinued, bench.Pass, fmt.Sprintf("no I/O error on any array; %d reads, %d writes; longest stall per array: %s", rr.Ops, rw.Ops, strings.Join(stalls, ", ")))
	}
	if rec.FirstIOAt.IsZero() {
		r.check(CheckFailoverTime, bench.Fail, fmt.Sprintf("no read issued after the kill completed on %s", strings.Join(owned, ",")))
	} else {
		r.check(CheckFailoverTime, bench.Pass, fmt.Sprintf("node %s killed -> first I/O completed on array %s: %.2f s", r.victim, owned[0], rec.Duration.Seconds()))
	}

	// Every acknowledged block: the reads during the failover verified
	// what they read; now the writers' acknowledged prefixes must read
	// back at their generation.
	var ackProbs []string
	var vr *bench.Result
	if rr != nil && rw != nil {
		if err := rr.VerifyErr(); err != nil {
			ackProbs = append(ackProbs, "reads during the failover: "+err.Error())
		}
		var prefix []bench.Target
		for i, t := range rw.Targets {
			if t.Bytes >= 1<<20 {
				prefix = append(prefix, bench.Target{ID: targets[i].ID, Dev: targets[i].Dev, Length: min(t.Bytes, regionLen(targets[i])) / 4096 * 4096})
			}
		}
		if len(prefix) == 0 {
			ackProbs = append(ackProbs, "no write was acknowledged during the failover")
		} else {
			var err error
			vr, err = bench.Run(r.ctx, bench.Config{Pattern: bench.SeqRead, IOSize: 1 << 20, QueueDepth: r.t.fillQD, Passes: 1, Verify: true, MinGeneration: 2}, prefix)
			switch {
			case err != nil:
				ackProbs = append(ackProbs, "reading back the acknowledged writes: "+err.Error())
			case vr.VerifyErr() != nil:
				ackProbs = append(ackProbs, "acknowledged writes read back: "+vr.VerifyErr().Error())
			}
		}
	}
	for i, name := range r.arrays {
		af := bench.ArrayFailover{Array: name, From: owner[name], To: views[name].Owner, Moved: slices.Contains(owned, name), Degraded: views[name].State == cluster.StateDegraded}
		if rr != nil && i < len(rr.Targets) {
			af.Stall = rr.Targets[i].LongestStall.Duration
			af.Verify = rr.Targets[i].Verify
		}
		if vr != nil {
			for _, t := range vr.Targets {
				if t.ID == arrayID(name) {
					af.Verify.Checked += t.Verify.Checked
					af.Verify.Corrupt += t.Verify.Corrupt
					af.Verify.Misplaced += t.Verify.Misplaced
					af.Verify.Stale += t.Verify.Stale
					af.Verify.Unwritten += t.Verify.Unwritten
				}
			}
		}
		rec.Arrays = append(rec.Arrays, af)
	}
	r.res.Failover = &rec
	if len(ackProbs) > 0 {
		r.check(CheckAckVerified, bench.Fail, strings.Join(ackProbs, "; "))
	} else {
		r.check(CheckAckVerified, bench.Pass, fmt.Sprintf("%d blocks read during the failover and all %d blocks written then (%s acknowledged) verify", rr.Verify.Checked, vr.Verify.Checked, units.FormatBytes(rw.Bytes)))
	}
	if werr != nil {
		return fmt.Errorf("failover did not complete within %s: %w", r.t.failover, werr)
	}
	return nil
}

// regionLen is the length of a target's region.
func regionLen(t bench.Target) int64 {
	if t.Length > 0 {
		return t.Length
	}
	return t.Dev.Size() - t.Offset
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// restart starts the killed node again with the same command line and
// follows the resync/rebuild of the arrays it holds members of, then the
// failback of the arrays it owned.
func (r *runner) restart() error {
	st, err := r.status()
	if err != nil {
		return err
	}
	var repairing []string
	memberBytes := map[string]int64{}
	for _, a := range st.Arrays {
		for _, m := range a.Members {
			if m.Node == r.victim {
				repairing = append(repairing, a.Name)
				break
			}
		}
		if ac, ok := r.cfg.Array(a.Name); ok && r.fronts[a.Name] != nil {
			if dm := int64(len(ac.Members) - ac.Parity()); dm > 0 {
				memberBytes[a.Name] = r.fronts[a.Name].Size() / dm
			}
		}
	}
	restartAt := time.Now()
	if err := r.ctl.start(r.victim); err != nil {
		r.check(CheckRestart, bench.Fail, err.Error())
		return err
	}
	delete(r.down, r.victim)
	if _, err := r.waitFor(r.t.boot, func(st api.Status) (bool, string) {
		for _, n := range st.Nodes {
			if n.Name == r.victim && n.State == cluster.NodeUp {
				return true, ""
			}
		}
		return false, fmt.Sprintf("node %s not up yet", r.victim)
	}); err != nil {
		r.check(CheckRestart, bench.Fail, err.Error())
		return err
	}
	r.check(CheckRestart, bench.Pass, fmt.Sprintf("node %s up again %.1f s after its restart", r.victim, time.Since(restartAt).Seconds()))

	// Resync/rebuild with a progress bar over the arrays being repaired.
	recs := map[string]*bench.RebuildRecord{}
	for _, a := range repairing {
		recs[a] = &bench.RebuildRecord{Array: a, Bytes: memberBytes[a]}
	}
	var bar *progressbar.ProgressBar
	if r.o.Progress {
		bar = progressbar.NewOptions(100, progressbar.OptionSetWriter(r.o.Out), progressbar.OptionSetDescription("resync/rebuild"),
			progressbar.OptionSetWidth(30), progressbar.OptionShowElapsedTimeOnFinish(), progressbar.OptionSetPredictTime(false))
	}
	repaired := func(st api.Status) (bool, string) {
		total, pending := 0, []string{}
		now := time.Now()
		for _, a := range st.Arrays {
			rec := recs[a.Name]
			if rec == nil {
				continue
			}
			pct := 100
			for _, m := range a.Members {
				if m.Node != r.victim {
					continue
				}
				switch m.State {
				case cluster.MemberOK:
				case cluster.MemberResyncing, cluster.MemberRebuilding:
					pct = min(pct, m.Progress)
				default:
					pct = 0
				}
			}
			if a.State == cluster.StateRebuilding && rec.Start.IsZero() {
				rec.Start = now
			}
			if !rec.Start.IsZero() && rec.End.IsZero() {
				rec.AddSample(now, rec.Bytes*int64(pct)/100)
			}
			if a.State == cluster.StateOptimal && rec.End.IsZero() {
				rec.End = now
				if rec.Start.IsZero() {
					rec.Start = restartAt
				}
			}
			if a.State != cluster.StateOptimal {
				pct = min(pct, 99)
				pending = append(pending, fmt.Sprintf("%s %s %d%%", a.Name, a.State, pct))
			}
			total += pct
		}
		if bar != nil && len(recs) > 0 {
			_ = bar.Set(total / len(recs))
		}
		if len(pending) > 0 {
			return false, "still repairing: " + strings.Join(pending, ", ")
		}
		return true, ""
	}
	_, rerr := r.waitFor(r.t.resync, repaired)
	if bar != nil {
		if rerr == nil {
			_ = bar.Finish()
		}
		fmt.Fprintln(r.o.Out)
	}
	r.refineRebuilds(recs, restartAt)
	for _, a := range repairing {
		r.res.Rebuilds = append(r.res.Rebuilds, *recs[a])
	}
	if rerr != nil {
		r.check(CheckResync, bench.Fail, rerr.Error())
		return rerr
	}
	var longest time.Duration
	for _, rec := range recs {
		longest = max(longest, rec.Duration())
	}
	r.check(CheckResync, bench.Pass, fmt.Sprintf("arrays %s optimal again %.1f s after the restart (longest repair %.1f s)", strings.Join(repairing, ","), time.Since(restartAt).Seconds(), longest.Seconds()))

	// Failback: the arrays the node owned go home.
	home := map[string]string{}
	for _, a := range r.cfg.Arrays {
		home[a.Name] = a.Home
	}
	t0 := time.Now()
	back, ferr := r.waitFor(r.t.failover, func(st api.Status) (bool, string) {
		for _, a := range st.Arrays {
			if home[a.Name] == r.victim && (a.Owner != r.victim || a.Phase != "active") {
				return false, fmt.Sprintf("array %s is %s/%s on %q, home %s", a.Name, a.State, a.Phase, a.Owner, r.victim)
			}
		}
		return true, ""
	})
	if ferr != nil {
		r.check(CheckFailback, bench.Fail, fmt.Sprintf("after %s: %v (policies.failback is %q)", r.t.failover, ferr, r.cfg.Policies.Failback))
		return nil
	}
	var homed []string
	for _, a := range back.Arrays {
		if home[a.Name] == r.victim {
			homed = append(homed, fmt.Sprintf("array %s on %s (epoch %d)", a.Name, a.Owner, a.Epoch))
		}
	}
	r.check(CheckFailback, bench.Pass, fmt.Sprintf("%s, %.1f s after redundancy was back", strings.Join(homed, ", "), time.Since(t0).Seconds()))
	return nil
}

// refineRebuilds takes start and end times from the event log where it
// has them ("X -> rebuilding", "rebuilding -> optimal" after the restart).
func (r *runner) refineRebuilds(recs map[string]*bench.RebuildRecord, since time.Time) {
	for _, n := range r.cfg.Nodes {
		if r.down[n.Name] {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		evs, err := r.clients[n.Name].Events(ctx, 0, 0)
		cancel()
		if err != nil {
			continue
		}
		for _, e := range evs {
			rec := recs[e.Array]
			if rec == nil || e.Kind != "state" || e.Time.Before(since) {
				continue
			}
			if strings.HasSuffix(e.Message, "-> rebuilding") && (rec.Start.IsZero() || e.Time.Before(rec.Start)) {
				rec.Start = e.Time
			}
			if strings.HasPrefix(e.Message, "rebuilding -> optimal") {
				rec.End = e.Time
			}
		}
		break
	}
	for _, rec := range recs {
		// Samples outside [Start, End] would draw before the start.
		var keep []bench.RebuildSample
		for _, s := range rec.Samples {
			if !s.At.Before(rec.Start) && (rec.End.IsZero() || !s.At.After(rec.End)) {
				keep = append(keep, s)
			}
		}
		rec.Samples = keep
	}
}

// redundancy checks that every array is optimal on its home with every
// member in sync.
func (r *runner) redundancy() {
	st, err := r.waitFor(r.t.failover, func(st api.Status) (bool, string) {
		ok, why := r.healthy(st)
		if !ok {
			return false, why
		}
		for _, a := range st.Arrays {
			for _, m := range a.Members {
				if m.State != cluster.MemberOK {
					return false, fmt.Sprintf("array %s member %s is %s", a.Name, m.Drive, m.State)
				}
			}
		}
		return true, ""
	})
	if err != nil {
		r.check(CheckRedundancy, bench.Fail, err.Error())
		return
	}
	r.check(CheckRedundancy, bench.Pass, fmt.Sprintf("all %d arrays optimal on their home nodes, every member ok", len(st.Arrays)))
}

// finalVerify reads every block of every array and checks it.
func (r *runner) finalVerify() {
	t0 := time.Now()
	res, err := bench.Run(r.ctx, bench.Config{Pattern: bench.SeqRead, IOSize: 1 << 20, QueueDepth: r.t.fillQD, Passes: 1, Verify: true, MinGeneration: 1}, r.frontTargets())
	switch {
	case err != nil:
		r.check(CheckFinalVerify, bench.Fail, err.Error())
	case res.Errors > 0:
		r.check(CheckFinalVerify, bench.Fail, fmt.Sprintf("%d read errors (first: %s)", res.Errors, res.FirstError.Message))
	case res.VerifyErr() != nil:
		r.check(CheckFinalVerify, bench.Fail, res.VerifyErr().Error())
	default:
		r.check(CheckFinalVerify, bench.Pass, fmt.Sprintf("%d blocks (%s) on %d arrays verify, in %.1f s", res.Verify.Checked, units.FormatBytes(res.Bytes), len(res.Targets), time.Since(t0).Seconds()))
	}
}

// gds runs the GPUDirect Storage validator on the site's gds.mount, a
// file system on a tier0 volume (never the work directory); on a host
// without GDS it is a not-run with the validator's reason. The evidence
// names the libraries loaded, and a verdict from stand-ins is not a pass.
func (r *runner) gds() {
	slot := &bench.GDSSlot{}
	r.res.GDS = slot
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	m, problem := gdsMountProblem(string(mi), r.cfg.GDS.Mount, r.cfg.File)
	if m.Dir != "" {
		slot.Mount = &m
	}
	if problem != "" {
		slot.Status, slot.Reason = bench.NotRun, problem
		r.check(CheckGDS, slot.Status, slot.Reason)
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Minute)
	defer cancel()
	v, err := gds.Validate(ctx, gds.Options{Dir: m.Dir, Size: 256 << 20, Threads: 4, SkipCPUOnly: r.o.Short, BaseConfig: r.cfg.GDS.CuFileJSON, Logger: r.log})
	slot.Libraries, slot.StandIn = gdsLibraries()
	switch {
	case err != nil:
		slot.Status, slot.Reason = bench.Fail, err.Error()
	case !v.Available:
		slot.Status, slot.Reason = bench.NotRun, fmt.Sprintf("GDS not available (%s): %s", v.Cause, v.Reason)
	case v.Proven && slot.StandIn != "":
		slot.Status, slot.Reason = bench.Fail, "the GDS proof ran on stand-ins, "+slot.StandIn
	case v.Proven:
		slot.Status = bench.Pass
	default:
		slot.Status, slot.Reason = bench.Fail, "GDS proof failed: "+v.Reason
	}
	if err == nil {
		_ = slot.SetVerdict(v)
	}
	reason := slot.Reason
	if slot.Status == bench.Pass {
		var libs []string
		for _, l := range slot.Libraries {
			libs = append(libs, fmt.Sprintf("%s %s (%s)", l.Name, l.Version, l.Path))
		}
		reason = fmt.Sprintf("%s on %s: %d reads on the nvidia-fs path, %d POSIX fallbacks, %.2f GiB/s GPU_DIRECT; loaded %s", m.Dir, m.Source, v.NvfsOps, v.PosixFallbacks, v.GPUDirectGiBs, strings.Join(libs, ", "))
	}
	r.check(CheckGDS, slot.Status, reason)
}
