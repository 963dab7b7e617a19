package drain

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"tier0/daemon/slurm"
)

// Scontrol is what the Drainer needs from Slurm; *slurm.Client implements
// it. Methods may be called concurrently for different nodes.
type Scontrol interface {
	ShowNode(ctx context.Context, name string) (slurm.Node, error)
	Drain(ctx context.Context, name, reason string) error
	Down(ctx context.Context, name, reason string) error
	Resume(ctx context.Context, name string) error
}

// Action is what a policy does to a node.
type Action string

// Actions. ActionDown kills the node's running jobs (Slurm requeues batch
// jobs); ActionDrain lets them finish.
const (
	ActionNone  Action = "none"
	ActionDrain Action = "drain"
	ActionDown  Action = "down"
)

// ParseAction parses a policy value; allowed lists the accepted ones.
func ParseAction(s string, allowed ...Action) (Action, error) {
	for _, a := range allowed {
		if strings.EqualFold(s, string(a)) {
			return a, nil
		}
	}
	return "", fmt.Errorf("policy value %q: want one of %v", s, allowed)
}

// Policy are the knobs of the Drainer. Zero values take the defaults in
// brackets.
type Policy struct {
	// OnFailure is what DrainFailedNode does: drain, down or none [drain].
	OnFailure Action
	// ExtraArrays is what to do with a node that carries arrays besides its
	// own after a failover (it serves more I/O than planned): none or drain
	// [none]. A node drained for this is resumed when the arrays leave.
	ExtraArrays Action
	// ResumePoll is how often ResumeWhenRedundant asks whether the node is
	// redundant again [10s].
	ResumePoll time.Duration
	// RetryAfter is the pause before trying again a change that failed
	// because Slurm was unreachable [30s].
	RetryAfter time.Duration
	// OpTimeout bounds one change, scontrol retries included [60s].
	OpTimeout time.Duration
}

// Config configures a Drainer.
type Config struct {
	// Slurm runs the scontrol commands. Required.
	Slurm  Scontrol
	Policy Policy
	// Redundant reports whether a node and its arrays are redundant again
	// (healthy daemon, no rebuild running, every array redundant).
	// ResumeWhenRedundant resumes only once it says true. Nil means
	// "redundant as soon as asked".
	Redundant func(ctx context.Context, node string) (bool, error)
	// SlurmName maps a tier0 node name to its Slurm node name [same name].
	SlurmName func(node string) string
	// Logger [discard].
	Logger *slog.Logger
	// After is the clock used for polls and retry pauses [time.After].
	After func(time.Duration) <-chan time.Time
	// OnEvent, when set, is called (from a worker goroutine) after every
	// decision, so that the daemon can turn them into typed events/metrics.
	OnEvent func(Event)
}

// Event reports one decision of the Drainer.
type Event struct {
	Node      string // tier0 node name
	SlurmNode string
	// Op is "drain", "down" or "resume" when Slurm was changed, "keep" when
	// nothing needed changing or the node belongs to an administrator.
	Op     string
	Reason string // the drain reason, or why nothing was done
	Err    error  // set when the change failed (it will be retried)
}

// Drainer drains and resumes nodes in the background. Create it with New;
// its methods are safe for concurrent use.
type Drainer struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	nodes  map[string]*nodeState
	active int           // nodes with work pending
	idle   chan struct{} // closed when active drops to 0
}

type intent struct {
	failed      bool
	failReason  string
	extra       []string
	resume      bool // ResumeWhenRedundant pending
	resumeExtra bool // extra arrays left under the drain policy
	gen         uint64
}

type nodeState struct {
	in   intent
	busy bool
	wake chan struct{}
}

