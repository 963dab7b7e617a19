package validate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"tier0/internal/units"
	"time"

	"tier0/bench"
	"tier0/daemon/api"
	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/internal/localcluster"
	"tier0/reports"
)

// Options configure Run.
type Options struct {
	// Site is the site configuration file.
	Site string
	// Local starts the cluster on this machine (one tier0d per node).
	Local bool
	// OutDir receives results.json, report.html, report.md, img/ and the
	// node logs (default "tier0-report").
	OutDir string
	// WorkDir overrides the site's work directory in local mode: it is
	// exported as TIER0_WORK (the site config must use ${TIER0_WORK} in its
	// workdir, as site-configs/local-5node.yaml does). Run sets the
	// variable in its own process environment.
	WorkDir string
	// Short shortens every measurement (CI: about two minutes in all).
	Short bool
	// ModelScale, when positive, overrides the site's model.scale for
	// this run (it is exported as TIER0_MODEL_SCALE to the tier0d
	// processes of a local run).
	ModelScale float64
	// Repeat is how many times each scenario runs (default 3; 2 with
	// Short); the report shows the median and the range.
	Repeat int
	// Tier0d is the tier0d binary (default: next to this executable, then
	// $PATH).
	Tier0d string
	// Tier0 is the tier0 binary the Slurm hooks run (default: this
	// executable).
	Tier0 string
	// Keep leaves the work directory (drive files, etcd data, logs) in
	// place after a local run.
	Keep bool
	// AllowWrites confirms, without Local, that every array's data may be
	// overwritten by verify blocks.
	AllowWrites bool
	// Token is the API bearer token (only read calls are made; optional).
	Token string
	// HostNQN is this process's NVMe host NQN on the frontend (default
	// nqn.2014-08.io.tier0:validate:HOSTNAME).
	HostNQN string
	// Victim is the node killed in the failover test (default B, else the
	// second node of the site).
	Victim string
	// AllowDisruptive lets a run on an existing cluster (no Local) kill the
	// victim's tier0d and restart it: the failover story. Without it (and
	// without SkipFailover) the run ends "not validated: failover not run"
	// (ErrNotValidated, exit status ExitNotValidated).
	AllowDisruptive bool
	// SkipFailover leaves the failover story out on purpose: its checks
	// are not run, and the run can still pass.
	SkipFailover bool
	// KillCommand and StartCommand stop and start the victim's tier0d on
	// an existing cluster (sh -c, with TIER0_NODE and TIER0_NODE_ADDR set).
	// Without them the victim's tier0d must run on this machine: it is
	// found in /proc, killed by PID and restarted as it was.
	KillCommand, StartCommand string
	// LocalSlurm starts a throw-away Slurm on this machine (munged,
	// slurmctld and one slurmd per node, 127.0.0.1 only) whose Prolog,
	// Epilog and HealthCheckProgram are the tier0 hooks, for the "slurm
	// hooks" check: a job runs on every node through it. Without Slurm's
	// packages (or root) the check is not run, with the reason.
	LocalSlurm bool
	// Out receives the live checklist, the progress bar, the tables and the
	// report location (default: discard).
	Out io.Writer
	// Progress draws a progress bar on Out while arrays resync.
	Progress bool
	// Version is the tier0 version recorded in the results.
	Version string
	// Logger receives operational logs (default: discard).
	Logger *slog.Logger
	// OnCheck, when set, is called after each check is recorded (from
	// Run's goroutine).
	OnCheck func(bench.Check)
}

// Report is what Run produced.
type Report struct {
	Results     *bench.Results
	ResultsFile string
	Paths       reports.Paths
	// Logs holds copies of the nodes' logs (local mode).
	Logs []string
}

// timings are the durations of the measurements.
type timings struct {
	bench      time.Duration // each scenario
	preKill    time.Duration // load before the kill
	postMove   time.Duration // load after the move was seen
	boot       time.Duration // cluster up timeout
	failover   time.Duration // move timeout
	resync     time.Duration // resync/rebuild timeout
	seqQD      int
	randQD     int
	failoverQD int
	fillQD     int
	hold       time.Duration // multipath hold timeout
	pollEvery  time.Duration
	stopGrace  time.Duration
	// region limits every array to its first region bytes (0: all of it).
	region int64
	// repeat is the repetitions of each scenario.
	repeat int
}

