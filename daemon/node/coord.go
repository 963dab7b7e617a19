package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"tier0/daemon/clock"
	"tier0/daemon/cluster"
	"tier0/daemon/store"
)

// coordinatorLoop campaigns for the coordinator role and, while it holds
// it, runs the failover state machine.
func (n *Node) coordinatorLoop(ctx context.Context) error {
	electionLoop(ctx, n.log, n.coordinatorTerm, func(ctx context.Context, d time.Duration) bool { return sleepCtx(ctx, n.clk(), d) }, n.clk().Now)
	return nil
}

// errNoSession: the store gave no session to campaign with.
var errNoSession = errors.New("no store session")

// The coordinator's election retries back off from coordRetryMin,
// doubling, to coordRetryMax.
const (
	coordRetryMin = 250 * time.Millisecond
	coordRetryMax = 10 * time.Second
)

// electionLoop runs terms (a campaign, then a term as coordinator) until
// ctx ends. A term that failed (no session, the campaign refused, the
// coordinator stopped with an error) or ended soon after it began (the
// session was lost at once) is followed by a doubling wait, so a store
// that is unreachable or thrashing is not hammered; a term that lasted
// coordRetryMax or more resets the wait.
func electionLoop(ctx context.Context, log *slog.Logger, term func(context.Context) error, wait func(context.Context, time.Duration) bool, now func() time.Time) {
	next := coordRetryMin
	for ctx.Err() == nil {
		start := now()
		err := term(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil && now().Sub(start) >= coordRetryMax {
			next = coordRetryMin
			continue
		}
		log.Debug("coordinator election: retrying", "after", next, "err", err)
		if !wait(ctx, next) {
			return
		}
		next = min(2*next, coordRetryMax)
	}
}

// sleepCtx waits d on clk or until ctx ends; it reports whether d passed.
func sleepCtx(ctx context.Context, clk clock.Clock, d time.Duration) bool {
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// coordinatorTerm campaigns once and, when elected, coordinates until the
// session or ctx ends. It returns why the term failed, nil when it ended
// normally.
func (n *Node) coordinatorTerm(ctx context.Context) error {
	ttl := max(1, int(n.cfg.Policies.LeaseTTL.D().Seconds()))
	sess, err := concurrency.NewSession(n.st.Client(), concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("%w: %v", errNoSession, err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, n.key("coordinator"))
	if err := el.Campaign(ctx, n.me.Name); err != nil {
		return fmt.Errorf("campaign for coordinator: %w", err)
	}
	n.log.Info("coordinator elected")
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-sess.Done():
		case <-cctx.Done():
		}
		cancel()
	}()
	n.mu.Lock()
	n.coord = true
	n.lastView = "" // a new term publishes its view at once
	n.mu.Unlock()
	err = n.coordinate(withViewGuard(cctx, store.ElectionGuard(el.Key(), el.Rev())))
	if err != nil && cctx.Err() == nil {
		n.log.Warn("coordinator stopped", "err", err)
	} else {
		err = nil
	}
	cancel()
	n.mu.Lock()
	n.coord = false
	n.mu.Unlock()
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	_ = el.Resign(rctx)
	rcancel()
	return err
}

// coordinate rebuilds the state machine from the store and drives it.
func (n *Node) coordinate(ctx context.Context) error {
	policy := cluster.FailbackPolicy(n.cfg.Policies.Failback)
	m, err := cluster.New(cluster.Config{
		ReleaseTimeoutTicks: int64(10 * time.Second / n.opts.Tick),
		BackoffMaxTicks:     max(1, int64(30*time.Second/n.opts.Tick)),
		Failback:            policy,
	}, n.log.With("layer", "cluster"))
	if err != nil {
		return err
	}
	// A cluster that never had an owner is booting: give every node a
	// moment to come up before deciding who is missing.
	if !n.anyOwnership(ctx) {
		deadline := n.clk().Now().Add(30 * time.Second)
		for n.clk().Now().Before(deadline) {
			alive, _ := n.st.Nodes(ctx)
			if len(alive) == len(n.cfg.Nodes) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-n.clk().After(300 * time.Millisecond):
			}
		}
	}
	// The snapshot of live nodes and the watch that follows it must meet
	// at one revision: a lease that expires between the two (the old
	// coordinator's own, when it was killed) would otherwise never be seen.
	alive, rev, err := n.liveNodes(ctx)
	if err != nil {
		return err
	}
	step := func(ev cluster.Event) {
		if err := m.Step(ev); err != nil {
			n.log.Warn("state machine refused an event", "event", fmt.Sprintf("%T", ev), "err", err)
		}
	}
	evs, err := n.restoreEvents(ctx, alive)
	if err != nil {
		return err
	}
	if err := m.Restore(evs); err != nil {
		return fmt.Errorf("rebuild the state machine from the store: %w", err)
	}
	cour := &courier{send: n.sendTask, local: n.performLocal, log: n.log}
	cour.dispatch(ctx, m)

	// Every tick, nodes with a live lease count as heartbeats, so that the
	// machine knows when each lost node was last seen (failover durations
	// are measured from there).
	live := map[string]bool{}
	for name := range alive {
		live[name] = true
	}
	nodes := n.st.WatchNodes(ctx, rev+1)
	reports := n.watchReports(ctx)
	tick := n.clk().NewTicker(n.opts.Tick)
	defer tick.Stop()
	refreshed := n.clk().Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ne, ok := <-nodes:
			if !ok {
				return fmt.Errorf("node watch closed")
			}
			if ne.Alive {
				live[ne.Node] = true
				step(cluster.NodeReturned{Node: ne.Node, Started: unixNano(ne.Info.Started), Fences: ne.Info.Fences})
			} else {
				delete(live, ne.Node)
				step(cluster.LeaseExpired{Node: ne.Node})
			}
		case r, ok := <-reports:
			if !ok {
				return fmt.Errorf("report watch closed")
			}
			ev, err := r.event()
			if err != nil {
				n.log.Warn("bad report", "err", err)
				continue
			}
			step(ev)
		case <-tick.C():
			n.syncMachineOnline(m, step) // arrays created or deleted online
			m.Tick()
			for name := range live {
				step(cluster.Heartbeat{Node: name})
			}
			if now := n.clk().Now(); now.Sub(refreshed) >= viewRefresh {
				refreshed = now
				n.mu.Lock()
				n.lastView = "" // written again below, changed or not
				n.mu.Unlock()
			}
		}
		cour.dispatch(ctx, m)
		n.publishView(ctx, m)
	}
}

