package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"tier0/slurm-plugin/program"
)

// exitError carries a process exit code (cmd/tier0 honours ExitCode).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }
func (e exitError) ExitCode() int { return e.code }

type flags struct {
	config  string
	node    string
	arrays  string
	timeout time.Duration
	json    *bool
}

// Command returns the "slurm" command; jsonOut is the CLI's global --json.
func Command(jsonOut *bool) *cobra.Command {
	if jsonOut == nil {
		jsonOut = new(bool)
	}
	f := &flags{json: jsonOut}
	cmd := &cobra.Command{
		Use:   "slurm",
		Short: "Slurm hooks: prolog, epilog and healthcheck for tier0 storage",
		Long: "Entry points for slurm.conf (Prolog=, Epilog=, HealthCheckProgram=), normally run\n" +
			"through the wrapper scripts of slurm-plugin/scripts. See docs/SLURM.md.",
	}
	defCfg := os.Getenv("TIER0_SLURM_CONFIG")
	if defCfg == "" {
		defCfg = program.DefaultConfigPath
	}
	cmd.PersistentFlags().StringVar(&f.config, "config", defCfg, "hooks configuration file (YAML)")
	cmd.PersistentFlags().StringVar(&f.node, "node", os.Getenv("SLURMD_NODENAME"), "Slurm node name [$SLURMD_NODENAME]")
	cmd.PersistentFlags().DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")

	prolog := &cobra.Command{
		Use:   "prolog",
		Short: "refuse the job (exit 1, node drained) unless this node's tier0 storage is usable",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			r, env, closeLog, err := f.setup("prolog")
			if err != nil {
				return exitError{1, err}
			}
			defer closeLog()
			ctx, cancel := context.WithTimeout(c.Context(), f.timeout)
			defer cancel()
			var arrays []string
			for _, a := range strings.Split(f.arrays, ",") {
				if a = strings.TrimSpace(a); a != "" {
					arrays = append(arrays, a)
				}
			}
			if err := r.Prolog(ctx, env, arrays); err != nil {
				return exitError{1, err}
			}
			return nil
		},
	}
	prolog.Flags().StringVar(&f.arrays, "arrays", "", "arrays the job uses, comma separated [job comment tier0-arrays=..., else prolog_arrays]")

	epilog := &cobra.Command{
		Use:   "epilog",
		Short: "record the job's tier0 storage figures on this node (always exits 0)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			r, env, closeLog, err := f.setup("epilog")
			if err != nil {
				fmt.Fprintln(os.Stderr, "tier0 epilog:", err)
				return nil // never fail a job over statistics
			}
			defer closeLog()
			ctx, cancel := context.WithTimeout(c.Context(), f.timeout)
			defer cancel()
			rec, err := r.Epilog(ctx, env)
			if err != nil {
				r.Log.Warn("epilog: recording failed", "err", err)
			}
			if *f.json {
				return json.NewEncoder(c.OutOrStdout()).Encode(rec)
			}
			return nil
		},
	}

	health := &cobra.Command{
		Use:   "healthcheck",
		Short: "drain this node when its tier0 storage role failed, resume it when healthy (tier0 drains only)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			r, env, closeLog, err := f.setup("healthcheck")
			if err != nil {
				return exitError{1, err}
			}
			defer closeLog()
			ctx, cancel := context.WithTimeout(c.Context(), f.timeout)
			defer cancel()
			res, err := r.HealthCheck(ctx, env.Node)
			if err != nil {
				r.Log.Error("healthcheck failed", "err", err)
				return exitError{1, err}
			}
			if *f.json {
				return json.NewEncoder(c.OutOrStdout()).Encode(res)
			}
			fmt.Fprintf(c.OutOrStdout(), "%s (%s): %s %s -> %s (%s)\n", res.Node, res.Tier0Node, res.Verdict,
				strings.Join(res.Reasons, "; "), res.Action, res.Why)
			return nil
		},
	}
	cmd.AddCommand(prolog, epilog, health)
	return cmd
}

// setup loads the configuration and opens the hook log.
func (f *flags) setup(hook string) (*program.Runner, program.Env, func(), error) {
	env := program.EnvFrom(os.Getenv)
	env.Node = f.node
	if env.Node == "" {
		return nil, env, nil, errors.New("no node name: SLURMD_NODENAME is not set; pass --node")
	}
	cfg, err := program.LoadConfig(f.config)
	if err != nil {
		return nil, env, nil, err
	}
	var w io.Writer = os.Stderr
	closeLog := func() {}
	if err := os.MkdirAll(filepath.Dir(cfg.HookLog), 0o755); err == nil {
		if lf, err := os.OpenFile(cfg.HookLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
			w = io.MultiWriter(lf, os.Stderr)
			closeLog = func() { _ = lf.Close() }
		}
	}
	log := slog.New(slog.NewTextHandler(w, nil)).With("hook", hook, "pid", os.Getpid())
	return program.NewRunner(cfg, log), env, closeLog, nil
}
