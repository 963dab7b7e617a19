package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Path is the health endpoint below the daemon's API base URL.
const Path = "/v1/node/health"

// ErrDaemonDown: the daemon did not answer, answered with an error status,
// or sent something that is not a health report. An unreachable daemon is a
// failed storage role.
var ErrDaemonDown = errors.New("tier0 daemon down")

// Array states as the daemon reports them.
const (
	StateOptimal    = "optimal"
	StateDegraded   = "degraded"
	StateRebuilding = "rebuilding"
	StateFailed     = "failed"
	StateOffline    = "offline"
)

// Report is the daemon's answer.
type Report struct {
	Node          string   `json:"node"`
	Daemon        string   `json:"daemon"`
	Fenced        bool     `json:"fenced"`
	Lease         string   `json:"lease"`
	DrivesMissing []string `json:"drives_missing"`
	Arrays        []Array  `json:"arrays"`
	RebuildActive bool     `json:"rebuild_active"`
	Redundant     bool     `json:"redundant"`
}

// Array is one array as seen from the reporting node.
type Array struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Owner string `json:"owner"`
	// PathUsable: I/O to the array from this node has a usable path.
	PathUsable bool `json:"path_usable"`
}

// Parse decodes a health report and checks that it has the fields every
// judgement needs.
func Parse(b []byte) (Report, error) {
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return Report{}, fmt.Errorf("health report is not JSON: %w", err)
	}
	if r.Node == "" || r.Daemon == "" || r.Lease == "" {
		return Report{}, fmt.Errorf("health report lacks node, daemon or lease (got node=%q daemon=%q lease=%q)", r.Node, r.Daemon, r.Lease)
	}
	for i, a := range r.Arrays {
		if a.Name == "" {
			return Report{}, fmt.Errorf("health report: array %d has no name", i)
		}
	}
	return r, nil
}

// Fetch gets the report from the daemon at api (for example
// "http://127.0.0.1:7480"). Any failure wraps ErrDaemonDown. hc may be nil
// (a client with timeout is used); ctx bounds the whole call.
func Fetch(ctx context.Context, hc *http.Client, api string) (Report, error) {
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	url := strings.TrimRight(api, "/") + Path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Report{}, fmt.Errorf("%w: bad API address %q: %v (expected http://host:port)", ErrDaemonDown, api, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Report{}, fmt.Errorf("%w: GET %s: %v", ErrDaemonDown, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Report{}, fmt.Errorf("%w: GET %s: reading body: %v", ErrDaemonDown, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Report{}, fmt.Errorf("%w: GET %s: status %s", ErrDaemonDown, url, resp.Status)
	}
	r, err := Parse(b)
	if err != nil {
		return Report{}, fmt.Errorf("%w: GET %s: %v", ErrDaemonDown, url, err)
	}
	return r, nil
}

// Failures lists why this node's storage role has failed; empty means it
// has not. A failed role (daemon not ok, fenced, lease not held, drives
// missing) is what HealthCheckProgram drains a node for.
func (r Report) Failures() []string {
	var f []string
	if r.Daemon != "ok" {
		f = append(f, "daemon "+r.Daemon)
	}
	if r.Fenced {
		f = append(f, "fenced")
	}
	if r.Lease != "held" {
		f = append(f, "lease "+r.Lease)
	}
	if len(r.DrivesMissing) > 0 {
		f = append(f, "drives missing "+strings.Join(r.DrivesMissing, ","))
	}
	return f
}

// ResumeBlockers lists what keeps a tier0-drained node from returning to
// service: any failure, a rebuild in progress, the cluster not redundant,
// an array without a usable path from here. Empty means resume.
func (r Report) ResumeBlockers() []string {
	b := r.Failures()
	if r.RebuildActive {
		b = append(b, "rebuild active")
	}
	if !r.Redundant {
		b = append(b, "not redundant")
	}
	return append(b, r.ArrayProblems(nil)...)
}

// ArrayProblems lists the arrays among names (all arrays when names is
// empty) that a job on this node cannot use: unknown, failed or offline, or
// without a usable path from this node.
func (r Report) ArrayProblems(names []string) []string {
	var p []string
	if len(names) == 0 {
		for _, a := range r.Arrays {
			names = append(names, a.Name)
		}
	}
	for _, n := range names {
		i := slices.IndexFunc(r.Arrays, func(a Array) bool { return a.Name == n })
		if i < 0 {
			p = append(p, fmt.Sprintf("array %s unknown to this node", n))
			continue
		}
		a := r.Arrays[i]
		switch {
		case a.State == StateFailed || a.State == StateOffline:
			p = append(p, fmt.Sprintf("array %s %s", a.Name, a.State))
		case !a.PathUsable:
			p = append(p, fmt.Sprintf("array %s has no usable path from this node", a.Name))
		}
	}
	return p
}

// Verdict is what HealthCheckProgram makes of a node's health.
type Verdict int

const (
	// Healthy: resume a tier0-drained node.
	Healthy Verdict = iota
	// Impaired: the role works but the node is not back to full health
	// (rebuilding, not redundant, an array unreachable): drain nothing,
	// resume nothing.
	Impaired
	// Failed: the storage role has failed: drain the node.
	Failed
)

func (v Verdict) String() string {
	return [...]string{"healthy", "impaired", "failed"}[v]
}

// Judge returns the verdict and its reasons for a fetch result: a fetch
// error is a failed role, reason "daemon down" (the caller logs the error;
// reasons stay short because they become Slurm drain reasons).
func Judge(r Report, fetchErr error) (Verdict, []string) {
	if fetchErr != nil {
		return Failed, []string{"daemon down"}
	}
	if f := r.Failures(); len(f) > 0 {
		return Failed, f
	}
	if b := r.ResumeBlockers(); len(b) > 0 {
		return Impaired, b
	}
	return Healthy, nil
}