// liveNodes lists the nodes with a live lease and the store revision of
// that answer.
//
// It is read a lease TTL after the call (store.SettledNodes): an etcd
// leader that was frozen and thaws can revoke every lease at once, the
// coordinator's session included, and the nodes register again within
// that time (docs/CONTROL-PLANE.md, "Leases"); a snapshot taken at once
// would count them gone. A candidate whose own election key was revoked
// may return from Campaign as if elected; its session ends within that
// wait, cancelling the term before it restores anything.
func (n *Node) liveNodes(ctx context.Context) (map[string]store.NodeInfo, int64, error) {
	return n.st.SettledNodes(ctx)
}

// restoreEvents reads what the store records — nodes and their leases,
// arrays, ownership, what each owner reports serving, member states of the
// last published view, drains — as events for Machine.Restore.
func (n *Node) restoreEvents(ctx context.Context, alive map[string]store.NodeInfo) ([]cluster.Event, error) {
	var evs []cluster.Event
	for _, c := range n.cfg.Nodes {
		var drives []string
		for _, d := range c.Drives {
			drives = append(drives, d.Name)
		}
		evs = append(evs, cluster.NodeJoined{Node: c.Name, Domain: c.Domain, Drives: drives})
	}
	managed := n.managedArrays() // the site file's, then the online ones
	for _, a := range managed {
		ev, err := n.arrayDefined(a)
		if err != nil {
			n.log.Warn("array not managed by the failover machine", "array", a.Name, "err", err)
			continue
		}
		evs = append(evs, ev)
	}
	var last clusterView
	_, _ = n.st.Get(ctx, store.Observed, "cluster", "view", &last)
	for _, a := range managed {
		if _, err := cluster.ParseLevel(a.Level); err != nil {
			continue
		}
		own, err := n.st.Ownership(ctx, a.Name)
		if err != nil {
			return nil, err
		}
		if own.Epoch == 0 {
			continue
		}
		ev := cluster.ArrayObserved{Array: a.Name, Owner: own.Owner, Epoch: own.Epoch, Members: map[string]cluster.MemberState{}}
		var obs observedArray
		info, up := alive[own.Owner]
		if _, err := n.st.Get(ctx, store.Observed, "arrays", a.Name, &obs); err == nil {
			ev.Serving = up && obs.Serving && obs.Owner == own.Owner && obs.Epoch == own.Epoch &&
				n.recordCurrent(obs, info)
		}
		// Claimed under the registration alive now: a takeover that the
		// previous coordinator ordered may still be under way (a thawed
		// etcd leader's revoke can end a coordinator's term mid-move); the
		// machine resumes it at this epoch instead of taking the array
		// again under the next (campaign freeze-etcd-voter: epoch 1 -> 4).
		ev.Claimed = up && info.Revision > 0 && own.Revision > info.Revision

		for _, av := range last.Arrays {
			if av.Name == a.Name {
				for _, mv := range av.Members {
					ev.Members[mv.Drive] = mv.State
				}
			}
		}
		evs = append(evs, ev)
	}
	for _, c := range n.cfg.Nodes {
		if _, ok := alive[c.Name]; !ok {
			evs = append(evs, cluster.LeaseExpired{Node: c.Name})
		}
	}
	if drains, err := n.st.List(ctx, store.Desired, "drain"); err == nil {
		for name := range drains {
			evs = append(evs, cluster.DrainRequested{Node: name})
		}
	}
	return evs, nil
}

