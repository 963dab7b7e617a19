package cluster

import (
	"fmt"
	"log/slog"
	"slices"
)

type phase int

const (
	phaseIdle       phase = iota // no node serves it; reconcile assigns one
	phaseReleasing               // planned move: old owner is releasing
	phaseFencing                 // new owner: CAS + reservation preempt
	phaseAssembling              // new owner: assemble + repair
	phaseActive                  // owner serves it, ANA optimized
	phaseFailed                  // owner holds it but its RAID failed; it re-assembles it when members return
)

var phaseNames = [...]string{"idle", "releasing", "fencing", "assembling", "active", "failed"}

func (p phase) String() string { return phaseNames[p] }

type node struct {
	id, domain   string
	drives       []string
	state        NodeState
	lastBeat     int64
	suspect      bool
	draining     bool
	slurmDrained bool
}

type member struct {
	drive, node string
	state       MemberState
	progress    int
	fails       int   // consecutive refused/failed repairs
	retryAt     int64 // no repair ordered before this tick
}

type array struct {
	name     string
	level    Level
	home     string
	policy   FailbackPolicy
	members  []*member
	owner    string
	epoch    uint64
	phase    phase
	target   string // planned destination while releasing
	from     string // owner before the current move
	kind     string // "failover" or "handoff"
	since    int64  // tick the current outage or move began
	phaseAt  int64  // tick the current phase began
	retryAt  int64  // no planned move before this tick
	avoid    map[string]bool
	asked    bool // failback requested by an operator
	lastSeen ArrayState

	fails     int    // consecutive failed takeovers (and re-assemblies of a failed array)
	homeFails int    // consecutive failed takeovers at the home node
	nextTry   int64  // no takeover before this tick (backoff)
	lastErr   string // the last refused or failed action, and why
	errMember string // the member lastErr is about; "" for a takeover
	failed    string // the array failed (ArrayFailed, or more members lost than parity): why
	failedBy  string // the owner that reported it; "" when the machine saw it
	waitBack  bool   // the engine failed with these members: wait for one to return
}

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

