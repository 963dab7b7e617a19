package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/bench"
	"tier0/internal/version"
	"tier0/validate"
)

// validateExit carries validate's exit code (1 failed check, 2 could not
// run, 3 not validated: the failover story did not run, 130 interrupted)
// to main.
type validateExit struct {
	err  error
	code int
}

func (e validateExit) Error() string { return e.err.Error() }
func (e validateExit) Unwrap() error { return e.err }
func (e validateExit) ExitCode() int { return e.code }

// validateOptions are the flags of `tier0 validate`: the run's options and
// the log level as given.
type validateOptions struct {
	validate.Options
	logLevel string
}

func (o *validateOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.Site, "site", "", "site configuration file (site-configs/local-5node.yaml for --local)")
	f.BoolVar(&o.Local, "local", false, "start the whole cluster on this machine (one tier0d per node) and tear it down after")
	f.StringVarP(&o.OutDir, "out", "o", "tier0-report", "folder for results.json, the report and the node logs")
	f.StringVar(&o.WorkDir, "work", "", "work directory for drive files, etcd data and logs with --local (sets TIER0_WORK; default: the site's workdir)")
	f.BoolVar(&o.Short, "short", false, "short measurements (CI: about two minutes)")
	f.Float64Var(&o.ModelScale, "model-scale", 0, "with --local: scale of the drive and link model (overrides the site's model.scale; exported as TIER0_MODEL_SCALE)")
	f.IntVar(&o.Repeat, "repeat", 0, "runs of each scenario; the report shows median and range (default 3, 2 with --short)")
	f.StringVar(&o.Tier0d, "tier0d", "", "tier0d binary for --local (default: next to tier0, then $PATH)")
	f.BoolVar(&o.Keep, "keep", false, "keep the work directory (drives, etcd data, logs) after a --local run")
	f.BoolVar(&o.AllowWrites, "allow-writes", false, "without --local: confirm that every array's data may be overwritten")
	f.StringVar(&o.Victim, "kill", "", "node to kill in the failover test (default B)")
	f.BoolVar(&o.AllowDisruptive, "allow-disruptive", false, "without --local: run the failover story on the existing cluster (kills and restarts the tier0d of --kill NODE)")
	f.BoolVar(&o.SkipFailover, "skip-failover", false, "without --local: leave the failover story out on purpose (its checks are not run; exit 0 is possible)")
	f.StringVar(&o.KillCommand, "kill-command", "", "with --allow-disruptive: shell command that kill -9s tier0d of $TIER0_NODE (at $TIER0_NODE_ADDR); default: find it on this machine")
	f.StringVar(&o.StartCommand, "start-command", "", "with --allow-disruptive: shell command that starts tier0d of $TIER0_NODE again; default: restart the killed local process as it was")
	f.BoolVar(&o.LocalSlurm, "local-slurm", false, "start a throw-away Slurm on this machine (munged, slurmctld, one slurmd per node) whose Prolog, Epilog and HealthCheckProgram are the tier0 hooks, for the slurm hooks check (needs root and Slurm's packages; else the check is not run)")
	f.StringVar(&o.logLevel, "log-level", "warn", "log level of validate's own log on stderr: debug, info, warn, error")
}

// newValidateCmd is `tier0 validate`.
func newValidateCmd(root *rootOptions) *cobra.Command {
	vo := &validateOptions{}
	cmd := &cobra.Command{
		Use:   "validate --site FILE [--local]",
		Short: "Prove the whole story end to end: cluster up, benches, node failover under verified load, resync, failback, report",
		Long: `Runs the end-to-end validation of a site and writes results.json and the
report (report.html, report.md, img/) into --out.

With --local it starts the whole cluster on this machine (one tier0d process
per node, drives as files in the work directory), and stops it and removes
its files afterwards, also on Ctrl-C. Without --local it drives an existing
cluster through its API and frontends (--allow-writes: every array's data is
overwritten); the failover story then runs only with --allow-disruptive (the
tier0d of --kill NODE is killed and restarted: found on this machine by its
--node argument, or with --kill-command/--start-command, run by sh -c with
TIER0_NODE and TIER0_NODE_ADDR set). Without it the run ends "not validated:
failover not run" (exit 3), unless --skip-failover leaves it out on purpose.

Steps: cluster up; raw drives, block layer and frontend benches (sequential
1 MiB and random 4 KiB read/write); all arrays filled with verify blocks;
kill -9 of node B under verified load (its array must move complete, the
others run degraded, I/O must go on, every acknowledged block must verify;
failover time recorded); bench with one node lost; node B restarted;
resync/rebuild (progress bar); failback; redundancy back; final verify of
every array; Slurm hooks; GPUDirect Storage.

Exit status: 0 every check passed (or did not apply), 1 a check failed,
2 the validation could not run, 3 not validated (no check failed, but the
failover story did not run), 130 interrupted. docs/VALIDATE.md has the details.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runValidate(cmd, root.json, vo) },
	}
	vo.AddFlags(cmd.Flags())
	return cmd
}

func runValidate(cmd *cobra.Command, jsonOut bool, vo *validateOptions) error {
	o := vo.Options
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(vo.logLevel)); err != nil {
		return validateExit{err: err, code: validate.ExitSetup}
	}
	o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lv}))
	o.Version = version.String()
	o.Out = cmd.OutOrStdout()
	o.Progress = !jsonOut
	if o.Token == "" {
		o.Token = os.Getenv("TIER0_TOKEN")
	}
	if jsonOut {
		o.Out = cmd.ErrOrStderr()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := validate.Run(ctx, o)
	if jsonOut && rep != nil {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		_ = enc.Encode(map[string]any{"results": rep.ResultsFile, "report": rep.Paths, "checks": rep.Results.Checks, "logs": rep.Logs})
	}
	if err != nil {
		var res *bench.Results
		if rep != nil {
			res = rep.Results
		}
		return validateExit{err: err, code: validate.ExitCode(res, err)}
	}
	return nil
}