// recordCurrent reports whether an owner's observed record still tells its
// state: it is younger than a lease TTL (3 s at least), or it was written
// by the owner's registration alive now (same Started, same Fences: the
// process never restarted or fenced itself since, so it still serves what
// it said) and is younger than observedStaleAfter. The second rule keeps
// a coordinator that restores its machine — a TTL after its term began,
// with a frozen etcd member holding the owners' writes back — from taking
// healthy owners' arrays for unserved and re-fencing them at home.
func (n *Node) recordCurrent(obs observedArray, owner store.NodeInfo) bool {
	age := n.clk().Since(obs.Time)
	if age < max(3*time.Second, n.cfg.Policies.LeaseTTL.D()) {
		return true
	}
	return obs.Started != 0 && obs.Started == unixNano(owner.Started) && obs.Fences == owner.Fences && age < observedStaleAfter
}

func (n *Node) anyOwnership(ctx context.Context) bool {
	for _, a := range n.cfg.Arrays {
		if own, err := n.st.Ownership(ctx, a.Name); err == nil && own.Epoch > 0 {
			return true
		}
	}
	return false
}

// courier delivers the machine's actions: those of the coordinator itself
// (events, Slurm) through local, the others through send to the task queue
// of their performer.
//
// An intent that cannot be handed over (the store refused the write) is
// never dropped silently. A step the machine waits on — Fence, Assemble,
// Resync, Rebuild — is reported back as failed (FenceFailed,
// AssembleFailed, RepairFailed with "not delivered"), so the machine
// retries it with its backoff and says why; a Release is left to the
// machine's release timeout. An idempotent intent — SetANA (the performer
// checks the epoch), Export, SelfFence — is kept and sent again, before
// anything newer, at the next dispatch (every tick).
type courier struct {
	send   func(context.Context, cluster.Action) error
	local  func(context.Context, cluster.Action)
	log    *slog.Logger
	resend []cluster.Action
}

