package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Errors returned by Client, to be tested with errors.Is.
var (
	// ErrNoScontrol: the scontrol binary could not be run (missing path,
	// not executable). Not retried.
	ErrNoScontrol = errors.New("scontrol cannot be run")
	// ErrUnknownNode: Slurm does not know the node name. Not retried.
	ErrUnknownNode = errors.New("slurm does not know the node")
	// ErrInvalidState: the state change is not allowed now, for example a
	// resume of a node that is neither drained nor down. Not retried.
	ErrInvalidState = errors.New("slurm refused the node state change")
	// ErrPermission: scontrol ran as a user Slurm does not allow to update
	// nodes (it must run as root or SlurmUser). Not retried.
	ErrPermission = errors.New("slurm refused the request: permission denied")
	// ErrUnavailable: slurmctld did not answer in time (scontrol timed out
	// or could not reach it). Retried, then returned.
	ErrUnavailable = errors.New("slurmctld unavailable")
	// ErrFailed: scontrol failed for another reason (its message is in the
	// error text). Retried, then returned.
	ErrFailed = errors.New("scontrol failed")
)

// DefaultScontrol is where Debian's slurm-client installs scontrol. Slurm
// hooks run without PATH, so the client always uses an absolute path.
const DefaultScontrol = "/usr/bin/scontrol"

// Options configure a Client. Zero values take the defaults in brackets.
type Options struct {
	// Path of scontrol [DefaultScontrol].
	Path string
	// Conf, when set, is passed as SLURM_CONF (a cluster whose slurm.conf is
	// not in the default place; HealthCheckProgram gets no SLURM_CONF).
	Conf string
	// Timeout bounds one scontrol run [5s]; a hung run is killed.
	Timeout time.Duration
	// Attempts is how many times a retryable failure is tried [3].
	Attempts int
	// Backoff is the pause between attempts, doubled each time [500ms].
	Backoff time.Duration
	// Logger gets one line per failed attempt [discard].
	Logger *slog.Logger
}

// Client runs scontrol. It is safe for concurrent use.
type Client struct {
	o Options
}

// New returns a client with opts, defaults filled in.
func New(opts Options) *Client {
	if opts.Path == "" {
		opts.Path = DefaultScontrol
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Attempts <= 0 {
		opts.Attempts = 3
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 500 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Client{o: opts}
}

// ShowNode returns the state of one node. An unknown node is ErrUnknownNode.
func (c *Client) ShowNode(ctx context.Context, name string) (Node, error) {
	if err := checkName(name); err != nil {
		return Node{}, err
	}
	out, err := c.run(ctx, "show", "node", "-o", name)
	if err != nil {
		return Node{}, err
	}
	nodes, err := ParseShowNode(out)
	if err != nil {
		return Node{}, fmt.Errorf("%w: %v", ErrFailed, err)
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("node %q: %w (scontrol listed %d other nodes)", name, ErrUnknownNode, len(nodes))
}

// ShowNodes returns every node.
func (c *Client) ShowNodes(ctx context.Context) ([]Node, error) {
	out, err := c.run(ctx, "show", "node", "-o")
	if err != nil {
		return nil, err
	}
	nodes, err := ParseShowNode(out)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFailed, err)
	}
	return nodes, nil
}

// Drain sets the node to DRAIN with reason: running jobs finish, no new job
// starts. Slurm requires a non-empty reason.
func (c *Client) Drain(ctx context.Context, name, reason string) error {
	return c.update(ctx, name, "drain", reason)
}

// Down sets the node DOWN with reason: running jobs are killed (batch jobs
// requeued).
func (c *Client) Down(ctx context.Context, name, reason string) error {
	return c.update(ctx, name, "down", reason)
}

// Resume returns a drained or down node to service. On a node that is
// neither, Slurm answers ErrInvalidState.
func (c *Client) Resume(ctx context.Context, name string) error {
	return c.update(ctx, name, "resume", "")
}

func (c *Client) update(ctx context.Context, name, state, reason string) error {
	if err := checkName(name); err != nil {
		return err
	}
	args := []string{"update", "nodename=" + name, "state=" + state}
	if state != "resume" {
		reason = strings.Join(strings.Fields(reason), " ")
		if reason == "" {
			return fmt.Errorf("%s node %s: empty reason: Slurm requires one for drain and down", state, name)
		}
		args = append(args, "reason="+reason)
	}
	_, err := c.run(ctx, args...)
	if err != nil {
		return fmt.Errorf("%s node %s: %w", state, name, err)
	}
	return nil
}

func checkName(name string) error {
	if name == "" || strings.ContainsAny(name, " \t\n=") {
		return fmt.Errorf("node name %q: %w (expected one Slurm node name without spaces or '=')", name, ErrUnknownNode)
	}
	return nil
}

// run runs scontrol with args, retrying retryable failures.
func (c *Client) run(ctx context.Context, args ...string) (string, error) {
	var last error
	backoff := c.o.Backoff
	for attempt := 1; attempt <= c.o.Attempts; attempt++ {
		out, err := c.once(ctx, args)
		if err == nil {
			return out, nil
		}
		last = err
		if !retryable(err) || ctx.Err() != nil {
			return "", err
		}
		c.o.Logger.Warn("scontrol attempt failed", "args", strings.Join(args, " "), "attempt", attempt, "of", c.o.Attempts, "err", err)
		if attempt == c.o.Attempts {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("%w (gave up: %v)", last, ctx.Err())
		case <-t.C:
		}
		backoff *= 2
	}
	return "", fmt.Errorf("%w (after %d attempts)", last, c.o.Attempts)
}

func retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrFailed)
}

func (c *Client) once(ctx context.Context, args []string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.o.Path, args...)
	cmd.Env = append(os.Environ(), "PATH=/usr/sbin:/usr/bin:/sbin:/bin")
	if c.o.Conf != "" {
		cmd.Env = append(cmd.Env, "SLURM_CONF="+c.o.Conf)
	}
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err == nil {
		return stdout.String(), nil
	}
	msg := strings.TrimSpace(stderr.String() + " " + stdout.String())
	what := "scontrol " + strings.Join(args, " ")
	if ctx.Err() == context.DeadlineExceeded {
		return "", fmt.Errorf("%s: %w: no answer within %v (is slurmctld running and reachable?)", what, ErrUnavailable, c.o.Timeout)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return "", fmt.Errorf("%s: %w: %v (install slurm-client or set the scontrol path)", what, ErrNoScontrol, err)
	}
	return "", fmt.Errorf("%s: %w: %s", what, classify(msg), msg)
}

// classify maps scontrol's messages (Slurm 22.05) to the package errors.
func classify(msg string) error {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "invalid node name"), strings.Contains(m, "not found"):
		return ErrUnknownNode
	case strings.Contains(m, "invalid node state"):
		return ErrInvalidState
	case strings.Contains(m, "invalid user id"), strings.Contains(m, "permission denied"), strings.Contains(m, "access denied"):
		return ErrPermission
	case strings.Contains(m, "unable to contact"), strings.Contains(m, "connection refused"),
		strings.Contains(m, "timed out"), strings.Contains(m, "communication connection failure"),
		strings.Contains(m, "zero bytes were transmitted"):
		return ErrUnavailable
	}
	return ErrFailed
}