// New returns a running Drainer. Call Close to stop it.
func New(cfg Config) *Drainer {
	if cfg.Slurm == nil {
		panic("drain.New: Config.Slurm is nil")
	}
	p := &cfg.Policy
	if p.OnFailure == "" {
		p.OnFailure = ActionDrain
	}
	if p.ExtraArrays == "" {
		p.ExtraArrays = ActionNone
	}
	if p.ResumePoll <= 0 {
		p.ResumePoll = 10 * time.Second
	}
	if p.RetryAfter <= 0 {
		p.RetryAfter = 30 * time.Second
	}
	if p.OpTimeout <= 0 {
		p.OpTimeout = 60 * time.Second
	}
	if cfg.SlurmName == nil {
		cfg.SlurmName = func(n string) string { return n }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	ctx, cancel := context.WithCancel(context.Background())
	idle := make(chan struct{})
	close(idle)
	return &Drainer{cfg: cfg, ctx: ctx, cancel: cancel, nodes: map[string]*nodeState{}, idle: idle}
}

// DrainFailedNode asks that node (a tier0 node name) be taken out of
// Slurm's service because its storage role failed; reason says why and
// gets the "tier0:" prefix. What happens follows Policy.OnFailure. A node
// already drained or down by someone else is left as it is.
func (d *Drainer) DrainFailedNode(node, reason string) {
	d.update(node, func(in *intent) {
		in.failed, in.failReason, in.resume = true, reason, false
	})
}

// ResumeWhenRedundant clears the failure of node and resumes it in Slurm
// once Config.Redundant says it is redundant again, provided its drain is
// tier0's. A later DrainFailedNode cancels the wait.
func (d *Drainer) ResumeWhenRedundant(node string) {
	d.update(node, func(in *intent) {
		in.failed, in.failReason, in.resume = false, "", true
	})
}

// ExtraArrays tells the Drainer which arrays node carries besides its own
// (none: an empty list). Under Policy.ExtraArrays=drain a node with extras
// is drained, and resumed (if tier0 drained it) when they are gone.
func (d *Drainer) ExtraArrays(node string, arrays []string) {
	d.update(node, func(in *intent) {
		if len(in.extra) > 0 && len(arrays) == 0 && d.cfg.Policy.ExtraArrays == ActionDrain {
			in.resumeExtra = true
		}
		in.extra = append([]string(nil), arrays...)
	})
}

// Wait blocks until every request made so far has been applied (including
// a ResumeWhenRedundant still waiting for redundancy) or ctx ends.
func (d *Drainer) Wait(ctx context.Context) error {
	d.mu.Lock()
	idle := d.idle
	d.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for slurm drain/resume work: %w", ctx.Err())
	}
}

// Close stops the workers; pending work is abandoned.
func (d *Drainer) Close() {
	d.cancel()
	d.wg.Wait()
}

func (d *Drainer) update(node string, f func(*intent)) {
	d.mu.Lock()
	ns := d.nodes[node]
	if ns == nil {
		ns = &nodeState{wake: make(chan struct{}, 1)}
		d.nodes[node] = ns
		d.wg.Add(1)
		go d.worker(node, ns)
	}
	f(&ns.in)
	ns.in.gen++
	if !ns.busy {
		ns.busy = true
		if d.active == 0 {
			d.idle = make(chan struct{})
		}
		d.active++
	}
	d.mu.Unlock()
	select {
	case ns.wake <- struct{}{}:
	default:
	}
}

type outcome int

const (
	done       outcome = iota // the intent is applied
	superseded                // a newer intent arrived
	retry                     // failed; try again after RetryAfter
)

func (d *Drainer) worker(node string, ns *nodeState) {
	defer d.wg.Done()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-ns.wake:
		}
		for {
			d.mu.Lock()
			if !ns.busy {
				d.mu.Unlock()
				break
			}
			in := ns.in
			d.mu.Unlock()

			out := d.apply(node, ns, in)
			if d.ctx.Err() != nil {
				return
			}
			if out == retry {
				select {
				case <-d.ctx.Done():
					return
				case <-ns.wake:
				case <-d.cfg.After(d.cfg.Policy.RetryAfter):
				}
				continue
			}
			d.mu.Lock()
			if out == done && ns.in.gen == in.gen {
				ns.in.resume, ns.in.resumeExtra = false, false
				ns.busy = false
				d.active--
				if d.active == 0 {
					close(d.idle)
				}
			}
			d.mu.Unlock()
		}
	}
}

func (d *Drainer) apply(node string, ns *nodeState, in intent) outcome {
	p := d.cfg.Policy
	switch {
	case in.failed && p.OnFailure != ActionNone:
		return d.takeOut(node, p.OnFailure, slurm.Tier0Reason(in.failReason))
	case len(in.extra) > 0 && p.ExtraArrays == ActionDrain:
		return d.takeOut(node, ActionDrain, slurm.Tier0Reason("carries extra arrays "+strings.Join(in.extra, ",")))
	case in.resume:
		if out := d.waitRedundant(node, ns, in.gen); out != done {
			return out
		}
		return d.resume(node)
	case in.resumeExtra:
		return d.resume(node)
	}
	return done
}

