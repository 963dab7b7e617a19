package nemesis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/internal/localcluster"
	"tier0/reliability/campaign"
	"tier0/reliability/checker"
	"tier0/reliability/history"
)

// The test-only hooks of tier0d (daemon/node/drives.go): PowerCutEnv=1
// opens its drives through blockdev.PowerCut (every kill -9 is a power
// loss), DiskCtlEnv names a directory whose file <drive> injects delays
// or errors into that drive.
const (
	PowerCutEnv = "TIER0_NEMESIS_POWERCUT"
	DiskCtlEnv  = "TIER0_NEMESIS_DISKCTL"
)

// Options configure a nemesis campaign.
type Options struct {
	// Site is the site file; Binary the tier0d executable; Workdir an
	// empty or missing directory for the cluster and the rewritten site.
	Site, Binary, Workdir string
	// PortShift moves every port of the site.
	PortShift int
	// Kinds of faults to draw from (default AllKinds).
	Kinds []string
	// Seed of the first run; run r uses Seed+r.
	Seed uint64
	// Runs is the number of schedules to run (default 1); with Duration
	// set, runs go on until it has passed (at least Runs of them).
	Runs     int
	Duration time.Duration
	// Window is each schedule's fault window (default 20 s).
	Window time.Duration
	// RecoverBound is how long arrays may take to be back active and
	// optimal after the window (default 120 s).
	RecoverBound time.Duration
	// Units checked per array per run (default 512) and workers per
	// array (default 2).
	Units, Workers int
	// PastStuck goes on after a run whose arrays stayed stuck: the stuck
	// cluster's directory (node logs, drives, state) is kept as
	// Workdir/stuck-run-R and the next run starts on a fresh cluster. Off,
	// the campaign stops at the first stuck run (a soak for a table of
	// every kind wants it on; a replay wants it off).
	PastStuck bool
	// Out receives the live lines; Logger the details.
	Out    io.Writer
	Logger *slog.Logger
}

// RunResult is one schedule's outcome.
type RunResult struct {
	Run      int              `json:"run"`
	Seed     uint64           `json:"seed"`
	Schedule Schedule         `json:"schedule"`
	Injected map[string]int   `json:"injected"`
	Errors   []string         `json:"fault_errors,omitempty"`
	Progress checker.Progress `json:"progress"`
	Final    checker.Report   `json:"final"`
	Online   checker.Report   `json:"online"`
	History  history.Result   `json:"history"`
	// Anomalies by kind (history kinds, plus unreadable and stuck).
	Anomalies map[string]int `json:"anomalies,omitempty"`
	Stuck     []string       `json:"stuck,omitempty"`
	Recovered time.Duration  `json:"recovered_ns"`
	Elapsed   time.Duration  `json:"elapsed_ns"`
	// Report is the history's account of the anomalies (with the fault
	// timeline and the seed); empty when clean.
	Report string `json:"report,omitempty"`
}

// Result is a whole campaign's outcome.
type Result struct {
	Site      string         `json:"site"`
	Kinds     []string       `json:"kinds"`
	Runs      []RunResult    `json:"runs"`
	Injected  map[string]int `json:"injected"`
	Ops       int            `json:"ops_checked"`
	Anomalies map[string]int `json:"anomalies,omitempty"`
	// Table counts, per fault kind and per overlapping pair of kinds
	// ("freeze+latency"), the runs that had it, their operations checked
	// and their anomalies.
	Table   map[string]*Cell `json:"table"`
	Elapsed time.Duration    `json:"elapsed_ns"`
}

// Cell is one row of Result.Table.
type Cell struct {
	Runs      int `json:"runs"`
	Ops       int `json:"ops"`
	Anomalies int `json:"anomalies"`
}