// maxResend bounds the intents kept for sending again; the oldest go first.
const maxResend = 1024

// dispatch performs the coordinator's own actions and hands the others to
// their nodes, in the order the machine gave them.
func (c *courier) dispatch(ctx context.Context, m *cluster.Machine) {
	pending := c.resend
	c.resend = nil
	for _, a := range pending {
		if err := c.send(ctx, a); err != nil {
			c.keep(a)
		}
	}
	// A failure reported to the machine makes it decide again (another
	// candidate, or nothing until its backoff ends): a few rounds at most.
	for round := 0; round < 8; round++ {
		acts := m.Ready()
		if len(acts) == 0 {
			return
		}
		for _, a := range acts {
			c.log.Debug("action", "action", a.String())
			if a.Performer() == "" {
				c.local(ctx, a)
				continue
			}
			err := c.send(ctx, a)
			if err == nil {
				continue
			}
			c.log.Warn("task not delivered", "action", a.String(), "err", err)
			reason := fmt.Sprintf("task not delivered to %s: %v", a.Performer(), err)
			var ev cluster.Event
			switch a := a.(type) {
			case cluster.Fence:
				ev = cluster.FenceFailed{Array: a.Array, Node: a.Node, Epoch: a.NewEpoch, Reason: reason}
			case cluster.Assemble:
				ev = cluster.AssembleFailed{Array: a.Array, Node: a.Node, Epoch: a.Epoch, Reason: reason}
			case cluster.Resync:
				ev = cluster.RepairFailed{Array: a.Array, Member: a.Member, Epoch: a.Epoch, Reason: reason}
			case cluster.Rebuild:
				ev = cluster.RepairFailed{Array: a.Array, Member: a.Member, Epoch: a.Epoch, Reason: reason}
			case cluster.Release:
				// the machine abandons the move after its release timeout
			default:
				c.keep(a)
			}
			if ev != nil {
				if err := m.Step(ev); err != nil {
					c.log.Warn("state machine refused an event", "event", fmt.Sprintf("%T", ev), "err", err)
				}
			}
		}
	}
}

func (c *courier) keep(a cluster.Action) {
	if len(c.resend) >= maxResend {
		c.log.Warn("dropping an undelivered task: too many waiting", "action", c.resend[0].String())
		c.resend = c.resend[1:]
	}
	c.resend = append(c.resend, a)
}

// performLocal performs an action addressed to the coordinator.
func (n *Node) performLocal(ctx context.Context, a cluster.Action) {
	switch a := a.(type) {
	case cluster.RecordEvent:
		ev := store.Event{Kind: a.Kind, Array: a.Array, Node: a.Node, From: a.From, To: a.To, Epoch: a.Epoch, Message: a.Message}
		if a.Kind == "failover" || a.Kind == "handoff" {
			d := time.Duration(a.Ticks) * n.opts.Tick
			if a.Kind == "failover" && a.From != "" && a.From != a.To {
				// The machine counts from the last tick the old owner's
				// lease was alive; it may have died up to a lease TTL
				// before that. Count from there: an upper bound.
				d += n.cfg.Policies.LeaseTTL.D()
				ev.Message = strings.TrimSpace(ev.Message + " (duration counted from one lease TTL before the lease expired)")
			}
			ev.Duration = d.Seconds()
		}
		n.metrics.ObserveRecord(a, n.opts.Tick)
		if _, err := n.st.AppendEvent(ctx, ev); err != nil {
			n.log.Warn("event log append failed", "err", err)
		}
		n.log.Info("cluster event", "event", a.String())
	case cluster.SlurmDrain:
		n.slurmDrain(a.Node, a.Reason)
	case cluster.SlurmResume:
		n.slurmResume(a.Node, a.Reason)
	}
}