// waitRedundant polls Config.Redundant until it says yes, the intent
// changes, or the Drainer closes.
func (d *Drainer) waitRedundant(node string, ns *nodeState, gen uint64) outcome {
	if d.cfg.Redundant == nil {
		return done
	}
	for {
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Policy.OpTimeout)
		ok, err := d.cfg.Redundant(ctx, node)
		cancel()
		if err != nil {
			d.cfg.Logger.Warn("slurm resume: redundancy check failed", "node", node, "err", err)
		}
		if ok && err == nil {
			return done
		}
		select {
		case <-d.ctx.Done():
			return superseded
		case <-ns.wake:
			d.mu.Lock()
			changed := ns.in.gen != gen
			d.mu.Unlock()
			if changed {
				return superseded
			}
		case <-d.cfg.After(d.cfg.Policy.ResumePoll):
		}
	}
}

func (d *Drainer) emit(e Event) {
	l := d.cfg.Logger.With("node", e.Node, "slurm_node", e.SlurmNode, "op", e.Op, "reason", e.Reason)
	if e.Err != nil {
		l.Warn("slurm node change failed; will retry", "err", e.Err)
	} else {
		l.Info("slurm node")
	}
	if d.cfg.OnEvent != nil {
		d.cfg.OnEvent(e)
	}
}

// takeOut drains or downs node with reason unless it already is, or an
// administrator holds it.
func (d *Drainer) takeOut(node string, a Action, reason string) outcome {
	sn := d.cfg.SlurmName(node)
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Policy.OpTimeout)
	defer cancel()
	n, err := d.cfg.Slurm.ShowNode(ctx, sn)
	if err != nil {
		d.emit(Event{Node: node, SlurmNode: sn, Op: string(a), Reason: reason, Err: err})
		return failOutcome(err)
	}
	switch {
	case n.Unavailable() && !slurm.IsTier0Reason(n.Reason):
		d.emit(Event{Node: node, SlurmNode: sn, Op: "keep", Reason: fmt.Sprintf("held by someone else (state %s, reason %q)", n.State, n.Reason)})
		return done
	case n.Reason == reason && ((a == ActionDrain && n.Drained()) || (a == ActionDown && n.Down())):
		d.emit(Event{Node: node, SlurmNode: sn, Op: "keep", Reason: "already " + string(a) + "ed: " + reason})
		return done
	}
	if a == ActionDown {
		err = d.cfg.Slurm.Down(ctx, sn, reason)
	} else {
		err = d.cfg.Slurm.Drain(ctx, sn, reason)
	}
	d.emit(Event{Node: node, SlurmNode: sn, Op: string(a), Reason: reason, Err: err})
	return failOutcome(err)
}

// resume returns node to service if tier0 took it out.
func (d *Drainer) resume(node string) outcome {
	sn := d.cfg.SlurmName(node)
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Policy.OpTimeout)
	defer cancel()
	n, err := d.cfg.Slurm.ShowNode(ctx, sn)
	if err != nil {
		d.emit(Event{Node: node, SlurmNode: sn, Op: "resume", Err: err})
		return failOutcome(err)
	}
	if !n.Unavailable() {
		d.emit(Event{Node: node, SlurmNode: sn, Op: "keep", Reason: "in service already (state " + n.State + ")"})
		return done
	}
	if !slurm.IsTier0Reason(n.Reason) {
		d.emit(Event{Node: node, SlurmNode: sn, Op: "keep", Reason: fmt.Sprintf("not resumed: held by someone else (reason %q)", n.Reason)})
		return done
	}
	err = d.cfg.Slurm.Resume(ctx, sn)
	if errors.Is(err, slurm.ErrInvalidState) {
		err = nil // resumed meanwhile
	}
	d.emit(Event{Node: node, SlurmNode: sn, Op: "resume", Reason: n.Reason, Err: err})
	return failOutcome(err)
}

// failOutcome: nil is done; errors that a retry cannot fix (unknown node,
// permission, no scontrol) are logged and dropped; the rest are retried.
func failOutcome(err error) outcome {
	switch {
	case err == nil:
		return done
	case errors.Is(err, slurm.ErrUnknownNode), errors.Is(err, slurm.ErrPermission),
		errors.Is(err, slurm.ErrNoScontrol), errors.Is(err, slurm.ErrInvalidState):
		return done
	}
	return retry
}
