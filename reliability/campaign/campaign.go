package campaign

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/reliability/checker"
)

var httpClient = http.Client{Timeout: 3 * time.Second}

// Fault kinds.
const (
	KillOwner      = "kill-owner"      // kill -9 an array's owner mid-write, restart it
	KillRandom     = "kill-random"     // kill -9 a random node, restart it
	KillTwo        = "kill-two"        // kill -9 two nodes at once (RAID-6 only), restart both
	FreezeOwner    = "freeze-owner"    // SIGSTOP an owner past its lease, SIGCONT
	RestartResync  = "restart-resync"  // kill -9 an owner while it resyncs a returned member
	KillEtcdPeer   = "kill-etcd-peer"  // kill -9 an embedded etcd peer that is not the coordinator
	FailDrive      = "fail-drive"      // fail a member drive through the API, then replace it
	PartitionOwner = "partition-owner" // cut an owner's network link (Options.Netns only), heal it
	// The deterministic schedules of issue 12 (freeze.go).
	FreezeEtcdVoter        = "freeze-etcd-voter"         // SIGSTOP an etcd voter (the coordinator's node every other time) past the TTL, SIGCONT
	FreezeQueuedRepair     = "freeze-with-queued-repair" // kill a member node, freeze the owner, restart the member, thaw the ex-owner (RAID-6 only)
	DropFrontendSlowMember = "drop-frontend-slow-member" // reset the host's connections to an owner while a member node is slow
)

// AllFaults lists the kinds a full campaign runs, in order.
var AllFaults = []string{KillOwner, FreezeOwner, KillRandom, RestartResync, KillEtcdPeer, FailDrive, KillTwo,
	FreezeEtcdVoter, FreezeEtcdVoter, DropFrontendSlowMember, FreezeQueuedRepair}

// hotUnits is the size of the extra, constantly rewritten region per array
// when drop-frontend-slow-member runs.
const hotUnits = 8

// needsParity2 are the faults only a site whose every array is RAID-6
// survives (two nodes out at once).
var needsParity2 = []string{KillTwo, FreezeQueuedRepair}

// Options configure a campaign.
type Options struct {
	// Site is the site file; Binary the tier0d executable; Workdir a
	// directory for the cluster (drives, state, logs).
	Site, Binary, Workdir string
	// PortShift moves every port of the site (0: as written).
	PortShift int
	// Faults to inject in order. Empty: AllFaults, skipping those the
	// site cannot survive (kill-two without RAID-6).
	Faults []string
	// Netns runs the nodes in network namespaces (root only; see
	// SetupNetns) and enables the partition-owner fault. The campaign
	// itself must run in Netns.Hub.
	Netns *Netns
	// Short, with Faults empty, runs two faults: kill-owner and
	// freeze-owner, or kill-two and freeze-owner on an all-RAID-6 site
	// (partition-owner instead of freeze-owner with Netns).
	Short bool
	// Duration, when set, repeats random faults from Faults until it
	// has passed (the soak form); the last fault always recovers.
	Duration time.Duration
	// Seed chooses victims and the workload's units.
	Seed uint64
	// RecoverBound is how long arrays may take to be back active and
	// optimal after a fault is healed (default 90 s).
	RecoverBound time.Duration
	// RecoveryPace slows the workload while the cluster recovers (each
	// writer waits this long between I/Os; 0: full speed). Resync and
	// rebuild yield to foreground I/O, so a full-speed workload stretches
	// recovery several times over.
	RecoveryPace time.Duration
	// Units checked per array (default 1024: 4 MiB).
	Units int
	// Workers per array (default 2).
	Workers int
	// Out receives one line per step (default: discard).
	Out io.Writer
	// Logger receives details (default: discard).
	Logger *slog.Logger
}

// Injection is one fault injected and what followed.
type Injection struct {
	Fault  string `json:"fault"`
	Detail string `json:"detail"`
	// At is when it was injected, from the start of the workload.
	At time.Duration `json:"at_ns"`
	// InFlight writes when the fault hit; AckedBefore writes acknowledged
	// before it.
	InFlight    int64 `json:"in_flight"`
	AckedBefore int64 `json:"acked_before"`
	// Failover is how long the first affected array took to be served
	// again (0 when not measured).
	Failover time.Duration `json:"failover_ns,omitempty"`
	// Recovered is how long after healing every array was back active
	// and optimal.
	Recovered time.Duration `json:"recovered_ns"`
	// Stuck lists arrays not recovered within the bound.
	Stuck []string `json:"stuck,omitempty"`
	Err   string   `json:"error,omitempty"`
}