func timingsFor(short bool) timings {
	t := timings{
		bench: 8 * time.Second, preKill: 4 * time.Second, postMove: 6 * time.Second,
		boot: 120 * time.Second, failover: 60 * time.Second, resync: 300 * time.Second,
		seqQD: 4, randQD: 16, failoverQD: 8, fillQD: 4, hold: 60 * time.Second,
		pollEvery: 250 * time.Millisecond, stopGrace: 10 * time.Second, repeat: 3,
	}
	if short {
		t.bench, t.preKill, t.postMove, t.resync = 2*time.Second, 2*time.Second, 3*time.Second, 180*time.Second
		t.region = 48 << 20
		t.repeat = 2
	}
	return t
}

type runner struct {
	o   Options
	t   timings
	cfg *config.Config
	res *bench.Results
	log *slog.Logger
	// hostLog receives the NVMe/TCP host's connection logs: only at debug
	// level, since a killed node makes every path to it log each retry.
	hostLog *slog.Logger
	ctx     context.Context

	work    string
	lc      *localCluster
	ctl     nodeControl // kills and restarts nodes: lc, or a clusterControl
	clients map[string]*api.Client
	down    map[string]bool // nodes known to be down (killed)
	arrays  []string        // array names, config order
	fronts  map[string]*host.Multipath
	victim  string
	stopWhy string // reason for the checks not reached
	// cpu watches this process and the tier0d processes for the CPU cost
	// of each measurement.
	cpu *bench.CPUWatch
	// scaleGiven: the model's scale was fixed by --model-scale or
	// TIER0_MODEL_SCALE, so it is not calibrated.
	scaleGiven bool
	// measureScale is the calibration's measurement (nil: calibrationRun;
	// tests inject a fake).
	measureScale measureFunc
}

