package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/config"
	"tier0/reliability/campaign"
	"tier0/reliability/nemesis"
)

// campaignExit carries the campaign's exit code: 1 a violation (data lost,
// stale or corrupt, or an array stuck), 2 a campaign that could not run.
type campaignExit struct {
	err  error
	code int
}

func (e campaignExit) Error() string { return e.err.Error() }
func (e campaignExit) Unwrap() error { return e.err }
func (e campaignExit) ExitCode() int { return e.code }

// campaignOptions are the flags of `tier0 campaign`.
type campaignOptions struct {
	site, work, tier0d, faults, logLevel string
	local, short, keep, netns, pastStuck bool
	inHub, nemesisKinds                  string
	duration, bound, pace, window        time.Duration
	seed                                 uint64
	units, portShift, runs               int
	json                                 bool // the root's --json, set when the command runs
}

func (o *campaignOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.site, "site", "", "site configuration file (every node on 127.0.0.1)")
	f.BoolVar(&o.local, "local", false, "start the whole cluster on this machine (required)")
	f.BoolVar(&o.short, "short", false, "two faults only (about 2 minutes)")
	f.DurationVar(&o.duration, "duration", 0, "repeat random faults until this has passed (soak)")
	f.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()%1_000_000), "seed for victims and the workload (printed; rerun with it)")
	f.StringVar(&o.faults, "faults", "", "comma-separated fault list: "+strings.Join(campaign.AllFaults, ","))
	f.DurationVar(&o.bound, "bound", 90*time.Second, "how long arrays may take to be back active and optimal after a fault")
	f.DurationVar(&o.pace, "recovery-pace", 0, "each writer waits this long between I/Os while the cluster recovers (0: full speed; resync yields to writes)")
	f.IntVar(&o.units, "units", 1024, "4 KiB units checked per array")
	f.StringVar(&o.work, "workdir", "", "work directory for drives, state and node logs (default: a new temporary one)")
	f.BoolVar(&o.keep, "keep", false, "keep the work directory after the run")
	f.IntVar(&o.portShift, "port-shift", 0, "add this to every port of the site (to run beside another local cluster)")
	f.StringVar(&o.tier0d, "tier0d", "", "tier0d binary (default: next to tier0, then $PATH)")
	f.StringVar(&o.logLevel, "log-level", "error", "log level of the campaign's own log on stderr")
	f.BoolVar(&o.netns, "netns", false, "run the nodes in network namespaces (root) and enable the partition-owner fault")
	f.StringVar(&o.nemesisKinds, "nemesis", "all", "run the nemesis with these fault kinds (comma list; all, process, network, disk, ops, or "+strings.Join(nemesis.AllKinds, ",")+")")
	f.IntVar(&o.runs, "runs", 1, "nemesis: schedules to run (seeds --seed, --seed+1, ...)")
	f.DurationVar(&o.window, "window", 20*time.Second, "nemesis: each schedule's fault window")
	f.BoolVar(&o.pastStuck, "past-stuck", false, "nemesis: after a run whose arrays stay stuck, keep its cluster directory as stuck-run-N and go on with a fresh cluster (default: stop there)")
	f.StringVar(&o.inHub, "in-hub", "", "internal: running inside the hub namespace of this prefix")
	_ = f.MarkHidden("in-hub")
}