// Result is a campaign's outcome.
type Result struct {
	Site       string           `json:"site"`
	Seed       uint64           `json:"seed"`
	Arrays     int              `json:"arrays"`
	Injections []Injection      `json:"injections"`
	Progress   checker.Progress `json:"progress"`
	// Final is the verification of every unit; Online the read-backs
	// during the workload.
	Final  checker.Report `json:"final"`
	Online checker.Report `json:"online"`
	// VerifyErr is set when the final verification did not finish.
	VerifyErr string `json:"verify_error,omitempty"`
	// Stuck arrays at the end (must be empty).
	Stuck   []string      `json:"stuck,omitempty"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// ArraysStuck is the largest number of arrays found unhealthy past the
// bound, after any fault or at the end.
func (r Result) ArraysStuck() int {
	n := len(r.Stuck)
	for _, in := range r.Injections {
		n = max(n, len(in.Stuck))
	}
	return n
}

// Err is nil when nothing was lost, stale, corrupt or unreadable, no
// array got stuck and every fault could be injected; otherwise it wraps
// ErrFailed.
func (r Result) Err() error {
	var probs []string
	if err := r.Final.Err(); err != nil {
		probs = append(probs, "final verification: "+err.Error())
	}
	if err := r.Online.Err(); err != nil {
		probs = append(probs, "read-backs during the workload: "+err.Error())
	}
	if r.VerifyErr != "" {
		probs = append(probs, "verification did not finish: "+r.VerifyErr)
	}
	if n := r.ArraysStuck(); n > 0 {
		probs = append(probs, fmt.Sprintf("%d arrays stuck", n))
	}
	for _, in := range r.Injections {
		if in.Err != "" {
			probs = append(probs, in.Fault+": "+in.Err)
		}
	}
	if len(probs) == 0 {
		return nil
	}
	return fmt.Errorf("campaign on %s (seed %d): %s: %w", r.Site, r.Seed, strings.Join(probs, "; "), ErrFailed)
}

// ErrFailed: the campaign found a violation (see Result.Err).
var ErrFailed = errors.New("reliability campaign failed")

// Summary is the human-readable report.
func (r Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "campaign on %s, seed %d, %d arrays, %v\n", r.Site, r.Seed, r.Arrays, r.Elapsed.Round(time.Second))
	for _, in := range r.Injections {
		fo := ""
		if in.Failover > 0 {
			fo = fmt.Sprintf(", served again after %.1fs", in.Failover.Seconds())
		}
		st := fmt.Sprintf("recovered in %.1fs", in.Recovered.Seconds())
		if len(in.Stuck) > 0 {
			st = "STUCK " + strings.Join(in.Stuck, " ")
		}
		if in.Err != "" {
			st += " ERROR " + in.Err
		}
		fmt.Fprintf(&b, "  +%5.1fs %-15s %s (%d writes in flight)%s; %s\n", in.At.Seconds(), in.Fault, in.Detail, in.InFlight, fo, st)
	}
	p := r.Progress
	fmt.Fprintf(&b, "writes: %d issued, %d acknowledged, %d failed (outcome unknown); read-backs %d (%d errors)\n", p.Issued, p.Acked, p.Failed, p.Reads, p.ReadErrors)
	f := r.Final
	fmt.Fprintf(&b, "verified %d of %d units (%d held an in-flight write); lost %d, stale %d, corrupt %d, unreadable %d; online read-backs: stale %d, lost %d, corrupt %d\n",
		f.Verified, f.Checked, f.InFlightLanded, f.Lost, f.Stale, f.Corrupt, f.Unreadable, r.Online.Stale, r.Online.Lost, r.Online.Corrupt)
	fmt.Fprintf(&b, "arrays stuck: %d\n", r.ArraysStuck())
	for _, p := range append(slices.Clone(f.Problems), r.Online.Problems...) {
		fmt.Fprintf(&b, "  problem: %s\n", p)
	}
	if err := r.Err(); err != nil {
		fmt.Fprintf(&b, "FAILED: %v\n", err)
	} else {
		b.WriteString("PASSED\n")
	}
	return b.String()
}

// env is a running campaign.
type env struct {
	o     Options
	c     *Cluster
	chk   *checker.Checker
	rng   *rand.Rand
	start time.Time
	log   *slog.Logger
	out   io.Writer
	mu    sync.Mutex
	// voterFreezes counts freeze-etcd-voter faults (they alternate
	// between the coordinator's node and another voter).
	voterFreezes int
}

func (e *env) say(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.out, "[%6.1fs] %s\n", time.Since(e.start).Seconds(), fmt.Sprintf(format, args...))
}

// Run runs one campaign. The error is for a campaign that could not run
// (the cluster did not start); violations are in the Result (Result.Err).
func Run(ctx context.Context, o Options) (Result, error) {
	if o.RecoverBound <= 0 {
		o.RecoverBound = 90 * time.Second
	}
	if o.Units <= 0 {
		o.Units = 1024
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	res := Result{Site: o.Site, Seed: o.Seed}
	for _, f := range o.Faults {
		if !slices.Contains(AllFaults, f) && f != PartitionOwner {
			return res, fmt.Errorf("fault %q unknown; expected one of %s", f, strings.Join(AllFaults, ", "))
		}
	}
	e := &env{o: o, rng: rand.New(rand.NewPCG(o.Seed, 0x7469657230)), start: time.Now(), log: o.Logger, out: o.Out}
	c, err := StartLocal(ctx, LocalOptions{Site: o.Site, Binary: o.Binary, Workdir: o.Workdir, PortShift: o.PortShift, Netns: o.Netns, Logger: o.Logger,
		CoordinatorOnVoter: slices.Contains(o.Faults, FreezeEtcdVoter)})
	if err != nil {
		return res, err
	}
	defer c.Close()
	e.c = c
	res.Arrays = len(c.Config.Arrays)
	faults := o.Faults
	if len(faults) == 0 && o.Short {
		faults = []string{KillOwner, FreezeOwner}
		if e.allParity(2) {
			faults = []string{KillTwo, FreezeOwner}
		}
		if o.Netns != nil {
			faults[1] = PartitionOwner
		}
	}
	if len(faults) == 0 {
		for _, f := range AllFaults {
			if slices.Contains(needsParity2, f) && !e.allParity(2) {
				continue
			}
			faults = append(faults, f)
		}
		if o.Netns != nil {
			faults = append(faults, PartitionOwner)
		}
	}
	for _, f := range faults {
		if f == PartitionOwner {
			if o.Netns == nil {
				return res, fmt.Errorf("fault %s needs network namespaces (root; see docs/RELIABILITY.md)", f)
			}
			continue
		}
		if !slices.Contains(AllFaults, f) {
			return res, fmt.Errorf("fault %q unknown; expected one of %s", f, strings.Join(AllFaults, ", "))
		}
		if slices.Contains(needsParity2, f) && !e.allParity(2) {
			return res, fmt.Errorf("fault %s needs every array to be RAID-6 (two nodes out at once); site %s has a RAID-5 array", f, o.Site)
		}
	}
	if slices.Contains(faults, DropFrontendSlowMember) {
		if err := c.UseFrontendProxies(); err != nil {
			return res, err
		}
	}
	e.say("cluster of %d nodes starting from %s (work directory %s)", len(c.Config.Nodes), o.Site, c.Workdir)
	d, bad, err := c.WaitHealthy(ctx, 2*time.Minute)
	if err != nil {
		return res, fmt.Errorf("cluster did not become healthy (%v; node logs in %s): %w", bad, c.Workdir, err)
	}
	e.say("all %d arrays active and optimal after %.1fs", len(c.Config.Arrays), d.Seconds())

	var targets []checker.Target
	for _, a := range c.Config.Arrays {
		mp, err := c.OpenArray(a.Name, 30*time.Second, o.Logger.With("array", a.Name))
		if err != nil {
			return res, fmt.Errorf("connect to array %s: %w", a.Name, err)
		}
		defer mp.Close()
		units := min(o.Units, int(mp.Size()/checker.UnitSize))
		targets = append(targets, checker.Target{Name: a.Name, Dev: mp, Units: units})
		if slices.Contains(faults, DropFrontendSlowMember) && int64(units+hotUnits) <= mp.Size()/checker.UnitSize {
			// A few units rewritten all the time: a command of a dead
			// connection that lands after a newer acknowledged write to
			// its unit shows up there as stale.
			targets = append(targets, checker.Target{Name: a.Name + "-hot", Dev: mp, Offset: int64(units) * checker.UnitSize, Units: hotUnits})
		}
	}
	// A partition must catch read-backs in flight (a cut-off owner that
	// still answered reads would serve stale data): more of them then.
	readPct := 20
	if slices.Contains(faults, PartitionOwner) {
		readPct = 50
	}
	chk, err := checker.New(targets, checker.Options{Workers: o.Workers, MaxRun: 8, ReadPercent: readPct, Seed: o.Seed, ErrorBackoff: 50 * time.Millisecond, Logger: o.Logger})
	if err != nil {
		return res, err
	}
	e.chk = chk
	wctx, stopWork := context.WithCancel(ctx)
	workDone := make(chan struct{})
	go func() { _ = chk.Run(wctx); close(workDone) }()
	e.start = time.Now()
	e.say("workload running: %d arrays x %d units, %d writers each, %d%% read-backs", len(targets), o.Units, o.Workers, readPct)
	e.settle(ctx, 3*time.Second, 200)

	deadline := time.Now().Add(o.Duration)
	for i := 0; ctx.Err() == nil; i++ {
		var f string
		if o.Duration > 0 {
			if i > 0 && time.Now().After(deadline) {
				break
			}
			f = faults[e.rng.IntN(len(faults))]
		} else {
			if i >= len(faults) {
				break
			}
			f = faults[i]
		}
		in := e.inject(ctx, f)
		res.Injections = append(res.Injections, in)
		if len(in.Stuck) > 0 {
			e.say("arrays stuck; stopping the campaign (node logs in %s)", c.Workdir)
			break
		}
		e.settle(ctx, 2*time.Second, 100)
	}

	stopWork()
	<-workDone
	res.Progress = chk.Progress()
	e.say("workload stopped: %d writes acknowledged, %d failed; verifying", res.Progress.Acked, res.Progress.Failed)
	if _, bad, err := c.WaitHealthy(ctx, o.RecoverBound); err != nil {
		res.Stuck = bad
	}
	var verr error
	res.Final, verr = chk.Verify(ctx, checker.VerifyOptions{ReadRetries: 3, RetryDelay: time.Second})
	if verr != nil {
		res.VerifyErr = verr.Error()
	}
	res.Final.Acked, res.Final.Failed = res.Progress.Acked, res.Progress.Failed
	res.Online = chk.Online()
	res.Elapsed = time.Since(e.start)
	e.say("verified: %v", res.Final)
	return res, nil
}

// settle lets the workload run for at least d and until n more writes were
// acknowledged (at most 4 d).
func (e *env) settle(ctx context.Context, d time.Duration, n int64) {
	start := time.Now()
	base := e.chk.Progress().Acked
	for time.Since(start) < 4*d && ctx.Err() == nil {
		if time.Since(start) >= d && e.chk.Progress().Acked-base >= n {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (e *env) allParity(p int) bool {
	for _, a := range e.c.Config.Arrays {
		if a.Parity() < p {
			return false
		}
	}
	return true
}

// mark records the moment a fault hits.
func (e *env) mark(in *Injection) {
	p := e.chk.Progress()
	in.At, in.InFlight, in.AckedBefore = time.Since(e.start), p.InFlight, p.Acked
}

func (e *env) pick(xs []string) string { return xs[e.rng.IntN(len(xs))] }

// inject performs one fault, heals it, and waits for recovery.
func (e *env) inject(ctx context.Context, f string) Injection {
	in := Injection{Fault: f}
	var err error
	switch f {
	case KillOwner:
		err = e.killOwner(ctx, &in)
	case KillRandom:
		err = e.killNodes(ctx, &in, 1, nil)
	case KillTwo:
		err = e.killNodes(ctx, &in, 2, nil)
	case KillEtcdPeer:
		coord := e.c.Coordinator(ctx)
		var peers []string
		for _, p := range e.c.etcdPeers() {
			if p != coord {
				peers = append(peers, p)
			}
		}
		err = e.killNodes(ctx, &in, 1, peers)
	case FreezeOwner:
		err = e.freezeOwner(ctx, &in)
	case PartitionOwner:
		err = e.partitionOwner(ctx, &in)
	case RestartResync:
		err = e.restartResync(ctx, &in)
	case FailDrive:
		err = e.failDrive(ctx, &in)
	case FreezeEtcdVoter:
		err = e.freezeEtcdVoter(ctx, &in)
	case FreezeQueuedRepair:
		err = e.freezeQueuedRepair(ctx, &in)
	case DropFrontendSlowMember:
		err = e.dropFrontendSlowMember(ctx, &in)
	}
	if err != nil {
		in.Err = err.Error()
		e.say("%s: %v", f, err)
	}
	// Whatever happened, every node runs again before recovery is judged.
	for _, n := range e.c.Nodes() {
		if !e.c.Running(n) {
			if err := e.c.Start(n); err != nil && in.Err == "" {
				in.Err = err.Error()
			}
		}
	}
	e.chk.SetPace(e.o.RecoveryPace)
	defer e.chk.SetPace(0)
	d, bad, werr := e.c.waitHealthy(ctx, e.o.RecoverBound, func(at time.Duration, bad []string) {
		e.say("%s: +%.1fs %s", f, at.Seconds(), strings.Join(bad, " "))
	})
	in.Recovered = d
	if werr != nil {
		in.Stuck = bad
		e.say("%s: %v", f, werr)
	} else {
		e.say("%s healed: every array active and optimal %.1fs later", f, d.Seconds())
	}
	return in
}

func (e *env) arrays(ctx context.Context) ([]string, map[string]string, error) {
	as, err := e.c.Arrays(ctx)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	for _, a := range as {
		names = append(names, a.Name)
	}
	return names, Owners(as), nil
}

// waitServed waits until array is active under a node not among not.
func (e *env) waitServed(ctx context.Context, array string, not ...string) (time.Duration, string, error) {
	start := time.Now()
	a, err := e.c.WaitArray(ctx, array, e.o.RecoverBound, func(a apiArray) bool {
		return a.Phase == "active" && a.Owner != "" && !slices.Contains(not, a.Owner)
	})
	return time.Since(start), a.Owner, err
}

func (e *env) killOwner(ctx context.Context, in *Injection) error {
	names, owners, err := e.arrays(ctx)
	if err != nil {
		return err
	}
	array := e.pick(names)
	victim := owners[array]
	e.mark(in)
	if err := e.c.Kill(victim); err != nil {
		return err
	}
	e.say("%s: kill -9 %s, owner of array %s, with %d writes in flight", KillOwner, victim, array, in.InFlight)
	d, to, err := e.waitServed(ctx, array, victim)
	in.Failover = d
	in.Detail = fmt.Sprintf("kill -9 %s (owner of %s); %s took over", victim, array, to)
	if err != nil {
		return fmt.Errorf("array %s not taken over after its owner %s died: %w", array, victim, err)
	}
	e.say("%s: array %s served by %s %.1fs after the kill", KillOwner, array, to, d.Seconds())
	e.settle(ctx, 2*time.Second, 100)
	return e.c.Start(victim)
}

// killNodes kills n distinct nodes (from among, or any) at once, lets the
// workload run degraded, and restarts them.
func (e *env) killNodes(ctx context.Context, in *Injection, n int, among []string) error {
	if len(among) == 0 {
		among = e.c.Nodes()
	}
	if len(among) < n {
		return fmt.Errorf("need %d nodes to kill, have %v", n, among)
	}
	victims := slices.Clone(among)
	e.rng.Shuffle(len(victims), func(i, j int) { victims[i], victims[j] = victims[j], victims[i] })
	victims = victims[:n]
	slices.Sort(victims)
	_, owners, err := e.arrays(ctx)
	if err != nil {
		return err
	}
	e.mark(in)
	for _, v := range victims {
		if err := e.c.Kill(v); err != nil {
			return err
		}
	}
	var owned []string
	for a, o := range owners {
		if slices.Contains(victims, o) {
			owned = append(owned, a)
		}
	}
	slices.Sort(owned)
	in.Detail = fmt.Sprintf("kill -9 %s (owners of %v)", strings.Join(victims, "+"), owned)
	e.say("%s: kill -9 %s, owners of %v, with %d writes in flight", in.Fault, strings.Join(victims, " and "), owned, in.InFlight)
	for i, a := range owned {
		d, to, err := e.waitServed(ctx, a, victims...)
		if i == 0 {
			in.Failover = d
		}
		if err != nil {
			return fmt.Errorf("array %s not taken over after %s died: %w", a, strings.Join(victims, "+"), err)
		}
		e.say("%s: array %s served by %s", in.Fault, a, to)
	}
	e.settle(ctx, 2*time.Second, 100)
	for _, v := range victims {
		if err := e.c.Start(v); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) freezeOwner(ctx context.Context, in *Injection) error {
	names, owners, err := e.arrays(ctx)
	if err != nil {
		return err
	}
	array := e.pick(names)
	victim := owners[array]
	e.mark(in)
	if err := e.c.Freeze(victim); err != nil {
		return err
	}
	e.say("%s: SIGSTOP %s, owner of array %s, with %d writes in flight", FreezeOwner, victim, array, in.InFlight)
	d, to, err := e.waitServed(ctx, array, victim)
	in.Failover = d
	if err != nil {
		_ = e.c.Thaw(victim)
		return fmt.Errorf("array %s not taken over while its owner %s was frozen: %w", array, victim, err)
	}
	e.say("%s: array %s served by %s %.1fs after the freeze; writes go on there", FreezeOwner, array, to, d.Seconds())
	// New owner acknowledges newer generations of the units the frozen
	// owner may still hold writes for.
	e.settle(ctx, 2*time.Second, 200)
	froze := time.Since(e.start) - in.At
	logAt := e.c.LogSize(victim)
	if err := e.c.Thaw(victim); err != nil {
		return err
	}
	e.say("%s: SIGCONT %s after %.1fs frozen: its late writes must be refused", FreezeOwner, victim, froze.Seconds())
	// Give it a moment to wake up, then read what it did: self-fence on
	// the lost lease, and backend I/O refused by the new reservations.
	time.Sleep(2 * time.Second)
	refused := e.c.CountLog(victim, logAt, "reservation conflict")
	selfFenced := e.c.CountLog(victim, logAt, selfFenceMark) > 0
	in.Detail = fmt.Sprintf("SIGSTOP %s (owner of %s) for %.1fs; %s took over; SIGCONT: self-fenced %v, %d late backend I/Os refused by reservation conflict",
		victim, array, froze.Seconds(), to, selfFenced, refused)
	e.say("%s: %s self-fenced %v after SIGCONT; %d late backend I/Os refused by reservation conflict", FreezeOwner, victim, selfFenced, refused)
	return nil
}

// partitionOwner cuts the network link of an array's owner: the node keeps
// running but reaches neither etcd nor its members nor hosts. Once another
// node serves the array and has acknowledged writes, the link is healed.
func (e *env) partitionOwner(ctx context.Context, in *Injection) error {
	names, owners, err := e.arrays(ctx)
	if err != nil {
		return err
	}
	array := e.pick(names)
	victim := owners[array]
	logAt := e.c.LogSize(victim)
	readsAtCut := e.chk.Progress().Reads
	e.mark(in)
	if err := e.o.Netns.Cut(victim); err != nil {
		return err
	}
	e.say("%s: cut %s's link, owner of array %s, with %d writes in flight", PartitionOwner, victim, array, in.InFlight)
	d, to, err := e.waitServed(ctx, array, victim)
	in.Failover = d
	if err != nil {
		_ = e.o.Netns.Heal(victim)
		return fmt.Errorf("array %s not taken over while its owner %s was cut off: %w", array, victim, err)
	}
	e.say("%s: array %s served by %s %.1fs after the cut", PartitionOwner, array, to, d.Seconds())
	e.settle(ctx, 2*time.Second, 200)
	cut := time.Since(e.start) - in.At
	if err := e.o.Netns.Heal(victim); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	selfFenced := e.c.CountLog(victim, logAt, selfFenceMark) > 0
	refused := e.c.CountLog(victim, logAt, "reservation conflict")
	reads := e.chk.Progress().Reads - readsAtCut
	in.Detail = fmt.Sprintf("cut %s (owner of %s) off the network for %.1fs; %s took over; %d read-backs checked meanwhile (a stale one is a violation); healed: %s self-fenced %v, %d late backend I/Os refused by reservation conflict",
		victim, array, cut.Seconds(), to, reads, victim, selfFenced, refused)
	e.say("%s: healed; %s self-fenced %v, %d late backend I/Os refused by reservation conflict", PartitionOwner, victim, selfFenced, refused)
	return nil
}

// restartResync kills a node, restarts it, and while the owners resync
// its members kills it again (a daemon restart during resync), then
// restarts it for good. With parity 2 everywhere (RAID-6) it kills the
// owner performing one of those resyncs instead: a second node lost while
// the first one's members are still out of date, which RAID-6 survives and
// RAID-5 does not.
func (e *env) restartResync(ctx context.Context, in *Injection) error {
	_, owners, err := e.arrays(ctx)
	if err != nil {
		return err
	}
	first := e.pick(e.c.Nodes())
	e.mark(in)
	if err := e.c.Kill(first); err != nil {
		return err
	}
	e.say("%s: kill -9 %s with %d writes in flight", RestartResync, first, in.InFlight)
	for a, o := range owners {
		if o == first {
			d, _, err := e.waitServed(ctx, a, first)
			if err != nil {
				return err
			}
			if in.Failover == 0 {
				in.Failover = d
			}
		}
	}
	// Degraded writes dirty the bitmap, so the members will need a resync.
	e.settle(ctx, 2*time.Second, 300)
	if err := e.c.Start(first); err != nil {
		return err
	}
	// Catch an owner resyncing a member on the returned node.
	victim, array := "", ""
	deadline := time.Now().Add(30 * time.Second)
	for victim == "" && time.Now().Before(deadline) && ctx.Err() == nil {
		if as, err := e.c.Arrays(ctx); err == nil {
			for _, a := range as {
				for _, m := range a.Members {
					if m.Node == first && (m.State == "resyncing" || m.State == "rebuilding") && a.Owner != "" && a.Owner != first {
						victim, array = a.Owner, a.Name
					}
				}
			}
		}
		if victim == "" {
			time.Sleep(50 * time.Millisecond)
		}
	}
	switch {
	case victim == "":
		victim = first
		in.Detail = fmt.Sprintf("kill -9 %s, restart; no resync seen in progress: kill -9 %s again right after its restart", first, first)
	case e.allParity(2):
		in.Detail = fmt.Sprintf("kill -9 %s, restart; kill -9 %s while it resynced array %s's member on %s", first, victim, array, first)
	default:
		in.Detail = fmt.Sprintf("kill -9 %s, restart; kill -9 %s again while array %s's owner %s resynced its member", first, first, array, victim)
		victim = first
	}
	p := e.chk.Progress()
	if err := e.c.Kill(victim); err != nil {
		return err
	}
	e.say("%s: %s (%d writes in flight)", RestartResync, in.Detail, p.InFlight)
	e.settle(ctx, 2*time.Second, 50)
	return e.c.Start(victim)
}

// failDrive fails a random array member through the API, lets the array
// run degraded, then replaces the drive (a full rebuild onto it).
func (e *env) failDrive(ctx context.Context, in *Injection) error {
	as, err := e.c.Arrays(ctx)
	if err != nil {
		return err
	}
	a := as[e.rng.IntN(len(as))]
	m := a.Members[e.rng.IntN(len(a.Members))]
	cl := e.c.client(a.Owner)
	e.mark(in)
	if err := cl.FailDrive(ctx, m.Drive); err != nil {
		return fmt.Errorf("fail drive %s through node %s's API: %w", m.Drive, a.Owner, err)
	}
	e.say("%s: drive %s (member of array %s on node %s) failed, %d writes in flight", FailDrive, m.Drive, a.Name, m.Node, in.InFlight)
	if _, err := e.c.WaitArray(ctx, a.Name, 30*time.Second, func(x apiArray) bool { return x.State != "optimal" }); err != nil {
		return fmt.Errorf("array %s did not go degraded after drive %s failed: %w", a.Name, m.Drive, err)
	}
	e.settle(ctx, 2*time.Second, 100)
	if err := cl.ReplaceDrive(ctx, m.Drive); err != nil {
		return fmt.Errorf("replace drive %s: %w", m.Drive, err)
	}
	in.Detail = fmt.Sprintf("drive %s of array %s failed, then replaced (full rebuild)", m.Drive, a.Name)
	e.say("%s: drive %s replaced; rebuilding", FailDrive, m.Drive)
	return nil
}

// Ensure the multipath device satisfies what the checker expects.
var _ blockdev.FUAWriter = (*host.Multipath)(nil)