// Run performs the validation. The returned Report is non-nil whenever
// results were written. The error wraps ErrChecksFailed when a check
// failed, ErrInterrupted when ctx ended first, ErrSetup when the run could
// not be made; ExitCode maps it to the process exit code.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OutDir == "" {
		o.OutDir = "tier0-report"
	}
	if o.Site == "" {
		return nil, fmt.Errorf("%w: no site configuration given; pass --site FILE (site-configs/local-5node.yaml runs everything on this machine with --local)", ErrSetup)
	}
	r := &runner{o: o, t: timingsFor(o.Short), log: o.Logger, cpu: bench.NewCPUWatch(), ctx: ctx, clients: map[string]*api.Client{}, down: map[string]bool{}, fronts: map[string]*host.Multipath{}}
	r.hostLog = slog.New(slog.DiscardHandler)
	if o.Logger.Enabled(ctx, slog.LevelDebug) {
		r.hostLog = o.Logger
	}
	if o.Repeat > 0 {
		r.t.repeat = o.Repeat
	}
	if err := r.setup(); err != nil {
		return nil, err
	}
	started := time.Now()
	siteName := strings.TrimSuffix(filepath.Base(o.Site), filepath.Ext(o.Site))
	r.res = bench.NewResults(fmt.Sprintf("validate-%s-%s", siteName, started.UTC().Format("20060102T150405Z")), siteName, started, bench.CollectEnvironment(o.Version, siteName))
	r.res.Run.Mode = map[bool]string{true: "local", false: "cluster"}[o.Local]
	r.res.Run.Topology = topology(r.cfg)
	for _, a := range r.cfg.Arrays {
		r.res.Run.Arrays = append(r.res.Run.Arrays, bench.ArrayShape{Name: a.Name, Level: a.Level, Data: len(a.Members) - a.Parity(), Parity: a.Parity()})
	}
	if o.Short {
		r.res.Run.Notes = append(r.res.Run.Notes, fmt.Sprintf("short run (--short): %s per scenario, the first %s of each array filled, measured and verified", r.t.bench, units.FormatBytes(r.t.region)))
	}
	r.res.Run.Repeat = r.t.repeat
	r.res.Run.Model = modelInfo(r.cfg, o.Local)
	r.cpu.Watch("self", "validate (load generator, NVMe/TCP host, multipath)", bench.RoleHost)
	fmt.Fprintf(o.Out, "tier0 validate: site %s (%s), %s mode, work dir %s\n", siteName, r.res.Run.Topology, r.res.Run.Mode, r.work)

	stepErr := r.steps()
	logs := r.teardown()

	reason := r.stopWhy
	if ctx.Err() != nil {
		reason = checkInterruptedWhy
	}
	if reason == "" {
		reason = "an earlier step did not complete"
	}
	complete(r.res, reason)
	r.res.Run.Finished = time.Now()
	rep = &Report{Results: r.res, Logs: logs}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return rep, fmt.Errorf("%w: report folder %s: %v", ErrSetup, o.OutDir, err)
	}
	rep.ResultsFile = filepath.Join(o.OutDir, "results.json")
	if err := bench.WriteFile(rep.ResultsFile, r.res); err != nil {
		return rep, err
	}
	if rep.Paths, err = reports.Generate(r.res, o.OutDir); err != nil {
		return rep, fmt.Errorf("report: %w", err)
	}
	fmt.Fprintln(o.Out)
	if err := reports.WriteTables(o.Out, r.res); err != nil {
		return rep, err
	}
	fmt.Fprintln(o.Out)
	_ = WriteChecklist(o.Out, r.res)
	fmt.Fprintf(o.Out, "results: %s\nreport:  %s\nsummary: %s\n", rep.ResultsFile, rep.Paths.HTML, rep.Paths.Markdown)
	if len(logs) > 0 {
		fmt.Fprintf(o.Out, "node logs: %s\n", filepath.Dir(logs[0]))
	}

	switch {
	case ctx.Err() != nil:
		return rep, fmt.Errorf("%w: %v; every process it started was stopped", ErrInterrupted, context.Cause(ctx))
	case len(Failed(r.res)) > 0:
		var names []string
		for _, c := range Failed(r.res) {
			names = append(names, c.Name)
		}
		return rep, fmt.Errorf("%w: %d check(s) failed: %s (details in %s)", ErrChecksFailed, len(names), strings.Join(names, ", "), rep.Paths.HTML)
	case stepErr != nil:
		return rep, stepErr
	}
	if why, ok := NotValidated(r.res); ok {
		return rep, fmt.Errorf("%w: %s", ErrNotValidated, why)
	}
	return rep, nil
}