// newCampaignCmd is `tier0 campaign`: the fault campaign and the nemesis.
func newCampaignCmd(root *rootOptions) *cobra.Command {
	o := &campaignOptions{}
	cmd := &cobra.Command{
		Use:   "campaign --site FILE --local [--short|--duration D] [--seed N] [--nemesis KINDS --runs R]",
		Short: "fault campaign: inject node kills, freezes and drive faults under a checked write workload",
		Long: `campaign starts the site's cluster on this machine (one tier0d per node),
writes self-checking blocks to every array through the ANA multipath, and
injects faults one after another: kill -9 of an array's owner mid-write,
SIGSTOP of an owner past its lease then SIGCONT (its late writes must be
refused by the backend reservations), kill -9 of a random node, of an owner
while it resyncs a returned member, of an etcd peer, two nodes at once
(RAID-6 sites), and a member drive failed and replaced. After each fault
every array must be back active and optimal within --bound. At the end
every block is verified: it must hold its newest acknowledged write (or a
newer one that was in flight), never older, never torn.

--netns (root) runs every node in its own network namespace behind a
bridge (node addresses from the site, e.g.
reliability/campaign/testdata/netns5.yaml) and adds the partition-owner
fault: the owner's link goes down until another node serves its array.

--short runs two faults (kill-owner, freeze-owner; kill-two on RAID-6
sites); the default runs every fault once; --duration repeats random faults
until it has passed (the soak form, scripts/soak.sh).

--nemesis KINDS (a comma list, default all; --runs or --window alone
also select the nemesis) runs the nemesis
instead (reliability/nemesis): every node's addresses are routed through
toxiproxy proxies on 127.0.100.x, and each run draws a schedule of 1-3
overlapping faults from its seed (--seed for the first run, +1 for each
next one): kill, freeze (below, around and above the lease TTL),
restart-storm, power-loss, slow-disk, disk-error, latency, bandwidth,
stall, reset, one-way,
partition, drain, fail-drive (or the groups process, network, disk, ops).
Each run's faults start within --window, are healed, the cluster must
recover, and every read and write of the run is checked for
linearizability. --runs R runs R schedules; --duration D runs them until D
has passed. A line per run, then a summary: runs, faults injected by kind,
operations checked, anomalies by kind. Replay a run with --seed N --runs 1.

Exit status: 0 passed, 1 a violation (lost, stale or corrupt data, an
anomaly in a checked history, or a stuck array), 2 the campaign could not
run. docs/RELIABILITY.md explains the campaigns and the figures.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.json = root.json
			return runCampaign(cmd, o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runCampaign(cmd *cobra.Command, o *campaignOptions) error {
	if o.site == "" {
		return campaignExit{errors.New("--site is required (e.g. site-configs/local-5node.yaml)"), 2}
	}
	if !o.local {
		return campaignExit{errors.New("only --local campaigns exist: they start and kill tier0d processes on this machine; pass --local"), 2}
	}
	if o.short && o.duration > 0 {
		return campaignExit{errors.New("--short and --duration exclude each other"), 2}
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(o.logLevel)); err != nil {
		return campaignExit{fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel), 2}
	}
	bin, err := campaignTier0d(o.tier0d)
	if err != nil {
		return campaignExit{err, 2}
	}
	if o.work == "" {
		o.work, err = os.MkdirTemp("", "tier0-campaign-")
		if err != nil {
			return campaignExit{err, 2}
		}
		if !o.keep {
			defer os.RemoveAll(o.work)
		}
	}
	if fl := cmd.Flags(); fl.Changed("nemesis") || fl.Changed("runs") || fl.Changed("window") {
		if o.netns || o.inHub != "" || o.short || o.faults != "" {
			return campaignExit{errors.New("--nemesis draws its own faults: it excludes --netns, --short and --faults"), 2}
		}
		return runNemesis(cmd, nemesisOpts{site: o.site, bin: bin, work: o.work, kinds: o.nemesisKinds, seed: o.seed, runs: o.runs,
			duration: o.duration, window: o.window, bound: o.bound, units: o.units, portShift: o.portShift, keep: o.keep, json: o.json, level: lv, pastStuck: o.pastStuck})
	}
	co := campaign.Options{Site: o.site, Binary: bin, Workdir: o.work, PortShift: o.portShift, Seed: o.seed,
		Duration: o.duration, RecoverBound: o.bound, RecoveryPace: o.pace, Units: o.units,
		Out:    cmd.ErrOrStderr(),
		Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lv})),
	}
	if o.faults != "" {
		co.Faults = strings.Split(o.faults, ",")
	}
	co.Short = o.short
	if o.netns || o.inHub != "" {
		addrs := map[string]string{}
		for _, n := range cfgNodesAddrs(o.site) {
			addrs[n[0]] = n[1]
		}
		if o.inHub == "" {
			return campaignInNetns(cmd, addrs)
		}
		co.Netns = campaign.NetnsFor(o.inHub, addrs)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := campaign.Run(ctx, co)
	if err != nil {
		return campaignExit{fmt.Errorf("campaign could not run (node logs in %s; --keep keeps them): %w", o.work, err), 2}
	}
	return campaignResult(cmd, res, o.json, o.keep, fmt.Sprintf("the work directory %s is removed; rerun with --keep --seed %d to keep the node logs\n", o.work, o.seed))
}

// campaignResult prints a campaign's or a nemesis run's result (its
// summary, or JSON) and turns a failed result into exit status 1, saying
// how to keep the node logs when they were removed.
func campaignResult(cmd *cobra.Command, res interface {
	Summary() string
	Err() error
}, asJSON, keep bool, removed string) error {
	if asJSON {
		if err := writeJSON(cmd.OutOrStdout(), res); err != nil {
			return err
		}
	} else {
		fmt.Fprint(cmd.OutOrStdout(), res.Summary())
	}
	if err := res.Err(); err != nil {
		if !keep {
			fmt.Fprint(cmd.ErrOrStderr(), removed)
		}
		return campaignExit{err, 1}
	}
	return nil
}

// campaignTier0d returns the tier0d binary: the flag, else next to this
// executable, else on $PATH.
func campaignTier0d(flag string) (string, error) {
	if flag != "" {
		if _, err := os.Stat(flag); err != nil {
			return "", fmt.Errorf("--tier0d: %w", err)
		}
		return flag, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "tier0d")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("tier0d")
	if err != nil {
		return "", errors.New("tier0d not found next to tier0 nor on $PATH; run `make build` or pass --tier0d")
	}
	return p, nil
}

// cfgNodesAddrs lists (node, address) of a site file.
func cfgNodesAddrs(site string) [][2]string {
	cfg, err := config.Load(site)
	if err != nil {
		return nil
	}
	var out [][2]string
	for _, n := range cfg.Nodes {
		out = append(out, [2]string{n.Name, n.Address})
	}
	return out
}

// campaignInNetns creates the namespaces, runs this same command again
// inside the hub namespace, and deletes them afterwards.
func campaignInNetns(cmd *cobra.Command, addrs map[string]string) error {
	if os.Geteuid() != 0 {
		return campaignExit{errors.New("--netns needs root to create network namespaces"), 2}
	}
	if len(addrs) == 0 {
		return campaignExit{errors.New("--netns: the site lists no node addresses"), 2}
	}
	prefix := fmt.Sprintf("t0c%d", os.Getpid()%100000)
	nn, err := campaign.SetupNetns(prefix, addrs)
	if err != nil {
		return campaignExit{fmt.Errorf("--netns: %w", err), 2}
	}
	defer nn.Close()
	exe, err := os.Executable()
	if err != nil {
		return campaignExit{err, 2}
	}
	var args []string
	for _, a := range os.Args[1:] {
		if a != "--netns" && a != "--netns=true" {
			args = append(args, a)
		}
	}
	args = append([]string{"netns", "exec", nn.Hub, exe}, append(args, "--in-hub", prefix)...)
	c := exec.Command("ip", args...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
	if err := c.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return campaignExit{fmt.Errorf("campaign in namespace %s: %w", nn.Hub, err), ee.ExitCode()}
		}
		return campaignExit{err, 2}
	}
	return nil
}

type nemesisOpts struct {
	site, bin, work, kinds string
	seed                   uint64
	runs, units, portShift int
	duration, window       time.Duration
	bound                  time.Duration
	keep, json, pastStuck  bool
	level                  slog.Level
}

// runNemesis runs `campaign --nemesis`: live lines on stderr, the summary
// (or JSON) on stdout, exit 1 on any anomaly.
func runNemesis(cmd *cobra.Command, n nemesisOpts) error {
	kinds, err := nemesis.ParseKinds(n.kinds)
	if err != nil {
		return campaignExit{fmt.Errorf("--nemesis: %w", err), 2}
	}
	if n.runs <= 0 {
		return campaignExit{fmt.Errorf("--runs %d: want at least 1", n.runs), 2}
	}
	if n.units > 0 && n.units < 8 {
		return campaignExit{fmt.Errorf("--units %d: want at least 8 per array", n.units), 2}
	}
	o := nemesis.Options{Site: n.site, Binary: n.bin, Workdir: n.work, PortShift: n.portShift, Kinds: kinds, Seed: n.seed,
		Runs: n.runs, Duration: n.duration, Window: n.window, RecoverBound: n.bound, Units: n.units, PastStuck: n.pastStuck,
		Out:    cmd.ErrOrStderr(),
		Logger: slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: n.level})),
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := nemesis.Run(ctx, o)
	if err != nil {
		return campaignExit{fmt.Errorf("nemesis could not run (node logs in %s; --keep keeps them): %w", n.work, err), 2}
	}
	return campaignResult(cmd, res, n.json, n.keep, fmt.Sprintf("the work directory %s is removed; rerun with --keep to keep the node logs\n", n.work))
}