func (m *Machine) observed(e ArrayObserved) error {
	a, err := m.array(e.Array)
	if err != nil {
		return err
	}
	if e.Epoch < a.epoch {
		return nil
	}
	for drive, st := range e.Members { // validate everything before changing anything
		if _, err := m.member(e.Array, drive); err != nil {
			return err
		}
		switch st {
		case MemberOK, MemberMissing, MemberStale, MemberDriveFailed, MemberReplaced, MemberResyncing, MemberRebuilding:
		default:
			return fmt.Errorf("array %q member %q state %q: %w", e.Array, drive, st, ErrBadConfig)
		}
	}
	for drive, st := range e.Members {
		mb, _ := m.member(e.Array, drive)
		switch st {
		case MemberOK, MemberMissing, MemberStale, MemberDriveFailed, MemberReplaced:
			mb.state = st
		case MemberResyncing: // the repair restarts under this machine
			mb.state = MemberStale
		case MemberRebuilding:
			mb.state = MemberReplaced
		}
		if m.nodes[mb.node].state == NodeDown && mb.state == MemberOK {
			mb.state = MemberMissing
		}
	}
	a.epoch, a.since, a.phaseAt = e.Epoch, m.now, m.now
	n, known := m.nodes[e.Owner]
	switch {
	case e.Owner != "" && e.Serving && known && n.state == NodeUp:
		a.owner, a.phase = e.Owner, phaseActive
	case e.Owner == "":
		a.owner, a.phase, a.from, a.kind = "", phaseIdle, "", "assign"
	default:
		a.owner, a.phase, a.from, a.kind = e.Owner, phaseIdle, e.Owner, "failover"
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

func (m *Machine) join(e NodeJoined) error {
	if e.Node == "" {
		return fmt.Errorf("node with empty name: %w", ErrBadConfig)
	}
	if n, ok := m.nodes[e.Node]; ok {
		m.heartbeat(n) // a re-registration is a return
		return nil
	}
	for _, d := range e.Drives {
		if other, ok := m.drives[d]; ok {
			return fmt.Errorf("drive %q of node %q already belongs to node %q: %w", d, e.Node, other, ErrBadConfig)
		}
	}
	dom := e.Domain
	if dom == "" {
		dom = e.Node
	}
	n := &node{id: e.Node, domain: dom, drives: slices.Clone(e.Drives), state: NodeUp, lastBeat: m.now}
	m.nodes[n.id] = n
	i, _ := slices.BinarySearch(m.nodeOrder, n.id)
	m.nodeOrder = slices.Insert(m.nodeOrder, i, n.id)
	for _, d := range n.drives {
		m.drives[d] = n.id
	}
	m.emit(Export{Node: n.id, Drives: slices.Clone(n.drives)})
	return nil
}

func (m *Machine) define(e ArrayDefined) error {
	if _, ok := m.arrays[e.Name]; ok {
		return fmt.Errorf("array %q defined twice: %w", e.Name, ErrBadConfig)
	}
	if e.Level != RAID5 && e.Level != RAID6 {
		return fmt.Errorf("array %q level %d: want raid5 or raid6: %w", e.Name, int(e.Level), ErrBadConfig)
	}
	if len(e.Members) < e.Level.Parity()+2 {
		return fmt.Errorf("array %q has %d members; %s needs at least %d: %w", e.Name, len(e.Members), e.Level, e.Level.Parity()+2, ErrBadConfig)
	}
	if _, err := m.node(e.Home); err != nil {
		return fmt.Errorf("array %q home: %w", e.Name, err)
	}
	a := &array{name: e.Name, level: e.Level, home: e.Home, policy: e.Failback, kind: "assign", lastSeen: StateOffline}
	if a.policy == "" {
		a.policy = m.cfg.Failback
	}
	if a.policy != FailbackAuto && a.policy != FailbackManual {
		return fmt.Errorf("array %q failback policy %q: want auto or manual: %w", e.Name, a.policy, ErrBadConfig)
	}
	seen := map[string]bool{}
	for _, s := range e.Members {
		owner, ok := m.drives[s.Drive]
		if !ok {
			return fmt.Errorf("array %q member %q: %w", e.Name, s.Drive, ErrUnknownDrive)
		}
		if s.Node != "" && s.Node != owner {
			return fmt.Errorf("array %q member %q is on node %q, not %q: %w", e.Name, s.Drive, owner, s.Node, ErrBadConfig)
		}
		if seen[owner] {
			return fmt.Errorf("array %q has two members on node %q: %w", e.Name, owner, ErrBadConfig)
		}
		seen[owner] = true
		st := MemberOK
		if m.nodes[owner].state == NodeDown {
			st = MemberMissing
		}
		a.members = append(a.members, &member{drive: s.Drive, node: owner, state: st})
	}
	a.since = m.now
	m.arrays[a.name] = a
	i, _ := slices.BinarySearch(m.arrayOrder, a.name)
	m.arrayOrder = slices.Insert(m.arrayOrder, i, a.name)
	return nil
}

func (m *Machine) heartbeat(n *node) {
	n.lastBeat = m.now
	switch n.state {
	case NodeDown:
		n.state = NodeUp
		m.emit(RecordEvent{Kind: "node-returned", Node: n.id})
		m.emit(Export{Node: n.id, Drives: slices.Clone(n.drives)})
		for _, name := range m.arrayOrder {
			for _, mb := range m.arrays[name].members {
				if mb.node == n.id && mb.state == MemberMissing {
					mb.state, mb.progress = MemberStale, 0
				}
			}
		}
		m.clearRetry()
		m.nodeBack(n)
	case NodeFenced:
		// The node renewed before the store expired it: nobody took its
		// arrays, but it stopped serving them, so it takes them back
		// under a new epoch like any other owner.
		n.state = NodeUp
		m.emit(RecordEvent{Kind: "lease-regained", Node: n.id})
		m.nodeBack(n)
		for _, name := range m.arrayOrder {
			a := m.arrays[name]
			if a.owner == n.id && a.phase != phaseIdle {
				a.phase, a.from, a.kind = phaseIdle, n.id, "failover"
			}
		}
	}
}

func (m *Machine) restarted(n *node) {
	m.emit(RecordEvent{Kind: "node-restarted", Node: n.id})
	n.state = NodeDown
	for _, name := range m.arrayOrder {
		a := m.arrays[name]
		for _, mb := range a.members {
			if mb.node == n.id {
				switch mb.state {
				case MemberOK, MemberResyncing:
					mb.state, mb.progress = MemberMissing, 0
				case MemberRebuilding:
					mb.state, mb.progress = MemberReplaced, 0
				}
			}
		}
		if a.owner == n.id && a.phase != phaseIdle {
			if a.phase == phaseActive {
				a.since = m.now
			}
			a.phase, a.from, a.kind = phaseIdle, n.id, "failover"
		}
	}
}

func (m *Machine) selfFence(n *node, reason string) {
	if n.state != NodeUp {
		return
	}
	n.state = NodeFenced
	m.emit(SelfFence{Node: n.id})
	m.emit(RecordEvent{Kind: "self-fence", Node: n.id, Message: reason})
	for _, name := range m.arrayOrder {
		if a := m.arrays[name]; a.owner == n.id && a.phase == phaseActive {
			a.since = m.now // the outage of its arrays starts now
		}
	}
}

func (m *Machine) nodeLost(n *node, reason string) {
	if n.state == NodeDown {
		return
	}
	n.state = NodeDown
	m.emit(RecordEvent{Kind: "node-lost", Node: n.id, Message: reason})
	if !n.slurmDrained {
		n.slurmDrained = true
		m.emit(SlurmDrain{Node: n.id, Reason: "tier0: storage lease expired"})
	}
	for _, name := range m.arrayOrder {
		a := m.arrays[name]
		for _, mb := range a.members {
			if mb.node != n.id {
				continue
			}
			switch mb.state {
			case MemberOK, MemberStale, MemberResyncing:
				mb.state, mb.progress = MemberMissing, 0
			case MemberRebuilding:
				mb.state, mb.progress = MemberReplaced, 0
			}
		}
		if a.owner == n.id && a.phase != phaseIdle {
			if a.phase == phaseActive {
				a.since = n.lastBeat
			}
			a.phase, a.from, a.kind = phaseIdle, n.id, "failover"
		}
	}
}

// adopt takes the store's word that node holds a at epoch.
func (m *Machine) adopt(a *array, node string, epoch uint64) {
	a.owner, a.epoch = node, epoch
	if a.phase == phaseActive || a.phase == phaseIdle || a.phase == phaseReleasing || a.phase == phaseFailed {
		a.phase = phaseFencing
	}
	a.phaseAt = m.now
}

func (m *Machine) attemptFailed(name, nodeID string, epoch uint64, want phase, reason string) error {
	a, err := m.array(name)
	if err != nil {
		return err
	}
	if a.phase != want || a.owner != nodeID || a.epoch != epoch {
		return nil
	}
	m.takeoverFailed(a, reason)
	return nil
}

// takeoverFailed ends the current takeover attempt of a, which failed for
// reason, and schedules the next one: at once on another candidate the
// first time, then after a doubling backoff. A home node that is still
// eligible gets homeAttempts tries (one backoff tick apart) before the
// array goes elsewhere.
func (m *Machine) takeoverFailed(a *array, reason string) {
	node := a.owner
	m.emit(RecordEvent{Kind: "takeover-failed", Array: a.name, Node: node, Epoch: a.epoch, Message: reason})
	a.fails++
	a.lastErr, a.errMember = fmt.Sprintf("takeover by %s at epoch %d: %s", node, a.epoch, reason), ""
	wait := m.backoff(a.fails)
	if a.failed != "" && a.from == node && m.nodes[node].state == NodeUp {
		// The owner of a failed array could not assemble it again: it
		// keeps it (it may still present the namespace; no other node
		// takes an array from a live owner) and tries again later.
		a.phase, a.phaseAt, a.nextTry = phaseFailed, m.now, m.now+max(1, wait)
		return
	}
	if node == a.home {
		a.homeFails++
	}
	if node == a.home && a.homeFails < homeAttempts && m.eligible(node) {
		wait = max(wait, 1) // the home again, but not in the same tick
	} else {
		if a.avoid == nil {
			a.avoid = map[string]bool{}
		}
		a.avoid[node] = true
	}
	a.nextTry = m.now + wait
	a.phase = phaseIdle
}

// backoff is the wait after the k-th consecutive failure of an action: 0
// after the first, then 1, 2, 4, ... ticks, at most BackoffMaxTicks.
func (m *Machine) backoff(k int) int64 {
	if k <= 1 {
		return 0
	}
	return min(int64(1)<<min(k-2, 62), m.cfg.BackoffMaxTicks)
}

// arrayFailed: the owner's RAID engine lost more members than the level
// has parity and stopped serving. The owner is the authority (it knows,
// for instance, that a member under delta resync cannot serve its dirty
// regions): the array is failed until enough members are back, then it is
// assembled again under a fresh epoch.
func (m *Machine) arrayFailed(e ArrayFailed) error {
	a, err := m.array(e.Array)
	if err != nil {
		return err
	}
	if e.Node == "" || e.Node != a.owner || e.Epoch != a.epoch || a.phase == phaseFailed || (a.phase == phaseIdle && a.failed != "") {
		return nil // a superseded owner, or a failure already handled
	}
	// In phase idle: the failed assembly was reported (AssembleFailed)
	// before the failure itself. The array is failed, and the next
	// takeover waits for members like any failed array's.
	reason := e.Reason
	if reason == "" {
		reason = "the owner's RAID lost more members than its parity"
	}
	m.markFailed(a, e.Node, reason)
	return nil
}

// markFailed: a stopped being readable (by its owner's word when by is
// set, else because the machine counts more members absent than parity).
// Its owner stops serving it (ANA inaccessible) but keeps it: no other
// node takes an array from a live owner. Repairs in flight are void. The
// owner assembles it again under a fresh epoch (Fence, Assemble) when
// every member is back or those not in sync are within parity, or, once
// after each member's return, when it is readable by the machine's count
// (the engine then decides whether the stale members suffice). If the
// owner is lost meanwhile, the array goes to another node the same way.
func (m *Machine) markFailed(a *array, by, reason string) {
	m.emit(SetANA{Array: a.name, Node: a.owner, State: ANAInaccessible, Epoch: a.epoch})
	m.emit(RecordEvent{Kind: "array-failed", Array: a.name, Node: a.owner, Epoch: a.epoch, Message: reason})
	for _, mb := range a.members { // the repairs in flight died with the array
		switch mb.state {
		case MemberResyncing:
			mb.state, mb.progress = MemberStale, 0
		case MemberRebuilding:
			mb.state, mb.progress = MemberReplaced, 0
		}
	}
	a.failed, a.failedBy, a.waitBack = reason, by, true
	a.fails++
	where := ""
	if by != "" {
		where = " on " + by
	}
	a.lastErr, a.errMember = fmt.Sprintf("array failed%s at epoch %d: %s", where, a.epoch, reason), ""
	a.nextTry = m.now + max(1, m.backoff(a.fails))
	if a.phase == phaseActive {
		a.since = m.now
	}
	if a.phase != phaseIdle {
		a.phase, a.phaseAt, a.target = phaseFailed, m.now, ""
	}
}

// repairFailed: the owner refused or failed a Resync/Rebuild. The member
// goes back to waiting and the repair is ordered again after a backoff.
func (m *Machine) repairFailed(e RepairFailed) error {
	mb, err := m.member(e.Array, e.Member)
	if err != nil {
		return err
	}
	a := m.arrays[e.Array]
	if e.Epoch != 0 && e.Epoch != a.epoch {
		return nil // reported by a superseded owner
	}
	what := "resync"
	switch mb.state {
	case MemberResyncing:
		mb.state = MemberStale
	case MemberRebuilding:
		mb.state, what = MemberReplaced, "rebuild"
	default:
		return nil // no repair of it is running: a duplicate report
	}
	mb.progress = 0
	mb.fails++
	mb.retryAt = m.now + m.backoff(mb.fails+1)
	a.lastErr, a.errMember = fmt.Sprintf("%s of %s at epoch %d failed on %s: %s", what, mb.drive, a.epoch, a.owner, e.Reason), mb.drive
	m.emit(RecordEvent{Kind: "repair-failed", Array: a.name, Node: a.owner, Epoch: a.epoch,
		Message: fmt.Sprintf("%s of %s (attempt %d): %s", what, mb.drive, mb.fails, e.Reason)})
	return nil
}

// repairDone clears the failure record of a repair that finished.
func (m *Machine) repairDone(a *array, mb *member) {
	mb.fails, mb.retryAt = 0, 0
	if a.errMember == mb.drive {
		a.lastErr, a.errMember = "", ""
	}
}

// nodeBack: n came back (a new lease, or its old one renewed after it
// fenced itself). It is a new incarnation: earlier failures of its own
// no longer count against it, and what waited for members or candidates
// is tried now rather than at the end of its backoff.
func (m *Machine) nodeBack(n *node) {
	for _, name := range m.arrayOrder {
		a := m.arrays[name]
		delete(a.avoid, n.id)
		if a.home == n.id {
			a.homeFails = 0
		}
		a.nextTry = 0
		for _, mb := range a.members {
			mb.retryAt = 0
			if mb.node == n.id {
				a.waitBack = false // one of its members is back: worth a try
			}
		}
	}
}

// resetForAssemble puts members whose repair was interrupted back in the
// queue and returns the members the new owner must treat as absent and
// those it attaches as stale (resynced from the write-intent bitmap next).
func (a *array) resetForAssemble() (absent, stale []string) {
	for _, mb := range a.members {
		switch mb.state {
		case MemberResyncing:
			mb.state, mb.progress = MemberStale, 0
		case MemberRebuilding:
			mb.state, mb.progress = MemberReplaced, 0
		}
		switch mb.state {
		case MemberOK:
		case MemberStale:
			stale = append(stale, mb.drive)
		default:
			absent = append(absent, mb.drive)
		}
	}
	return absent, stale
}

// absent counts members whose content cannot serve reads at all. A stale
// member (its node was away) still holds everything outside the regions
// its owner's write-intent bitmap marks dirty, so it counts as present.
func (a *array) absent() int {
	k := 0
	for _, mb := range a.members {
		if absentState(mb.state) {
			k++
		}
	}
	return k
}

func absentState(st MemberState) bool {
	switch st {
	case MemberOK, MemberStale, MemberResyncing:
		return false
	}
	return true
}

// redundant: every member is fully in sync.
func (a *array) redundant() bool {
	for _, mb := range a.members {
		if mb.state != MemberOK {
			return false
		}
	}
	return true
}

func (a *array) readable() bool { return a.absent() <= a.level.Parity() }

// canRetake: a takeover (or the re-assembly of a failed array) may start
// now.
func (a *array) canRetake(now int64) bool {
	return a.readable() && now >= a.nextTry && (a.failed == "" || !a.waitBack || a.recoverable())
}

// recoverable: an array its owner reported failed may be assembled again.
// Either every member is back (the engine assembles from the newest
// consistent set), or the members not fully in sync — absent, stale — are
// within parity. A stale member with another member still away is not
// enough: its dirty regions have nothing to be rebuilt from.
func (a *array) recoverable() bool {
	out := 0
	for _, mb := range a.members {
		if mb.state != MemberOK {
			out++
		}
	}
	return a.absent() == 0 || out <= a.level.Parity()
}

func (m *Machine) state(a *array) ArrayState {
	switch {
	case !a.readable() || a.failed != "":
		return StateFailed
	case a.phase != phaseActive || m.nodes[a.owner].state != NodeUp:
		return StateOffline
	}
	st := StateOptimal
	for _, mb := range a.members {
		switch mb.state {
		case MemberResyncing, MemberRebuilding:
			return StateRebuilding
		case MemberOK:
		default:
			st = StateDegraded
		}
	}
	return st
}

func (m *Machine) eligible(id string) bool {
	n, ok := m.nodes[id]
	return ok && n.state == NodeUp && !n.suspect && !n.draining
}

// leastLoaded picks the eligible node owning the fewest arrays, ties broken
// by name, never except and never one a failed attempt marked to avoid.
func (m *Machine) leastLoaded(a *array, except string) string {
	load := make(map[string]int, len(m.nodes))
	for _, name := range m.arrayOrder {
		if o := m.arrays[name]; o.phase != phaseIdle {
			load[o.owner]++
		}
	}
	best, bestLoad := "", 0
	for _, id := range m.nodeOrder {
		if id == except || a.avoid[id] || !m.eligible(id) {
			continue
		}
		if l := load[id]; best == "" || l < bestLoad {
			best, bestLoad = id, l
		}
	}
	return best
}

func (m *Machine) clearRetry() {
	for _, a := range m.arrays {
		a.retryAt = 0
	}
}

func (m *Machine) startTakeover(a *array, to, kind string) {
	old, oldEpoch := a.owner, a.epoch
	if a.phase == phaseIdle {
		old = a.from
	}
	a.epoch++
	a.owner, a.target, a.kind = to, "", kind
	a.phase, a.phaseAt = phaseFencing, m.now
	if old != "" {
		a.from = old
	}
	var reach []string
	for _, mb := range a.members {
		if m.nodes[mb.node].state != NodeDown {
			reach = append(reach, mb.drive)
		}
	}
	m.emit(Fence{Array: a.name, Node: to, OldOwner: old, OldEpoch: oldEpoch, NewEpoch: a.epoch, Members: reach})
}

func (m *Machine) startRelease(a *array, to string) {
	a.phase, a.phaseAt, a.since, a.target, a.from = phaseReleasing, m.now, m.now, to, a.owner
	m.emit(Release{Array: a.name, Node: a.owner, Epoch: a.epoch, To: to})
}

// reconcile drives every array toward: served by one healthy owner, at
// home when possible, redundant.
func (m *Machine) reconcile() {
	for _, name := range m.arrayOrder {
		a := m.arrays[name]
		m.reconcileArray(a)
		st := m.state(a)
		if st != a.lastSeen {
			m.emit(RecordEvent{Kind: "state", Array: a.name, Message: fmt.Sprintf("%s -> %s", a.lastSeen, st)})
			a.lastSeen = st
		}
		// The jobs of the array's home lose their storage: drain it, as
		// for a node whose lease expired (resumed below once healthy).
		if h := m.nodes[a.home]; st == StateFailed && !h.slurmDrained && h.state != NodeDown {
			h.slurmDrained = true
			m.emit(SlurmDrain{Node: h.id, Reason: "tier0: array " + a.name + " failed: " + m.reason(a, st)})
		}
	}
	for _, id := range m.nodeOrder {
		n := m.nodes[id]
		if n.slurmDrained && n.state == NodeUp && m.nodeHealthy(id) {
			n.slurmDrained = false
			m.emit(SlurmResume{Node: id, Reason: "tier0: storage role healthy"})
		}
	}
}

func (m *Machine) nodeHealthy(id string) bool {
	for _, a := range m.arrays {
		if a.home == id && m.state(a) == StateFailed {
			return false
		}
		for _, mb := range a.members {
			if mb.node == id && mb.state != MemberOK && mb.state != MemberDriveFailed && mb.state != MemberReplaced && mb.state != MemberRebuilding {
				return false
			}
		}
	}
	return true
}

func (m *Machine) reconcileArray(a *array) {
	if a.owner != "" && a.phase != phaseIdle && m.nodes[a.owner].state == NodeFenced {
		return // wait for the lease to expire or be regained
	}
	if (a.phase == phaseActive || a.phase == phaseFencing || a.phase == phaseAssembling) && !a.readable() {
		m.markFailed(a, "", fmt.Sprintf("%s lost %d of %d members, more than its parity %d", a.level, a.absent(), len(a.members), a.level.Parity()))
	}
	switch a.phase {
	case phaseIdle:
		if !a.canRetake(m.now) {
			return
		}
		to := a.home
		if !m.eligible(to) || a.avoid[to] {
			to = m.leastLoaded(a, "")
		}
		if to == "" {
			if len(a.avoid) > 0 { // every candidate failed once: retry them
				a.avoid = nil
			}
			return
		}
		m.startTakeover(a, to, a.kind)
	case phaseFencing, phaseAssembling:
		// The chosen node never answered (it may be cut off and not
		// have learnt of the decision). A late answer carries a stale
		// epoch and is ignored, so trying elsewhere is safe.
		if m.now-a.phaseAt >= m.cfg.ReleaseTimeoutTicks {
			m.takeoverFailed(a, fmt.Sprintf("no %s report within %d ticks", a.phase, m.cfg.ReleaseTimeoutTicks))
			m.reconcileArray(a)
		}
	case phaseReleasing:
		if m.now-a.phaseAt >= m.cfg.ReleaseTimeoutTicks {
			a.phase, a.phaseAt, a.retryAt = phaseActive, m.now, m.now+m.cfg.ReleaseTimeoutTicks
			m.emit(RecordEvent{Kind: "handoff-aborted", Array: a.name, From: a.owner, To: a.target, Epoch: a.epoch,
				Message: fmt.Sprintf("no release within %d ticks; the array stays", m.cfg.ReleaseTimeoutTicks)})
			a.target = ""
		}
	case phaseFailed:
		if o := m.nodes[a.owner]; a.canRetake(m.now) && o.state == NodeUp && !o.suspect {
			m.startTakeover(a, a.owner, a.kind)
		}
	case phaseActive:
		for _, mb := range a.members {
			if m.now < mb.retryAt {
				continue // the owner refused it: backing off
			}
			switch mb.state {
			case MemberStale:
				mb.state, mb.progress = MemberResyncing, 0
				m.emit(Resync{Array: a.name, Node: a.owner, Member: mb.drive, Epoch: a.epoch})
			case MemberReplaced:
				if m.nodes[mb.node].state == NodeUp {
					mb.state, mb.progress = MemberRebuilding, 0
					m.emit(Rebuild{Array: a.name, Node: a.owner, Member: mb.drive, Epoch: a.epoch})
				}
			}
		}
		if m.now < a.retryAt {
			return
		}
		if m.nodes[a.owner].draining {
			if to := m.leastLoaded(a, a.owner); to != "" {
				m.startRelease(a, to)
			}
			return
		}
		if a.owner != a.home && (a.policy == FailbackAuto || a.asked) && m.eligible(a.home) && a.redundant() {
			m.startRelease(a, a.home)
		}
	}
}
