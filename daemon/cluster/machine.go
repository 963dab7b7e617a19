package cluster

import (
	"fmt"
	"log/slog"
)

// Machine is the failover state machine. It is not safe for concurrent
// use: one goroutine calls Step, Tick and Ready.
type Machine struct {
	cfg        Config
	log        *slog.Logger
	now        int64
	nodes      map[string]*node
	nodeOrder  []string
	drives     map[string]string
	arrays     map[string]*array
	arrayOrder []string
	out        []Action
}

// New returns an empty machine at tick 0. log may be nil (discard).
func New(cfg Config, log *slog.Logger) (*Machine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Machine{
		cfg:    cfg,
		log:    log,
		nodes:  map[string]*node{},
		drives: map[string]string{},
		arrays: map[string]*array{},
	}, nil
}

// Now is the current tick.
func (m *Machine) Now() int64 { return m.now }

// Config returns the effective configuration (defaults filled in).
func (m *Machine) Config() Config { return m.cfg }

// Ready returns the actions decided since the last call, in the order the
// daemon must perform them, and forgets them.
func (m *Machine) Ready() []Action {
	out := m.out
	m.out = nil
	return out
}

func (m *Machine) emit(a Action) {
	m.log.Debug("cluster action", "tick", m.now, "action", a.String())
	m.out = append(m.out, a)
}

// Tick advances time by one tick: lease deadlines are checked, planned
// moves time out, and the cluster is reconciled.
func (m *Machine) Tick() {
	m.now++
	for _, id := range m.nodeOrder {
		n := m.nodes[id]
		if n.state == NodeDown {
			continue
		}
		age := m.now - n.lastBeat
		if m.cfg.SelfFenceTicks > 0 && (m.cfg.Self == "" || m.cfg.Self == id) &&
			n.state == NodeUp && age >= m.cfg.SelfFenceTicks {
			m.selfFence(n, fmt.Sprintf("lease not renewed for %d ticks", age))
		}
		if m.cfg.LeaseTicks > 0 && age >= m.cfg.LeaseTicks {
			m.nodeLost(n, fmt.Sprintf("no heartbeat for %d ticks", age))
		}
	}
	m.reconcile()
}

// Step applies one event. It returns an error wrapping ErrUnknownNode,
// ErrUnknownArray, ErrUnknownDrive or ErrBadConfig when the event does not
// fit the machine's state; the state is then unchanged.
func (m *Machine) Step(ev Event) error {
	if hb, ok := ev.(Heartbeat); ok {
		if n, known := m.nodes[hb.Node]; known && n.state == NodeUp {
			n.lastBeat = m.now // a plain renewal decides nothing
			return nil
		}
	}
	if err := m.step(ev); err != nil {
		return err
	}
	m.reconcile()
	return nil
}

// Restore rebuilds state from the store's records: it applies evs
// (typically NodeJoined for every node, LeaseExpired for those without a
// live lease, ArrayDefined, ArrayObserved, DrainRequested) without deciding
// anything in between and without the actions they would produce (drives
// are already exported, events already logged), then reconciles once; only
// that reconcile's actions are returned by Ready. On error the machine is
// partly restored and should be discarded.
func (m *Machine) Restore(evs []Event) error {
	for _, ev := range evs {
		if err := m.step(ev); err != nil {
			return fmt.Errorf("restore %T: %w", ev, err)
		}
	}
	m.out = nil
	for _, name := range m.arrayOrder {
		a := m.arrays[name]
		a.lastSeen = m.state(a)
	}
	// A node found down is drained in Slurm again: the coordinator that
	// saw it die may have died with it (or before it could drain). The
	// drainer leaves an identical drain, and an administrator's, alone.
	for _, id := range m.nodeOrder {
		n := m.nodes[id]
		n.slurmDrained = n.state == NodeDown
		if n.slurmDrained {
			m.emit(SlurmDrain{Node: id, Reason: "tier0: storage lease expired"})
		}
	}
	m.reconcile()
	return nil
}

func (m *Machine) node(id string) (*node, error) {
	n, ok := m.nodes[id]
	if !ok {
		return nil, fmt.Errorf("node %q has not joined: %w", id, ErrUnknownNode)
	}
	return n, nil
}

func (m *Machine) array(name string) (*array, error) {
	a, ok := m.arrays[name]
	if !ok {
		return nil, fmt.Errorf("array %q is not defined: %w", name, ErrUnknownArray)
	}
	return a, nil
}