// rows are the Table rows a run counts in: each kind of its schedule, and
// each pair of kinds whose faults overlap in time.
func rows(s Schedule) []string {
	var out []string
	for i, f := range s.Faults {
		out = append(out, f.Kind)
		for _, g := range s.Faults[i+1:] {
			if g.Start < f.End() && f.Start < g.End() {
				k := []string{f.Kind, g.Kind}
				slices.Sort(k)
				out = append(out, k[0]+"+"+k[1])
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (r *Result) count(rr RunResult) {
	n := 0
	for _, v := range rr.Anomalies {
		n += v
	}
	for _, k := range rows(rr.Schedule) {
		c := r.Table[k]
		if c == nil {
			c = &Cell{}
			r.Table[k] = c
		}
		c.Runs++
		c.Ops += rr.History.Ops
		c.Anomalies += n
	}
}

// ErrAnomaly is wrapped by Result.Err when any run found an anomaly.
var ErrAnomaly = errors.New("nemesis found anomalies")

// Err is nil when no run found an anomaly.
func (r Result) Err() error {
	if len(r.Anomalies) == 0 {
		return nil
	}
	var seeds []string
	for _, rr := range r.Runs {
		if len(rr.Anomalies) > 0 {
			seeds = append(seeds, fmt.Sprint(rr.Seed))
		}
	}
	return fmt.Errorf("%s in runs with seeds %s (replay: --seed N --runs 1): %w", kindCounts(r.Anomalies), strings.Join(seeds, ", "), ErrAnomaly)
}

func kindCounts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// Summary is the human-readable report.
func (r Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nemesis on %s: %d runs in %v (kinds %s)\n", r.Site, len(r.Runs), r.Elapsed.Round(time.Second), strings.Join(r.Kinds, ","))
	fmt.Fprintf(&b, "faults injected: %s\n", kindCounts(r.Injected))
	fmt.Fprintf(&b, "operations checked: %d\n", r.Ops)
	fmt.Fprintf(&b, "anomalies: %s\n", kindCounts(r.Anomalies))
	if len(r.Table) > 0 {
		fmt.Fprintf(&b, "%-28s %5s %9s %9s\n", "kind / overlap", "runs", "ops", "anomalies")
		for _, k := range slices.Sorted(maps.Keys(r.Table)) {
			c := r.Table[k]
			fmt.Fprintf(&b, "%-28s %5d %9d %9d\n", k, c.Runs, c.Ops, c.Anomalies)
		}
	}
	for _, rr := range r.Runs {
		if rr.Report != "" {
			fmt.Fprintf(&b, "--- run %d, seed %d\n%s%s", rr.Run, rr.Seed, rr.Schedule, rr.Report)
		}
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
	c     *campaign.Cluster
	net   *Net
	cfg   *config.Config
	site  Site
	devs  []*host.Multipath
	names []string
	log   *slog.Logger
	http  *http.Client

	diskctl string // DiskCtlEnv's directory ("" when off)

	mu     sync.Mutex
	downs  map[string]int // process faults holding a node down
	freeze map[string]int
}

// Run starts the cluster behind proxies and runs the schedules. The error
// is for a campaign that could not run (the cluster or the proxies did not
// start, a fault could not be injected at all); anomalies are in Result.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Runs <= 0 {
		o.Runs = 1
	}
	if o.Window <= 0 {
		o.Window = 20 * time.Second
	}
	if o.RecoverBound <= 0 {
		o.RecoverBound = 120 * time.Second
	}
	if o.Units <= 0 {
		o.Units = 512
	}
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if len(o.Kinds) == 0 {
		o.Kinds = slices.Clone(AllKinds)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	res := Result{Site: o.Site, Kinds: o.Kinds, Injected: map[string]int{}, Anomalies: map[string]int{}, Table: map[string]*Cell{}}
	start := time.Now()
	e, err := setup(ctx, o)
	if err != nil {
		return res, err
	}
	defer func() {
		if e != nil {
			e.close()
		}
	}()
	fmt.Fprintf(o.Out, "nemesis: %d nodes behind proxies, %d arrays active and optimal; kinds %s\n", len(e.cfg.Nodes), len(e.names), strings.Join(o.Kinds, ","))
	for r := 0; ctx.Err() == nil; r++ {
		if r >= o.Runs && (o.Duration == 0 || time.Since(start) >= o.Duration) {
			break
		}
		rr, err := e.run(ctx, r, o.Seed+uint64(r))
		if err != nil {
			return res, fmt.Errorf("run %d (seed %d): %w", r, o.Seed+uint64(r), err)
		}
		res.Runs = append(res.Runs, rr)
		res.count(rr)
		for k, v := range rr.Injected {
			res.Injected[k] += v
		}
		for k, v := range rr.Anomalies {
			res.Anomalies[k] += v
		}
		res.Ops += rr.History.Ops
		status := "PASS"
		if len(rr.Anomalies) > 0 {
			status = "ANOMALIES " + kindCounts(rr.Anomalies)
		}
		var fs []string
		for _, f := range rr.Schedule.Faults {
			where := f.Node
			if f.Link != "" {
				where = f.Link + ":" + f.Node
			}
			fs = append(fs, f.Kind+"@"+where)
		}
		fmt.Fprintf(o.Out, "run %d seed %d: %s; %d ops checked, %d writes acked, %d failed; recovered in %.1fs; %s\n",
			r, rr.Seed, strings.Join(fs, " "), rr.History.Ops, rr.Progress.Acked, rr.Progress.Failed, rr.Recovered.Seconds(), status)
		if len(rr.Stuck) > 0 {
			if !o.PastStuck {
				fmt.Fprintf(o.Out, "arrays stuck after run %d; stopping (node logs in %s)\n", r, filepath.Join(o.Workdir, "cluster"))
				break
			}
			if e, err = e.fresh(ctx, r); err != nil {
				return res, err
			}
		}
	}
	res.Elapsed = time.Since(start)
	if len(res.Anomalies) == 0 {
		res.Anomalies = nil
	}
	return res, nil
}

func setup(ctx context.Context, o Options) (*env, error) {
	text, err := os.ReadFile(o.Site)
	if err != nil {
		return nil, fmt.Errorf("site configuration: %w", err)
	}
	s := string(text)
	if o.PortShift != 0 {
		s = localcluster.ShiftPorts(s, o.PortShift)
	}
	if s, err = RewriteSite(s); err != nil {
		return nil, fmt.Errorf("%s: %w", o.Site, err)
	}
	if err := os.MkdirAll(o.Workdir, 0o755); err != nil {
		return nil, err
	}
	site := filepath.Join(o.Workdir, "nemesis-site.yaml")
	if err := writeSite(site, s); err != nil {
		return nil, err
	}
	cfg, err := config.Load(site)
	if err != nil {
		return nil, fmt.Errorf("rewritten site %s: %w", site, err)
	}
	e := &env{o: o, cfg: cfg, log: o.Logger, http: &http.Client{Timeout: 5 * time.Second}, downs: map[string]int{}, freeze: map[string]int{}}
	e.site = Site{LeaseTTL: time.Duration(cfg.Policies.LeaseTTL), Parity: 2, Drives: map[string][]string{}}
	if e.site.LeaseTTL <= 0 {
		e.site.LeaseTTL = config.DefaultLeaseTTL
	}
	for _, n := range cfg.Nodes {
		e.site.Nodes = append(e.site.Nodes, n.Name)
	}
	for _, p := range cfg.EtcdPeers() {
		e.site.EtcdPeers = append(e.site.EtcdPeers, p.Node)
	}
	for i := range cfg.Arrays {
		a := &cfg.Arrays[i]
		e.site.Parity = min(e.site.Parity, a.Parity())
		e.names = append(e.names, a.Name)
		for _, m := range a.Members {
			if n, _, ok := cfg.Drive(m); ok {
				e.site.Drives[n.Name] = append(e.site.Drives[n.Name], m)
			}
		}
	}
	for _, ds := range e.site.Drives {
		slices.Sort(ds)
	}
	if e.net, err = StartNet(cfg); err != nil {
		return nil, err
	}
	if slices.Contains(o.Kinds, SlowDisk) || slices.Contains(o.Kinds, DiskError) {
		e.diskctl = filepath.Join(o.Workdir, "diskctl")
		if err := os.MkdirAll(e.diskctl, 0o755); err != nil {
			return nil, err
		}
	}
	restore := e.hookEnv()
	e.c, err = campaign.StartLocal(ctx, campaign.LocalOptions{Site: site, Binary: o.Binary, Workdir: filepath.Join(o.Workdir, "cluster"), Logger: o.Logger})
	if err != nil {
		restore()
		e.net.Close()
		return nil, err
	}
	restore()
	if _, bad, err := e.c.WaitHealthy(ctx, 2*time.Minute); err != nil {
		e.close()
		return nil, fmt.Errorf("cluster did not become healthy (%v; node logs in %s): %w", bad, e.c.Workdir, err)
	}
	for _, a := range e.names {
		mp, err := e.c.OpenArray(a, 30*time.Second, o.Logger.With("array", a))
		if err != nil {
			e.close()
			return nil, fmt.Errorf("connect to array %s: %w", a, err)
		}
		e.devs = append(e.devs, mp)
	}
	return e, nil
}

// fresh closes a cluster whose arrays stayed stuck after run r, keeps its
// directory as Workdir/stuck-run-R for the post-mortem, and sets up a new
// one for the next run.
func (e *env) fresh(ctx context.Context, r int) (*env, error) {
	e.close()
	cluster := filepath.Join(e.o.Workdir, "cluster")
	kept := filepath.Join(e.o.Workdir, fmt.Sprintf("stuck-run-%d", r))
	if err := os.Rename(cluster, kept); err != nil {
		return nil, fmt.Errorf("keep the stuck cluster of run %d: %w (its node logs are in %s)", r, err, cluster)
	}
	fmt.Fprintf(e.o.Out, "arrays stuck after run %d; node logs kept in %s; going on with a fresh cluster\n", r, kept)
	n, err := setup(ctx, e.o)
	if err != nil {
		return nil, fmt.Errorf("fresh cluster after the stuck run %d: %w", r, err)
	}
	return n, nil
}

func (e *env) close() {
	for _, d := range e.devs {
		d.Close()
	}
	if e.c != nil {
		e.c.Close()
	}
	if e.net != nil {
		e.net.Close()
	}
}

// run runs one schedule.
func (e *env) run(ctx context.Context, r int, seed uint64) (RunResult, error) {
	start := time.Now()
	sch := Generate(seed, e.o.Kinds, e.site, e.o.Window)
	rr := RunResult{Run: r, Seed: seed, Schedule: sch, Injected: map[string]int{}, Anomalies: map[string]int{}}
	fmt.Fprint(e.o.Out, sch.String())
	if _, bad, err := e.waitHealthy(ctx, e.o.RecoverBound); err != nil {
		return rr, fmt.Errorf("cluster not healthy before the run: %v: %w", bad, err)
	}
	// Each run checks a fresh region of every array, zeroed first.
	var targets []checker.Target
	for i, d := range e.devs {
		units := min(e.o.Units, int(d.Size()/checker.UnitSize))
		regions := int(d.Size() / checker.UnitSize / int64(units))
		off := int64(r%regions) * int64(units) * checker.UnitSize
		if err := d.WriteZeroes(off, int64(units)*checker.UnitSize); err != nil {
			return rr, fmt.Errorf("zero array %s's region at %d: %w", e.names[i], off, err)
		}
		targets = append(targets, checker.Target{Name: e.names[i], Dev: d, Offset: off, Units: units})
	}
	chk, err := checker.New(targets, checker.Options{Workers: e.o.Workers, MaxRun: 4, ReadPercent: 30, ReadAny: true, Seed: seed,
		ErrorBackoff: 50 * time.Millisecond, Logger: e.log})
	if err != nil {
		return rr, err
	}
	rec := chk.History()
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = chk.Run(wctx); close(done) }()
	sleep(ctx, 2*time.Second)

	// The faults, each in its own goroutine from its start to its end.
	t0 := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, f := range sch.Faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleep(ctx, f.Start-time.Since(t0))
			rec.Note("start %s", f)
			err := e.inject(ctx, f, t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				rr.Errors = append(rr.Errors, fmt.Sprintf("%s on %s: %v", f.Kind, f.Node, err))
				rec.Note("FAILED %s on %s: %v", f.Kind, f.Node, err)
				fmt.Fprintf(e.o.Out, "  fault %s on %s could not be injected: %v\n", f.Kind, f.Node, err)
				return
			}
			rr.Injected[f.Kind]++
			rec.Note("healed %s on %s", f.Kind, f.Node)
		}()
	}
	wg.Wait()
	// Whatever happened, every node runs and is thawed.
	for _, n := range e.site.Nodes {
		if !e.c.Running(n) {
			if err := e.c.Start(n); err != nil {
				rr.Errors = append(rr.Errors, err.Error())
			}
		}
		_ = e.c.Thaw(n)
	}
	rec.Note("every fault healed")
	// Resync and rebuild yield to foreground I/O: a slower workload
	// while the cluster recovers keeps recovery within the bound.
	chk.SetPace(20 * time.Millisecond)
	d, bad, werr := e.waitHealthy(ctx, e.o.RecoverBound)
	chk.SetPace(0)
	rr.Recovered = d
	if werr != nil {
		rr.Stuck = bad
		rr.Anomalies["stuck"] = len(bad)
		rec.Note("arrays stuck: %v", bad)
	} else {
		rec.Note("every array active and optimal")
		sleep(ctx, 2*time.Second) // reads and writes after recovery
	}
	stop()
	<-done
	rr.Progress = chk.Progress()
	rr.Final, err = chk.Verify(ctx, checker.VerifyOptions{ReadRetries: 3, RetryDelay: time.Second})
	if err != nil {
		return rr, err
	}
	rr.Online = chk.Online()
	rr.History = chk.CheckHistory(history.Options{Timeout: time.Minute})
	for k, v := range rr.History.ByKind {
		rr.Anomalies[k] += v
	}
	if rr.Final.Unreadable > 0 {
		rr.Anomalies["unreadable"] += int(rr.Final.Unreadable)
	}
	// The per-read checks must agree with the history.
	for k, v := range map[string]int64{history.Lost: rr.Final.Lost + rr.Online.Lost, history.Stale: rr.Final.Stale + rr.Online.Stale, history.Corrupt: rr.Final.Corrupt + rr.Online.Corrupt} {
		if v > 0 && rr.History.ByKind[k] == 0 {
			rr.Anomalies["checker-"+k] += int(v)
		}
	}
	if len(rr.Anomalies) > 0 {
		rep := rr.History.Report(rec.Events(), seed)
		for _, p := range append(slices.Clone(rr.Final.Problems), rr.Online.Problems...) {
			rep += "  checker: " + p + "\n"
		}
		for _, b := range rr.Stuck {
			rep += "  stuck: " + b + "\n"
		}
		if rr.History.OK() {
			// The history's report has no timeline of its own then.
			rep += "fault timeline:\n"
			for _, ev := range rec.Events() {
				rep += fmt.Sprintf("  +%.3fs %s\n", float64(ev.At)/1e9, ev.Text)
			}
			rep += fmt.Sprintf("replay: seed %d\n", seed)
		}
		rr.Report = rep
	} else {
		rr.Anomalies = nil
	}
	rr.Elapsed = time.Since(start)
	return rr, nil
}

// waitHealthy waits until every node answers and each one's view has
// every array active and optimal, twice in a row (a node just thawed may
// answer from its view before the freeze).
func (e *env) waitHealthy(ctx context.Context, bound time.Duration) (time.Duration, []string, error) {
	start := time.Now()
	good := 0
	var last []string
	for {
		ok := true
		last = nil
		for i := range e.cfg.Nodes {
			n := &e.cfg.Nodes[i]
			cl := api.NewClient("http://"+n.AdvertiseAddr(n.API), os.Getenv("TIER0_TOKEN"), e.http)
			actx, cancel := context.WithTimeout(ctx, 3*time.Second)
			as, err := cl.Arrays(actx)
			cancel()
			if err != nil {
				ok = false
				last = append(last, fmt.Sprintf("node %s: %v", n.Name, err))
				continue
			}
			if h, bad := campaign.Healthy(as); !h || len(as) != len(e.names) {
				ok = false
				last = append(last, fmt.Sprintf("node %s sees %v%s", n.Name, bad, whyStuck(as)))
				continue
			}
			if i == 0 {
				// The owners' own word too: each array's RAID engine
				// optimal, published since this wait began. A view can
				// lag its engine (a member failed or missing there that
				// the coordinator has not heard of, a resync still
				// running), and a run that starts then loses the array
				// to its next fault (nemesis seed 1515020).
				if bad := e.enginesNotOptimal(ctx, cl, as, start); len(bad) > 0 {
					ok = false
					last = append(last, fmt.Sprintf("owners report %v", bad))
				}
			}
		}
		if ok {
			if good++; good >= 2 {
				return time.Since(start), nil, nil
			}
		} else {
			good = 0
		}
		if time.Since(start) > bound {
			return time.Since(start), last, fmt.Errorf("after %v: %s: %w", bound, strings.Join(last, "; "), campaign.ErrStuck)
		}
		sleep(ctx, time.Second)
	}
}

// enginesNotOptimal names the arrays of as whose owner has not published,
// since since, its RAID engine optimal and serving at the array's epoch
// (the owner reports of the API's status, read through cl).
func (e *env) enginesNotOptimal(ctx context.Context, cl *api.Client, as []api.Array, since time.Time) []string {
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := cl.Status(actx)
	if err != nil {
		return []string{fmt.Sprintf("status: %v", err)}
	}
	var bad []string
	for _, a := range as {
		found := false
		for _, o := range st.Owners {
			if o.Array != a.Name {
				continue
			}
			found = true
			if o.Owner != a.Owner || o.Epoch != a.Epoch || o.State != "optimal" || !o.Serving || o.Time.Before(since) {
				why := o.State
				if o.Reason != "" {
					why += " (" + o.Reason + ")"
				}
				bad = append(bad, fmt.Sprintf("%s: %s on %s at epoch %d, serving %v, at %s", a.Name, why, o.Owner, o.Epoch, o.Serving, o.Time.Format("15:04:05.000")))
			}
		}
		if !found {
			bad = append(bad, a.Name+": no report from its owner")
		}
	}
	return bad
}

// whyStuck names, for each array not active and optimal, the last action
// the coordinator saw refused or failed and how often ("" when none): a
// stuck array's line then says why nothing brought it back (nemesis seed
// 2 in CI printed only "C2=stale").
func whyStuck(as []api.Array) string {
	var why []string
	for _, a := range as {
		if a.State != cluster.StateOptimal || a.Phase != "active" || a.Owner == "" {
			if a.LastError != "" {
				why = append(why, fmt.Sprintf("%s: %s (%d failures)", a.Name, a.LastError, a.Failures))
			}
			if a.Reason != "" {
				why = append(why, fmt.Sprintf("%s: %s", a.Name, a.Reason))
			}
		}
	}
	if len(why) == 0 {
		return ""
	}
	return " — " + strings.Join(why, "; ")
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// down holds node down (kill -9 if it runs); up releases the hold and
// restarts it when no other fault holds it.
func (e *env) down(node string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.downs[node]++
	if e.c.Running(node) {
		return e.c.Kill(node)
	}
	return nil
}

func (e *env) up(node string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.downs[node]--
	if e.downs[node] > 0 || e.c.Running(node) {
		return nil
	}
	defer e.hookEnv()()
	return e.c.Start(node)
}

// hookEnv sets the daemon's test hooks in this process's environment
// (which the nodes it starts inherit) and returns what undoes it. With
// power-loss among the kinds every node's drives keep unflushed writes in
// process memory, so that every kill -9 is a power loss of its drives.
func (e *env) hookEnv() func() {
	var set []string
	if slices.Contains(e.o.Kinds, PowerLoss) {
		os.Setenv(PowerCutEnv, "1")
		set = append(set, PowerCutEnv)
	}
	if e.diskctl != "" {
		os.Setenv(DiskCtlEnv, e.diskctl)
		set = append(set, DiskCtlEnv)
	}
	return func() {
		for _, k := range set {
			os.Unsetenv(k)
		}
	}
}

func (e *env) stopNode(node string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.freeze[node]++
	if e.c.Running(node) {
		return e.c.Freeze(node)
	}
	return nil
}

func (e *env) contNode(node string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.freeze[node]--
	if e.freeze[node] > 0 || !e.c.Running(node) {
		return nil
	}
	return e.c.Thaw(node)
}

// client is an API client of any running node, tried in order.
func (e *env) clients() []*api.Client {
	var out []*api.Client
	for i := range e.cfg.Nodes {
		n := &e.cfg.Nodes[i]
		if e.c.Running(n.Name) {
			out = append(out, api.NewClient("http://"+n.AdvertiseAddr(n.API), os.Getenv("TIER0_TOKEN"), e.http))
		}
	}
	return out
}

func (e *env) apiCall(ctx context.Context, what string, call func(*api.Client) error) error {
	var errs []error
	for _, cl := range e.clients() {
		if err := call(cl); err == nil {
			return nil
		} else {
			errs = append(errs, err)
		}
	}
	return fmt.Errorf("%s: no node accepted it: %w", what, errors.Join(errs...))
}

// inject performs f until its end (from t0) and heals it.
func (e *env) inject(ctx context.Context, f Fault, t0 time.Time) error {
	until := func() { sleep(ctx, f.End()-time.Since(t0)) }
	switch f.Kind {
	case Kill, PowerLoss:
		if err := e.down(f.Node); err != nil {
			return err
		}
		until()
		return e.up(f.Node)
	case RestartStorm:
		every := time.Duration(f.Param[0]) * time.Millisecond
		for time.Since(t0) < f.End() && ctx.Err() == nil {
			if err := e.down(f.Node); err != nil {
				return err
			}
			sleep(ctx, 300*time.Millisecond)
			if err := e.up(f.Node); err != nil {
				return err
			}
			sleep(ctx, min(every, f.End()-time.Since(t0)))
		}
		return nil
	case Freeze:
		if err := e.stopNode(f.Node); err != nil {
			return err
		}
		until()
		return e.contNode(f.Node)
	case Latency, Bandwidth, Stall, Reset, OneWay:
		typ, stream, attrs := "", "both", ""
		switch f.Kind {
		case Latency:
			typ, attrs = "latency", fmt.Sprintf(`{"latency":%d,"jitter":%d}`, f.Param[0], f.Param[1])
		case Bandwidth:
			typ, attrs = "bandwidth", fmt.Sprintf(`{"rate":%d}`, f.Param[0])
		case Stall:
			typ, attrs = "timeout", `{"timeout":0}`
		case Reset:
			typ, stream, attrs = "reset_peer", "downstream", `{"timeout":0}`
		case OneWay:
			typ, attrs = "timeout", `{"timeout":0}`
			stream = []string{"upstream", "downstream"}[f.Param[0]]
		}
		t, err := e.net.Add(f.Link, f.Node, typ, stream, attrs)
		if err != nil {
			return err
		}
		until()
		t.Remove()
		return nil
	case Partition:
		var ts []*Toxic
		for _, class := range e.net.linksInto(f.Node) {
			t, err := e.net.Add(class, f.Node, "timeout", "both", `{"timeout":0}`)
			if err != nil {
				for _, t := range ts {
					t.Remove()
				}
				return err
			}
			ts = append(ts, t)
		}
		until()
		for _, t := range ts {
			t.Remove()
		}
		return nil
	case Drain:
		if err := e.apiCall(ctx, "drain "+f.Node, func(c *api.Client) error { return c.Drain(ctx, f.Node) }); err != nil {
			return err
		}
		until()
		return e.apiCall(ctx, "undrain "+f.Node, func(c *api.Client) error { return c.Undrain(ctx, f.Node) })
	case SlowDisk, DiskError:
		d := e.site.Drives[f.Node][f.Param[0]]
		ctl := "error"
		if f.Kind == SlowDisk {
			ctl = fmt.Sprintf("slow %dms", f.Param[1])
		}
		path := filepath.Join(e.diskctl, d)
		if err := os.WriteFile(path, []byte(ctl), 0o644); err != nil {
			return err
		}
		until()
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			return err
		}
		return e.replaceIfFailed(ctx, d)
	case FailDrive:
		d := e.site.Drives[f.Node][f.Param[0]]
		if err := e.apiCall(ctx, "fail drive "+d, func(c *api.Client) error { return c.FailDrive(ctx, d) }); err != nil {
			return err
		}
		until()
		// The node may be down for another fault: retry until the end
		// of the recovery bound.
		deadline := time.Now().Add(e.o.RecoverBound)
		for {
			err := e.apiCall(ctx, "replace drive "+d, func(c *api.Client) error { return c.ReplaceDrive(ctx, d) })
			if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
				return err
			}
			sleep(ctx, time.Second)
		}
	}
	return fmt.Errorf("fault kind %q unknown", f.Kind)
}

// replaceIfFailed replaces drive d when an array counts its member failed
// (a healed drive fault leaves the member failed until it is replaced).
func (e *env) replaceIfFailed(ctx context.Context, d string) error {
	sleep(ctx, time.Second) // the control file is read every 100 ms
	deadline := time.Now().Add(e.o.RecoverBound)
	for {
		var failed bool
		err := e.apiCall(ctx, "arrays", func(c *api.Client) error {
			as, err := c.Arrays(ctx)
			for _, a := range as {
				for _, m := range a.Members {
					if m.Drive == d && (m.State == cluster.MemberDriveFailed) {
						failed = true
					}
				}
			}
			return err
		})
		if err == nil && !failed {
			return nil
		}
		if err == nil {
			err = e.apiCall(ctx, "replace drive "+d, func(c *api.Client) error { return c.ReplaceDrive(ctx, d) })
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleep(ctx, time.Second)
	}
}

// Ensure the multipath device is what the checker writes with FUA.
var _ blockdev.FUAWriter = (*host.Multipath)(nil)
