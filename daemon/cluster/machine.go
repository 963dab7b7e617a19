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
	now        int64 // the current tick
	nodes      map[string]*node
	nodeOrder  []string          // node names, sorted: every loop over nodes runs in this order
	drives     map[string]string // drive -> the node that holds it
	arrays     map[string]*array
	arrayOrder []string // array names, sorted
	out        []Action // decided since the last Ready
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

// record emits ev as an event of kind k.
func (m *Machine) record(k eventKind, ev RecordEvent) {
	ev.Kind = string(k)
	m.emit(ev)
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

// step applies one event without reconciling. As etcd-raft's Step hands a
// message to stepLeader, stepCandidate or stepFollower, it hands each event
// to the step function of its concern; each lives in the file named for it.
func (m *Machine) step(ev Event) error {
	switch ev.(type) {
	case NodeJoined, Heartbeat, NodeReturned, LeaseExpired, SelfLeaseLost, PartitionSuspected, PartitionCleared:
		return m.stepLiveness(ev) // liveness.go
	case FenceDone, FenceFailed, ArrayAssembled, AssembleFailed, OwnershipAcquired, OwnershipLost, Released:
		return m.stepOwnership(ev) // ownership.go
	case ResyncDone, RebuildProgress, RebuildDone, RepairFailed, MemberFailed, DriveReplaced, ArrayFailed:
		return m.stepRepair(ev) // repair.go
	case DrainRequested, UndrainRequested, FailbackRequested:
		return m.stepOperator(ev) // operator.go
	case ArrayDefined, ArrayRemoved, ArrayObserved:
		return m.stepRecord(ev) // records.go
	}
	return badEvent(ev)
}

// badEvent is Step's answer to an event no step function takes.
func badEvent(ev Event) error { return fmt.Errorf("event %T: %w", ev, ErrBadConfig) }

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