// clusterView is the coordinator's picture, published for the API and the
// CLI.
type clusterView struct {
	Coordinator string              `json:"coordinator"`
	Time        time.Time           `json:"time"`
	Nodes       []cluster.NodeView  `json:"nodes"`
	Arrays      []cluster.ArrayView `json:"arrays"`
}

// publishView writes the machine's view for the API (publishViewTo).
//
// It is written under the term's election (withViewGuard): a coordinator
// superseded while its write was in flight (frozen past its session, the
// store applying its request late) must not replace the view of the one
// that took over, which publishes only when its decisions change
// (nemesis seed 2: "C2=stale" seen by every node for 120 s).
func (n *Node) publishView(ctx context.Context, m *cluster.Machine) {
	guard, _ := ctx.Value(viewGuardKey{}).(store.Guard)
	n.publishViewTo(m, func(v clusterView) error {
		var err error
		if gp, ok := n.st.(guardedPutter); ok && guard != nil {
			_, err = gp.PutGuarded(ctx, guard, store.Observed, "cluster", "view", v)
		} else {
			_, err = n.st.Put(ctx, store.Observed, "cluster", "view", v) // a store without elections (the simulation's)
		}
		if errors.Is(err, store.ErrNotLeader) {
			n.log.Info("view not published: this node is not the coordinator any more", "err", err)
		}
		return err
	})
}

// publishViewTo publishes the machine's view through put.
func (n *Node) publishViewTo(m *cluster.Machine, put func(clusterView) error) {
	v := clusterView{Coordinator: n.me.Name, Time: n.clk().Now(), Nodes: m.Nodes(), Arrays: m.Arrays()}
	// Publish only when the decisions changed, not for every tick's time.
	b, _ := json.Marshal([]any{v.Nodes, v.Arrays})
	n.mu.Lock()
	same := string(b) == n.lastView
	n.mu.Unlock()
	if same {
		return
	}
	if err := put(v); err != nil {
		// Not recorded as published: the next tick tries again.
		n.log.Debug("view not published", "err", err)
		return
	}
	n.mu.Lock()
	n.lastView = string(b)
	n.mu.Unlock()
}

// watchReports streams reports to the coordinator, deleting each.
func (n *Node) watchReports(ctx context.Context) <-chan report {
	out := make(chan report, 64)
	prefix := n.key("reports") + "/"
	cli := n.st.Client()
	go func() {
		defer close(out)
		handle := func(key string, v []byte) bool {
			var r report
			if err := json.Unmarshal(v, &r); err == nil {
				select {
				case out <- r:
				case <-ctx.Done():
					return false
				}
			}
			_, _ = cli.Delete(ctx, key)
			return true
		}
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return
		}
		for _, kv := range resp.Kvs {
			if !handle(string(kv.Key), kv.Value) {
				return
			}
		}
		o := store.WatchOptions{Rev: resp.Header.Revision + 1, Any: true}
		for kv := range store.WatchPrefix(ctx, cli, prefix, o, store.Puts) {
			if !handle(kv.Key, kv.Value) {
				return
			}
		}
	}()
	return out
}

// viewGuardKey carries, in a coordinator term's context, the Guard of its
// election: the view (publishView) and the tasks (sendTask) are written
// under it.
type viewGuardKey struct{}

// withViewGuard returns ctx carrying g for publishView.
func withViewGuard(ctx context.Context, g store.Guard) context.Context {
	return context.WithValue(ctx, viewGuardKey{}, g)
}

// guardedPutter is the etcd store's write under a Guard.
type guardedPutter interface {
	PutGuarded(ctx context.Context, guard store.Guard, sec store.Section, kind, name string, v any) (int64, error)
}

// viewRefresh: the coordinator writes its view again at least this often
// even when its decisions did not change, so that a view written by
// anything else (a superseded coordinator's late write, say) does not
// stand.
const viewRefresh = 10 * time.Second