func (m *Machine) step(ev Event) error {
	switch e := ev.(type) {
	case NodeJoined:
		return m.join(e)
	case ArrayDefined:
		return m.define(e)
	case Heartbeat:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		m.heartbeat(n)
	case NodeReturned:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if n.state != NodeDown {
			// The daemon restarted before its old lease expired: the old
			// process served nothing after it died, and the new one
			// serves nothing yet.
			m.restarted(n)
		}
		m.heartbeat(n)
	case LeaseExpired:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		m.nodeLost(n, "lease expired in the store")
	case SelfLeaseLost:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		m.selfFence(n, "lease renewal failed")
	case PartitionSuspected:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if !n.suspect {
			n.suspect = true
			m.emit(RecordEvent{Kind: "partition-suspected", Node: n.id})
		}
	case PartitionCleared:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if n.suspect {
			n.suspect = false
			m.emit(RecordEvent{Kind: "partition-cleared", Node: n.id})
		}
	case DrainRequested:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if !n.draining {
			n.draining = true
			m.emit(RecordEvent{Kind: "drain", Node: n.id})
			m.clearRetry()
		}
	case UndrainRequested:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if n.draining {
			n.draining = false
			m.emit(RecordEvent{Kind: "undrain", Node: n.id})
			m.clearRetry()
		}
	case FailbackRequested:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		a.asked, a.retryAt = true, 0
	case FenceDone:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		if a.phase != phaseFencing || a.owner != e.Node || a.epoch != e.Epoch || m.nodes[e.Node].state != NodeUp {
			// A stale report of a superseded attempt, or one a node that
			// fenced itself performed late: once its lease is renewed it
			// takes the array again under a new epoch.
			return nil
		}
		a.phase, a.phaseAt = phaseAssembling, m.now
		absent, stale := a.resetForAssemble()
		m.emit(Assemble{Array: a.name, Node: a.owner, Epoch: a.epoch, Degraded: absent, Stale: stale})
	case FenceFailed:
		return m.attemptFailed(e.Array, e.Node, e.Epoch, phaseFencing, "fence failed: "+e.Reason)
	case AssembleFailed:
		return m.attemptFailed(e.Array, e.Node, e.Epoch, phaseAssembling, "assemble failed: "+e.Reason)
	case ArrayAssembled:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		if a.phase != phaseAssembling || a.owner != e.Node || a.epoch != e.Epoch || m.nodes[e.Node].state != NodeUp {
			return nil // as for FenceDone
		}
		a.phase, a.phaseAt = phaseActive, m.now
		m.emit(SetANA{Array: a.name, Node: a.owner, State: ANAOptimized, Epoch: a.epoch})
		if a.failed != "" {
			m.emit(RecordEvent{Kind: "recovered", Array: a.name, From: a.from, To: a.owner, Epoch: a.epoch, Ticks: m.now - a.since,
				Message: "assembled again after: " + a.failed})
			a.failed, a.failedBy, a.waitBack = "", "", false
		} else {
			m.emit(RecordEvent{Kind: a.kind, Array: a.name, From: a.from, To: a.owner, Epoch: a.epoch, Ticks: m.now - a.since})
		}
		a.avoid, a.fails, a.homeFails, a.nextTry = nil, 0, 0, 0
		if a.errMember == "" {
			a.lastErr = ""
		}
		if a.owner == a.home {
			a.asked = false
		}
	case OwnershipAcquired:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		if e.Epoch > a.epoch {
			m.adopt(a, e.Node, e.Epoch)
		}
	case OwnershipLost:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		if e.WinnerEpoch >= a.epoch && (e.WinnerEpoch > a.epoch || e.Winner != a.owner) {
			m.adopt(a, e.Winner, e.WinnerEpoch)
		}
	case Released:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		if a.owner != e.Node || a.epoch != e.Epoch {
			return nil
		}
		switch a.phase {
		case phaseReleasing:
			t := a.target
			if !m.eligible(t) || t == a.owner {
				t = m.leastLoaded(a, a.owner)
			}
			if t == "" {
				a.phase, a.from = phaseIdle, a.owner
				return nil
			}
			m.startTakeover(a, t, "handoff")
		case phaseActive: // a release that arrived after its move was abandoned
			a.phase, a.from, a.since, a.kind = phaseIdle, a.owner, m.now, "handoff"
		}
	case ResyncDone:
		mb, err := m.member(e.Array, e.Member)
		if err != nil {
			return err
		}
		if e.Epoch != 0 && e.Epoch != m.arrays[e.Array].epoch {
			return nil // reported by a superseded owner
		}
		if mb.state == MemberResyncing {
			mb.state, mb.progress = MemberOK, 100
			m.repairDone(m.arrays[e.Array], mb)
		}
	case RebuildDone:
		mb, err := m.member(e.Array, e.Member)
		if err != nil {
			return err
		}
		if e.Epoch != 0 && e.Epoch != m.arrays[e.Array].epoch {
			return nil // reported by a superseded owner
		}
		if mb.state == MemberRebuilding || mb.state == MemberResyncing {
			mb.state, mb.progress = MemberOK, 100
			m.repairDone(m.arrays[e.Array], mb)
		}
	case RebuildProgress:
		mb, err := m.member(e.Array, e.Member)
		if err != nil {
			return err
		}
		if e.Epoch != 0 && e.Epoch != m.arrays[e.Array].epoch {
			return nil // reported by a superseded owner
		}
		if mb.state == MemberRebuilding || mb.state == MemberResyncing {
			mb.progress = max(0, min(100, e.Percent))
		}
	case MemberFailed:
		mb, err := m.member(e.Array, e.Member)
		if err != nil {
			return err
		}
		if mb.state != MemberDriveFailed {
			mb.state, mb.progress = MemberDriveFailed, 0
			m.emit(RecordEvent{Kind: "member-failed", Array: e.Array, Node: mb.node, Message: "drive " + mb.drive})
		}
	case ArrayFailed:
		return m.arrayFailed(e)
	case RepairFailed:
		return m.repairFailed(e)
	case ArrayObserved:
		return m.observed(e)
	case DriveReplaced:
		if _, ok := m.drives[e.Drive]; !ok {
			return fmt.Errorf("drive %q is not on any joined node: %w", e.Drive, ErrUnknownDrive)
		}
		for _, name := range m.arrayOrder {
			for _, mb := range m.arrays[name].members {
				if mb.drive == e.Drive && mb.state == MemberDriveFailed {
					mb.state = MemberReplaced
				}
			}
		}
	default:
		return fmt.Errorf("event %T: %w", ev, ErrBadConfig)
	}
	return nil
}

func (m *Machine) member(arrayName, drive string) (*member, error) {
	a, err := m.array(arrayName)
	if err != nil {
		return nil, err
	}
	for _, mb := range a.members {
		if mb.drive == drive {
			return mb, nil
		}
	}
	return nil, fmt.Errorf("drive %q is not a member of array %q: %w", drive, arrayName, ErrUnknownDrive)
}
