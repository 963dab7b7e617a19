package validate

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"tier0/bench"
)

// Names of the checks, in the order the validation makes them. Every run
// reports every one of them: pass, fail, or not-run with the reason.
const (
	CheckRaw            = "raw drives bench"
	CheckClusterUp      = "cluster up"
	CheckFill           = "fill arrays with verify blocks"
	CheckBlock          = "block layer bench"
	CheckFrontend       = "frontend bench (healthy)"
	CheckMoved          = "failover: owned arrays moved complete"
	CheckDegraded       = "failover: other arrays degraded"
	CheckIOContinued    = "failover: I/O continued"
	CheckAckVerified    = "failover: acknowledged blocks verify"
	CheckFailoverTime   = "failover time recorded"
	CheckDegradedBench  = "frontend bench (one node lost)"
	CheckRestart        = "killed node restarted"
	CheckResync         = "resync/rebuild complete"
	CheckFailback       = "failback to home node"
	CheckRedundancy     = "redundancy restored"
	CheckFinalVerify    = "final verify of every array"
	CheckFS             = "file system through failover"
	CheckSlurm          = "slurm hooks"
	CheckGDS            = "gpudirect storage"
	checkInterruptedWhy = "interrupted before this step"
)

// AllChecks lists the check names in order.
var AllChecks = []string{
	CheckRaw, CheckClusterUp, CheckFill, CheckBlock, CheckFrontend,
	CheckMoved, CheckDegraded, CheckIOContinued, CheckAckVerified, CheckFailoverTime,
	CheckDegradedBench, CheckRestart, CheckResync, CheckFailback, CheckRedundancy,
	CheckFinalVerify, CheckFS, CheckSlurm, CheckGDS,
}

// FailoverChecks are the checks of the failover story: a node killed
// under verified load, the bench with it lost, its restart, resync and
// failback. A run in which they did not run has not validated the design.
var FailoverChecks = []string{CheckMoved, CheckDegraded, CheckIOContinued, CheckAckVerified, CheckFailoverTime, CheckDegradedBench, CheckRestart, CheckResync, CheckFailback}

// Reasons recorded on the failover checks when they are left out.
const (
	// SkippedFailoverWhy: --skip-failover; the run may still pass.
	SkippedFailoverWhy = "skipped (--skip-failover)"
	// NotValidatedWhy: an existing cluster without --allow-disruptive.
	NotValidatedWhy = "not validated: failover not run; on an existing cluster pass --allow-disruptive (validate kills the tier0d of --kill NODE, default B, and restarts it; --kill-command/--start-command when it runs elsewhere), or --skip-failover to leave the story out on purpose"
)

// NotValidated reports whether res lacks the failover story without it
// having been skipped on purpose, and why.
func NotValidated(res *bench.Results) (string, bool) {
	if res == nil {
		return "", false
	}
	for _, c := range res.Checks {
		if c.Status == bench.NotRun && slices.Contains(FailoverChecks, c.Name) && c.Reason != SkippedFailoverWhy {
			return fmt.Sprintf("failover not run (%s: %s)", c.Name, oneLine(c.Reason, 160)), true
		}
	}
	return "", false
}

// Sentinel errors of Run.
var (
	// ErrChecksFailed: the validation ran and at least one check failed
	// (Report.Results lists which).
	ErrChecksFailed = errors.New("validation failed")
	// ErrInterrupted: the run was cancelled (Ctrl-C, SIGTERM) before it
	// finished; what it had started was stopped and removed.
	ErrInterrupted = errors.New("validation interrupted")
	// ErrNotValidated: every check that ran passed, but the failover
	// story did not run (an existing cluster without --allow-disruptive or
	// --skip-failover, or a step before it could not be made).
	ErrNotValidated = errors.New("not validated")
	// ErrSetup: the validation could not start (bad options, no tier0d
	// binary, a busy port, a cluster that does not answer).
	ErrSetup = errors.New("validation could not run")
)

// Exit codes of `tier0 validate`.
const (
	ExitPass  = 0 // every check passed or did not apply
	ExitFail  = 1 // a check failed
	ExitSetup = 2 // the validation could not run
	// ExitNotValidated: no check failed, but the failover story did not
	// run (see NotValidated); the run proves less than the design claims.
	ExitNotValidated = 3
	ExitInterrupted  = 130 // cancelled by a signal
)

// Failed returns the failed checks of res.
func Failed(res *bench.Results) []bench.Check {
	if res == nil {
		return nil
	}
	var out []bench.Check
	for _, c := range res.Checks {
		if c.Status == bench.Fail {
			out = append(out, c)
		}
	}
	return out
}

// ExitCode maps Run's outcome to the process exit code: interrupted wins,
// then a failed check, then the failover story not run (not validated),
// then any other error (the run could not be made).
func ExitCode(res *bench.Results, err error) int {
	_, notValidated := NotValidated(res)
	switch {
	case errors.Is(err, ErrInterrupted):
		return ExitInterrupted
	case len(Failed(res)) > 0 || errors.Is(err, ErrChecksFailed):
		return ExitFail
	case errors.Is(err, ErrNotValidated):
		return ExitNotValidated
	case err != nil:
		return ExitSetup
	case notValidated:
		return ExitNotValidated
	}
	return ExitPass
}

// complete adds a not-run check, with reason, for every name in AllChecks
// that res does not have yet, and orders the checks as AllChecks does
// (unknown names last).
func complete(res *bench.Results, reason string) {
	have := map[string]bench.Check{}
	for _, c := range res.Checks {
		have[c.Name] = c
	}
	var out []bench.Check
	for _, name := range AllChecks {
		if c, ok := have[name]; ok {
			out = append(out, c)
			delete(have, name)
			continue
		}
		out = append(out, bench.Check{Name: name, Status: bench.NotRun, Reason: reason})
	}
	for _, c := range res.Checks {
		if _, ok := have[c.Name]; ok {
			out = append(out, c)
		}
	}
	res.Checks = out
}

// statusWord is the checklist's fixed-width status.
func statusWord(s bench.CheckStatus) string {
	switch s {
	case bench.Pass:
		return "PASS   "
	case bench.Fail:
		return "FAIL   "
	}
	return "NOT RUN"
}

// checkLine formats one check for the terminal.
func checkLine(c bench.Check) string {
	s := fmt.Sprintf("[%s] %s", statusWord(c.Status), c.Name)
	if c.Reason != "" {
		s += ": " + c.Reason
	}
	return s
}

// WriteChecklist prints every check of res, one per line, and a count.
func WriteChecklist(w io.Writer, res *bench.Results) error {
	var pass, fail, notRun int
	var b strings.Builder
	b.WriteString("CHECKLIST\n")
	for _, c := range res.Checks {
		switch c.Status {
		case bench.Pass:
			pass++
		case bench.Fail:
			fail++
		default:
			notRun++
		}
		b.WriteString(checkLine(c) + "\n")
	}
	verdict := "PASSED"
	why, notValidated := NotValidated(res)
	switch {
	case fail > 0:
		verdict = "FAILED"
	case notValidated:
		verdict = "NOT VALIDATED"
	}
	fmt.Fprintf(&b, "%s: %d passed, %d failed, %d not run\n", verdict, pass, fail, notRun)
	if notValidated && fail == 0 {
		fmt.Fprintf(&b, "not validated: %s\n", why)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
