package cluster

import "fmt"

// reconcile drives every array toward: served by one healthy owner, at
// home when possible, redundant.
func (m *Machine) reconcile() {
	for _, name := range m.arrayOrder {
		a := m.arrays[name]
		m.reconcileArray(a)
		st := m.state(a)
		if st != a.lastSeen {
			m.record(kindState, RecordEvent{Array: a.name, Message: fmt.Sprintf("%s -> %s", a.lastSeen, st)})
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

// nodeHealthy: node id may be resumed in Slurm. No array homed on it is
// failed, and each of its members is in sync or waits for a drive (failed,
// replaced, rebuilding) rather than for the node.
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

// reconcileArray takes one step of a toward its goal, by phase: an idle
// array is assigned, a takeover or a hand-off that takes too long is given
// up, a failed array is assembled again when its members allow, an active
// one is repaired and moved where it belongs.
func (m *Machine) reconcileArray(a *array) {
	if a.owner != "" && a.phase != phaseIdle && m.nodes[a.owner].state == NodeFenced {
		return // wait for the lease to expire or be regained
	}
	if (a.phase == phaseActive || a.phase == phaseFencing || a.phase == phaseAssembling) && !a.readable() {
		m.markFailed(a, "", fmt.Sprintf("%s lost %d of %d members, more than its parity %d", a.level, a.absent(), len(a.members), a.level.Parity()))
	}
	switch a.phase {
	case phaseIdle:
		m.assign(a)
	case phaseFencing, phaseAssembling:
		if a.resume {
			a.resume = false
			m.sendFence(a, a.owner, a.epoch)
			return
		}
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
			m.record(kindHandoffAborted, RecordEvent{Array: a.name, From: a.owner, To: a.target, Epoch: a.epoch,
				Message: fmt.Sprintf("no release within %d ticks; the array stays", m.cfg.ReleaseTimeoutTicks)})
			a.target = ""
		}
	case phaseFailed:
		if o := m.nodes[a.owner]; a.canRetake(m.now) && o.state == NodeUp && !o.suspect {
			m.startTakeover(a, a.owner, a.kind)
		}
	case phaseActive:
		m.orderRepairs(a)
		m.planMove(a)
	}
}

// assign starts the takeover of an array no node serves, at its home if
// it is eligible, else on the least loaded node, once the array is
// readable and its backoff is over.
func (m *Machine) assign(a *array) {
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
}

// orderRepairs asks the owner of an active array to resync its stale
// members and rebuild its replaced ones, except those whose last repair
// it refused and that are backing off.
func (m *Machine) orderRepairs(a *array) {
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
}

// planMove starts the planned hand-off of an active array: off a draining
// owner, or back to its home (auto failback, or an operator's request)
// once the array is redundant. An abandoned hand-off waits for retryAt.
func (m *Machine) planMove(a *array) {
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

// eligible: node id may take an array: up, not suspecting a partition,
// not draining.
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
