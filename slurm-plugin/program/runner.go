package program

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"tier0/daemon/slurm"
	"tier0/slurm-plugin/diskstat"
	"tier0/slurm-plugin/health"
)

// Scontrol is what the programs need from Slurm; *slurm.Client implements
// it.
type Scontrol interface {
	ShowNode(ctx context.Context, name string) (slurm.Node, error)
	Drain(ctx context.Context, name, reason string) error
	Resume(ctx context.Context, name string) error
}

// Env is what Slurm tells a hook through its environment.
type Env struct {
	Node    string // SLURMD_NODENAME
	JobID   string // SLURM_JOB_ID
	User    string // SLURM_JOB_USER
	Comment string // SLURM_JOB_COMMENT (set with sbatch --comment)
}

// EnvFrom reads Env with getenv (os.Getenv in production).
func EnvFrom(getenv func(string) string) Env {
	return Env{
		Node:    getenv("SLURMD_NODENAME"),
		JobID:   getenv("SLURM_JOB_ID"),
		User:    getenv("SLURM_JOB_USER"),
		Comment: getenv("SLURM_JOB_COMMENT"),
	}
}

// Runner runs the programs. Fill every field; NewRunner does it from a
// Config.
type Runner struct {
	Config Config
	Slurm  Scontrol
	HTTP   *http.Client
	Now    func() time.Time
	Log    *slog.Logger
}

// NewRunner returns a Runner using scontrol and HTTP as configured.
func NewRunner(c Config, log *slog.Logger) *Runner {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Runner{
		Config: c,
		Slurm: slurm.New(slurm.Options{Path: c.Scontrol, Conf: c.SlurmConf, Timeout: c.ScontrolTimeout,
			Attempts: c.ScontrolAttempts, Backoff: 300 * time.Millisecond, Logger: log}),
		HTTP: &http.Client{Timeout: c.HTTPTimeout},
		Now:  time.Now,
		Log:  log,
	}
}

// ErrPrologRefused: the Prolog found the node's storage unusable for the
// job. The message is the one-line reason.
var ErrPrologRefused = errors.New("tier0 storage not usable")