// setup loads the site, finds tier0d, and in local mode prepares the work
// directory: stale processes from a killed run stopped, stale files
// removed, ports checked.
func (r *runner) setup() error {
	o := r.o
	if o.Local && o.WorkDir != "" {
		abs, err := filepath.Abs(o.WorkDir)
		if err != nil {
			return fmt.Errorf("%w: --work %s: %v", ErrSetup, o.WorkDir, err)
		}
		os.Setenv("TIER0_WORK", abs)
	}
	r.scaleGiven = o.ModelScale != 0 || os.Getenv(config.EnvModelScale) != ""
	if o.ModelScale != 0 {
		if o.ModelScale < 0 || o.ModelScale > 1 {
			return fmt.Errorf("%w: --model-scale %g: expected a factor in (0, 1]", ErrSetup, o.ModelScale)
		}
		os.Setenv(config.EnvModelScale, strconv.FormatFloat(o.ModelScale, 'g', -1, 64))
	}
	cfg, err := config.Load(o.Site)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	r.cfg = cfg
	for _, a := range cfg.Arrays {
		r.arrays = append(r.arrays, a.Name)
	}
	r.victim = o.Victim
	if r.victim == "" {
		r.victim = cfg.Nodes[min(1, len(cfg.Nodes)-1)].Name
		if _, ok := cfg.Node("B"); ok {
			r.victim = "B"
		}
	}
	if _, ok := cfg.Node(r.victim); !ok {
		return fmt.Errorf("%w: node %q to kill is not in %s", ErrSetup, r.victim, o.Site)
	}
	for _, n := range cfg.Nodes {
		r.clients[n.Name] = api.NewClient("http://"+n.AdvertiseAddr(n.API), o.Token, &httpClient)
	}
	if !o.Local {
		if !o.AllowWrites {
			return fmt.Errorf("%w: validating an existing cluster writes verify blocks over every array, destroying the data on them; pass --allow-writes to confirm, or use --local to run a throw-away cluster on this machine", ErrSetup)
		}
		if o.AllowDisruptive && o.SkipFailover {
			return fmt.Errorf("%w: --allow-disruptive and --skip-failover contradict each other; pass one", ErrSetup)
		}
		if o.AllowDisruptive {
			r.ctl = newClusterControl(cfg, o.KillCommand, o.StartCommand, filepath.Join(o.OutDir, "logs"))
		}
		// The CPU cost covers the nodes whose tier0d runs on this machine.
		for _, n := range cfg.Nodes {
			if img, err := findTier0dProc("/proc", n.Name); err == nil {
				r.cpu.Watch(strconv.Itoa(img.pid), "tier0d "+n.Name, bench.RoleTier0d)
			}
		}
		return nil
	}
	if cfg.Workdir == "" {
		return fmt.Errorf("%w: site %s has no workdir; --local needs one for the drive files (for example workdir: ${TIER0_WORK:-tier0-work})", ErrSetup, o.Site)
	}
	r.work, err = filepath.Abs(cfg.Workdir)
	if err != nil {
		return fmt.Errorf("%w: workdir %s: %v", ErrSetup, cfg.Workdir, err)
	}
	if o.WorkDir != "" {
		if want, _ := filepath.Abs(o.WorkDir); want != r.work {
			return fmt.Errorf("%w: --work %s was given, but the workdir of %s is %q, which does not use ${TIER0_WORK}; change it to workdir: ${TIER0_WORK:-tier0-work}", ErrSetup, o.WorkDir, o.Site, cfg.Workdir)
		}
	}
	for _, n := range cfg.Nodes {
		for _, d := range n.Drives {
			if d.Path == "" || d.Size == 0 {
				return fmt.Errorf("%w: drive %s of node %s is not a file with a size; --local runs only sites whose drives are files (like site-configs/local-5node.yaml)", ErrSetup, d.Name, n.Name)
			}
		}
	}
	bin, err := findTier0d(o.Tier0d)
	if err != nil {
		return err
	}
	site, _ := filepath.Abs(o.Site)
	r.lc = newLocalCluster(cfg, bin, site, r.work, r.log)
	r.lc.OnStart(func(node string, pid int) {
		r.cpu.Watch(strconv.Itoa(pid), "tier0d "+node, bench.RoleTier0d)
	})
	r.ctl = r.lc
	if pids := localcluster.StopStale(r.work); len(pids) > 0 {
		fmt.Fprintf(o.Out, "stopped %d tier0d process(es) left by an earlier run: %v\n", len(pids), pids)
	}
	// Ports before files: a cluster that holds the ports may be running on
	// these very files.
	if err := localcluster.CheckPorts(cfg); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if err := localcluster.CleanWork(cfg, r.work); err != nil {
		return fmt.Errorf("%w: removing the files of an earlier run in %s: %v", ErrSetup, r.work, err)
	}
	return os.MkdirAll(r.work, 0o755)
}

// findTier0d resolves the tier0d binary.
func findTier0d(given string) (string, error) {
	if given != "" {
		p, err := exec.LookPath(given)
		if err != nil {
			return "", fmt.Errorf("%w: --tier0d %s: %v", ErrSetup, given, err)
		}
		return filepath.Abs(p)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "tier0d")
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("tier0d"); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("%w: no tier0d binary next to this executable or on $PATH; build it (make build puts it in bin/) or pass --tier0d PATH", ErrSetup)
}

func topology(cfg *config.Config) string {
	drives := 0
	for _, n := range cfg.Nodes {
		drives = max(drives, len(n.Drives))
	}
	levels := map[string]int{}
	var order []string
	for _, a := range cfg.Arrays {
		p := a.Parity()
		k := fmt.Sprintf("%s %d+%d", strings.ToUpper(strings.Replace(a.Level, "raid", "RAID-", 1)), len(a.Members)-p, p)
		if levels[k] == 0 {
			order = append(order, k)
		}
		levels[k]++
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%d x %s", levels[k], k))
	}
	return fmt.Sprintf("%d nodes x %d drives, %s", len(cfg.Nodes), drives, strings.Join(parts, ", "))
}