// ArraysFromComment returns the arrays named in a job comment by a token
// "tier0-arrays=a,b" (or "tier0_arrays="); nil when there is none.
func ArraysFromComment(comment string) []string {
	for _, tok := range strings.FieldsFunc(comment, func(r rune) bool { return r == ' ' || r == ';' || r == '\t' }) {
		k, v, ok := strings.Cut(tok, "=")
		if ok && (k == "tier0-arrays" || k == "tier0_arrays") {
			return splitList(v)
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// Prolog checks that this node's tier0 daemon is healthy and that every
// array the job may use has a usable path from here. arrays are the arrays
// given on the command line; when empty the job comment's tier0-arrays=
// token is used, and when that is absent Config.PrologArrays decides (all
// arrays or none). On a problem it drains the node with a "tier0:" reason
// (unless Config.PrologDrain is false or an administrator holds the node)
// and returns an error wrapping ErrPrologRefused whose text is one line.
// When all is well it stores the job's start snapshot of the I/O counters;
// a failure to do so is logged, never fatal.
func (r *Runner) Prolog(ctx context.Context, env Env, arrays []string) error {
	if env.Node == "" {
		return fmt.Errorf("%w: SLURMD_NODENAME is not set (run from slurmd, or pass --node)", ErrPrologRefused)
	}
	tier0, api := r.Config.Node(env.Node)
	if len(arrays) == 0 {
		arrays = ArraysFromComment(env.Comment)
	}
	hctx, cancel := context.WithTimeout(ctx, r.Config.HTTPTimeout)
	rep, err := health.Fetch(hctx, r.HTTP, api)
	cancel()
	var problems []string
	if err != nil {
		r.Log.Warn("prolog: tier0 daemon unreachable", "node", env.Node, "job", env.JobID, "err", err)
		problems = append(problems, "daemon down")
	} else {
		problems = append(problems, rep.Failures()...)
		if rep.Node != tier0 {
			problems = append(problems, fmt.Sprintf("daemon at %s is node %s, expected %s", api, rep.Node, tier0))
		}
		switch {
		case len(arrays) > 0:
			problems = append(problems, rep.ArrayProblems(arrays)...)
		case r.Config.PrologArrays == "all":
			problems = append(problems, rep.ArrayProblems(nil)...)
		}
	}
	if len(problems) > 0 {
		reason := slurm.Tier0Reason(fmt.Sprintf("prolog job %s: %s", env.JobID, strings.Join(problems, "; ")))
		r.Log.Error("prolog: refusing job", "node", env.Node, "tier0_node", tier0, "job", env.JobID, "reason", reason)
		if *r.Config.PrologDrain {
			r.drainUnlessHeld(ctx, env.Node, reason)
		}
		return fmt.Errorf("%w: %s", ErrPrologRefused, reason)
	}
	if env.JobID != "" {
		if err := r.saveStart(env); err != nil {
			r.Log.Warn("prolog: job storage figures will be missing", "node", env.Node, "job", env.JobID, "err", err)
		}
	}
	r.Log.Info("prolog: storage usable", "node", env.Node, "tier0_node", tier0, "job", env.JobID, "arrays", arrays)
	return nil
}

// drainUnlessHeld drains node with reason unless someone else holds it.
func (r *Runner) drainUnlessHeld(ctx context.Context, node, reason string) {
	n, err := r.Slurm.ShowNode(ctx, node)
	if err != nil {
		r.Log.Warn("cannot read node state; not draining", "node", node, "err", err)
		return
	}
	if n.Unavailable() && !slurm.IsTier0Reason(n.Reason) {
		r.Log.Info("node held by someone else; not draining", "node", node, "state", n.State, "reason", n.Reason)
		return
	}
	if err := r.Slurm.Drain(ctx, node, reason); err != nil {
		r.Log.Warn("drain failed", "node", node, "err", err)
	}
}

func (r *Runner) nodeDir(node string) string { return filepath.Join(r.Config.StateDir, node) }

func (r *Runner) startPath(env Env) string {
	return filepath.Join(r.nodeDir(env.Node), "job-"+safeName(env.JobID)+".json")
}

func safeName(s string) string {
	return strings.Map(func(c rune) rune {
		if c == '/' || c == 0 || c == '.' {
			return '_'
		}
		return c
	}, s)
}

func (r *Runner) saveStart(env Env) error {
	snap, err := diskstat.Take(r.Config.SysBlock, r.Config.NQNPrefix, r.Now())
	if err != nil {
		return err
	}
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.nodeDir(env.Node), 0o755); err != nil {
		return err
	}
	return writeAtomic(r.startPath(env), b)
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// JobRecord is one line of the job log.
type JobRecord struct {
	Time      time.Time `json:"time"`
	Node      string    `json:"node"`
	Tier0Node string    `json:"tier0_node"`
	JobID     string    `json:"job_id"`
	User      string    `json:"user,omitempty"`
	diskstat.Usage
	Complete bool     `json:"complete"`
	Warnings []string `json:"warnings,omitempty"`
}

// Epilog records the job's storage figures on this node: the I/O counter
// deltas of tier0's namespaces since the Prolog's snapshot, appended as a
// JSON line to Config.JobLog and added to the totals in
// Config.MetricsDir/<node>.prom. It never fails the job: problems are
// logged, and the returned error is for the log only.
func (r *Runner) Epilog(ctx context.Context, env Env) (JobRecord, error) {
	tier0, _ := r.Config.Node(env.Node)
	rec := JobRecord{Time: r.Now(), Node: env.Node, Tier0Node: tier0, JobID: env.JobID, User: env.User}
	if env.Node == "" || env.JobID == "" {
		return rec, errors.New("epilog: SLURMD_NODENAME or SLURM_JOB_ID not set; nothing recorded")
	}
	var errs []error
	var start diskstat.Snapshot
	b, err := os.ReadFile(r.startPath(env))
	if err == nil {
		err = json.Unmarshal(b, &start)
	}
	end, endErr := diskstat.Take(r.Config.SysBlock, r.Config.NQNPrefix, rec.Time)
	switch {
	case err != nil:
		rec.Warnings = append(rec.Warnings, "no start snapshot from the prolog: "+err.Error())
	case endErr != nil:
		rec.Warnings = append(rec.Warnings, "reading counters: "+endErr.Error())
	default:
		var warn []string
		rec.Usage, warn = diskstat.Delta(start, end)
		rec.Warnings = append(rec.Warnings, warn...)
		rec.Complete = len(warn) == 0
	}
	if err := r.record(rec); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(r.startPath(env)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	r.Log.Info("epilog: job storage figures", "node", env.Node, "job", env.JobID,
		"read_bytes", rec.ReadBytes, "write_bytes", rec.WriteBytes, "read_ios", rec.ReadIOs, "write_ios", rec.WriteIOs, "warnings", rec.Warnings)
	return rec, errors.Join(errs...)
}

// totals are the per-node counters behind the metrics file.
type totals struct {
	Jobs       uint64    `json:"jobs"`
	ReadBytes  uint64    `json:"read_bytes"`
	WriteBytes uint64    `json:"write_bytes"`
	ReadIOs    uint64    `json:"read_ios"`
	WriteIOs   uint64    `json:"write_ios"`
	Last       JobRecord `json:"last"`
}

// record appends rec to the job log and updates the totals and the metrics
// file, under a per-node lock (several epilogs may run at once).
func (r *Runner) record(rec JobRecord) error {
	dir := r.nodeDir(rec.Node)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := appendLine(r.Config.JobLog, line); err != nil {
		return fmt.Errorf("job log: %w", err)
	}
	var t totals
	tp := filepath.Join(dir, "totals.json")
	if b, err := os.ReadFile(tp); err == nil {
		if err := json.Unmarshal(b, &t); err != nil {
			r.Log.Warn("epilog: totals file unreadable; starting again from zero", "path", tp, "err", err)
			t = totals{}
		}
	}
	t.Jobs++
	t.ReadBytes += rec.ReadBytes
	t.WriteBytes += rec.WriteBytes
	t.ReadIOs += rec.ReadIOs
	t.WriteIOs += rec.WriteIOs
	t.Last = rec
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if err := writeAtomic(tp, b); err != nil {
		return err
	}
	if err := os.MkdirAll(r.Config.MetricsDir, 0o755); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(r.Config.MetricsDir, safeName(rec.Node)+".prom"), []byte(metricsText(t)))
}

func appendLine(path string, line []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func metricsText(t totals) string {
	var b strings.Builder
	l := fmt.Sprintf(`node=%q,tier0_node=%q`, t.Last.Node, t.Last.Tier0Node)
	counter := func(name, help string, v uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s{%s} %d\n", name, help, name, name, l, v)
	}
	counter("tier0_slurm_jobs_total", "Jobs whose tier0 storage figures the Epilog recorded on this node.", t.Jobs)
	counter("tier0_slurm_job_read_bytes_total", "Bytes read from tier0 namespaces on this node during jobs.", t.ReadBytes)
	counter("tier0_slurm_job_write_bytes_total", "Bytes written to tier0 namespaces on this node during jobs.", t.WriteBytes)
	counter("tier0_slurm_job_read_ios_total", "Read I/Os on tier0 namespaces on this node during jobs.", t.ReadIOs)
	counter("tier0_slurm_job_write_ios_total", "Write I/Os on tier0 namespaces on this node during jobs.", t.WriteIOs)
	jl := fmt.Sprintf(`%s,job=%q`, l, t.Last.JobID)
	gauge := func(name, help string, v any) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s{%s} %v\n", name, help, name, name, jl, v)
	}
	gauge("tier0_slurm_last_job_read_bytes", "Bytes the last job read from tier0 namespaces on this node.", t.Last.ReadBytes)
	gauge("tier0_slurm_last_job_write_bytes", "Bytes the last job wrote to tier0 namespaces on this node.", t.Last.WriteBytes)
	gauge("tier0_slurm_last_job_seconds", "Seconds between the last job's Prolog and Epilog on this node.", t.Last.Seconds)
	return b.String()
}

// CheckResult is what HealthCheck saw and did.
type CheckResult struct {
	Node      string   `json:"node"`
	Tier0Node string   `json:"tier0_node"`
	Verdict   string   `json:"verdict"`
	Reasons   []string `json:"reasons,omitempty"`
	State     string   `json:"state"`
	Reason    string   `json:"slurm_reason,omitempty"`
	// Action is "drain", "resume" or "keep".
	Action string `json:"action"`
	Why    string `json:"why"`
}

// HealthCheck is HealthCheckProgram for Slurm node `node`: it drains the
// node with a "tier0:" reason when its storage role has failed (daemon
// down, fenced, lease lost, drives missing), keeps it drained while it is
// merely impaired (rebuild running, not redundant, an array unreachable),
// and resumes it once healthy, but only if the drain is tier0's. A node
// drained or down for any other reason is never touched. The error is
// non-nil when Slurm could not be asked or changed.
func (r *Runner) HealthCheck(ctx context.Context, node string) (CheckResult, error) {
	tier0, api := r.Config.Node(node)
	res := CheckResult{Node: node, Tier0Node: tier0, Action: "keep"}
	n, err := r.Slurm.ShowNode(ctx, node)
	if err != nil {
		return res, fmt.Errorf("healthcheck %s: reading slurm node: %w", node, err)
	}
	res.State, res.Reason = n.State, n.Reason
	hctx, cancel := context.WithTimeout(ctx, r.Config.HTTPTimeout)
	rep, ferr := health.Fetch(hctx, r.HTTP, api)
	cancel()
	if ferr != nil {
		r.Log.Warn("healthcheck: tier0 daemon unreachable", "node", node, "api", api, "err", ferr)
	}
	verdict, reasons := health.Judge(rep, ferr)
	if ferr == nil && rep.Node != tier0 {
		verdict, reasons = health.Failed, append(reasons, fmt.Sprintf("daemon at %s is node %s, expected %s", api, rep.Node, tier0))
	}
	res.Verdict, res.Reasons = verdict.String(), reasons
	ours := n.Unavailable() && slurm.IsTier0Reason(n.Reason)
	switch {
	case n.Unavailable() && !ours:
		res.Why = "held by someone else; tier0 leaves it alone"
	case verdict == health.Failed:
		reason := slurm.Tier0Reason(strings.Join(reasons, "; "))
		if ours && (n.Reason == reason || n.Down()) {
			res.Why = "already out of service for tier0"
			break
		}
		if err := r.Slurm.Drain(ctx, node, reason); err != nil {
			return res, fmt.Errorf("healthcheck %s: storage role failed (%s) but drain failed: %w", node, reason, err)
		}
		res.Action, res.Reason, res.Why = "drain", reason, "storage role failed"
	case verdict == health.Impaired:
		res.Why = "storage impaired; no change until healthy"
	case ours:
		if err := r.Slurm.Resume(ctx, node); err != nil && !errors.Is(err, slurm.ErrInvalidState) {
			return res, fmt.Errorf("healthcheck %s: healthy again but resume failed: %w", node, err)
		}
		res.Action, res.Why = "resume", "storage healthy again"
	default:
		res.Why = "healthy"
	}
	r.Log.Info("healthcheck", "node", node, "tier0_node", tier0, "verdict", res.Verdict, "reasons", reasons, "action", res.Action, "why", res.Why)
	return res, nil
}