// check records a check, prints it, and tells OnCheck. A check recorded
// after ctx ended is not trusted: it becomes not-run.
func (r *runner) check(name string, st bench.CheckStatus, reason string) {
	if r.ctx.Err() != nil {
		st, reason = bench.NotRun, "interrupted during this step"
	}
	r.res.AddCheck(name, st, reason)
	for _, c := range r.res.Checks {
		if c.Name == name {
			fmt.Fprintln(r.o.Out, checkLine(c))
			if r.o.OnCheck != nil {
				r.o.OnCheck(c)
			}
		}
	}
}

// teardown closes the frontends, stops the local cluster, copies its logs
// into the report folder and removes the work files (unless Keep).
func (r *runner) teardown() []string {
	for _, m := range r.fronts {
		_ = m.Close()
	}
	r.fronts = map[string]*host.Multipath{}
	if r.lc == nil {
		return nil
	}
	r.lc.Stop(r.t.stopGrace)
	var logs []string
	if err := os.MkdirAll(filepath.Join(r.o.OutDir, "logs"), 0o755); err == nil {
		for _, n := range r.cfg.Nodes {
			src := filepath.Join(r.lc.LogDir(), n.Name+".log")
			dst := filepath.Join(r.o.OutDir, "logs", n.Name+".log")
			if b, err := os.ReadFile(src); err == nil && os.WriteFile(dst, b, 0o644) == nil {
				logs = append(logs, dst)
			}
		}
	}
	if !r.o.Keep {
		if err := localcluster.CleanWork(r.cfg, r.work); err != nil {
			r.log.Warn("removing work files", "dir", r.work, "err", err)
		}
	} else {
		fmt.Fprintf(r.o.Out, "work files kept in %s (--keep)\n", r.work)
	}
	return logs
}

// steps runs the validation in order. It returns an error only when the
// run cannot go on; the checks say what happened.
func (r *runner) steps() error {
	if r.o.Local {
		// The scale first: the raw bench and the cluster run at the one
		// chosen.
		r.calibrate()
		if err := r.rawBench(); err != nil {
			return r.stop(err)
		}
		if err := r.startCluster(); err != nil {
			return r.stop(err)
		}
	} else {
		r.check(CheckRaw, bench.NotRun, "needs --local: in a running cluster the drives belong to tier0d, and writing them directly would destroy the arrays")
		if err := r.clusterUp(); err != nil {
			return r.stop(err)
		}
	}
	if err := r.connectFrontends(); err != nil {
		r.check(CheckFill, bench.Fail, err.Error())
		return r.stop(err)
	}
	if err := r.fill(); err != nil {
		return r.stop(err)
	}
	// After the fill: the cluster has settled (a baseline taken right
	// after start-up includes its elections and first syncs).
	r.idleCPU()
	r.blockBench()
	r.benchLayer(CheckFrontend, bench.LayerFrontend, bench.Healthy, r.frontTargets(), 1)
	if r.ctx.Err() != nil {
		return nil
	}
	if r.ctl != nil {
		if !r.o.Local {
			fmt.Fprintf(r.o.Out, "--allow-disruptive: killing the tier0d of node %s for the failover story\n", r.victim)
		}
		if err := r.failover(); err != nil {
			return r.stop(err)
		}
		r.benchLayer(CheckDegradedBench, bench.LayerFrontend, bench.Degraded, r.frontTargets(), 3)
		if err := r.restart(); err != nil {
			return r.stop(err)
		}
	} else {
		why := NotValidatedWhy
		if r.o.SkipFailover {
			why = SkippedFailoverWhy
		}
		for _, c := range FailoverChecks {
			r.check(c, bench.NotRun, why)
		}
	}
	r.redundancy()
	r.finalVerify()
	if r.ctl != nil {
		r.fsFailover()
	} else {
		r.check(CheckFS, bench.NotRun, "the failover story did not run")
	}
	r.slurm()
	r.gds()
	return nil
}

// stop records why the remaining checks did not run and returns err.
func (r *runner) stop(err error) error {
	if r.stopWhy == "" {
		r.stopWhy = "not reached: " + oneLine(err.Error(), 200)
	}
	return err
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
