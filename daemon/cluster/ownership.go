package cluster

import "fmt"

// stepOwnership applies the reports of a move of ownership: the new
// owner's fence and assembly (done or failed), the store's word on who won
// the ownership CAS, the old owner's release of a planned hand-off. A
// report of a superseded attempt (another node, an older epoch) changes
// nothing.
func (m *Machine) stepOwnership(ev Event) error {
	switch e := ev.(type) {
	case FenceDone:
		return m.fenceDone(e)
	case FenceFailed:
		return m.attemptFailed(e.Array, e.Node, e.Epoch, phaseFencing, "fence failed: "+e.Reason)
	case ArrayAssembled:
		return m.assembled(e)
	case AssembleFailed:
		return m.attemptFailed(e.Array, e.Node, e.Epoch, phaseAssembling, "assemble failed: "+e.Reason)
	case OwnershipAcquired:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		if e.Epoch > a.epoch {
			if _, err := m.node(e.Node); err != nil {
				return fmt.Errorf("array %q owner at epoch %d: %w", e.Array, e.Epoch, err)
			}
			m.adopt(a, e.Node, e.Epoch)
		}
	case OwnershipLost:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		if e.WinnerEpoch >= a.epoch && (e.WinnerEpoch > a.epoch || e.Winner != a.owner) {
			if _, err := m.node(e.Winner); err != nil {
				return fmt.Errorf("array %q owner at epoch %d: %w", e.Array, e.WinnerEpoch, err)
			}
			m.adopt(a, e.Winner, e.WinnerEpoch)
		}
	case Released:
		return m.released(e)
	default:
		return badEvent(ev)
	}
	return nil
}

// fenceDone: the new owner holds the array's members; it assembles it next.
func (m *Machine) fenceDone(e FenceDone) error {
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
	return nil
}

// assembled: the new owner serves the array. It turns ANA optimized, the
// move is recorded, and the failures that led to it are forgotten.
func (m *Machine) assembled(e ArrayAssembled) error {
	a, err := m.array(e.Array)
	if err != nil {
		return err
	}
	if a.owner != e.Node || a.epoch != e.Epoch || m.nodes[e.Node].state != NodeUp {
		return nil // as for FenceDone
	}
	switch a.phase {
	case phaseAssembling:
	case phaseFailed:
		// The owner re-assembled the failed array itself once enough
		// members answered again (daemon/node retryFailed), under the
		// epoch it holds: members cut off on the backend alone bring no
		// NodeReturned, so nothing else would end the failure before the
		// backoff (simulation seed 117044). Recorded as recovered below.
	default:
		return nil
	}
	a.phase, a.phaseAt = phaseActive, m.now
	m.emit(SetANA{Array: a.name, Node: a.owner, State: ANAOptimized, Epoch: a.epoch})
	if a.failed != "" {
		m.record(kindRecovered, RecordEvent{Array: a.name, From: a.from, To: a.owner, Epoch: a.epoch, Ticks: m.now - a.since,
			Message: "assembled again after: " + a.failed})
		a.failed, a.failedBy, a.waitBack = "", "", false
	} else {
		m.record(a.kind, RecordEvent{Array: a.name, From: a.from, To: a.owner, Epoch: a.epoch, Ticks: m.now - a.since})
	}
	a.avoid, a.fails, a.homeFails, a.nextTry = nil, 0, 0, 0
	if a.errMember == "" {
		a.lastErr = ""
	}
	if a.owner == a.home {
		a.asked = false
	}
	return nil
}

// released: the old owner of a planned hand-off stopped serving the
// array; the takeover by its destination (or, if that one is no longer
// eligible, the least loaded node) starts.
func (m *Machine) released(e Released) error {
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
		m.startTakeover(a, t, kindHandoff)
	case phaseActive: // a release that arrived after its move was abandoned
		a.phase, a.from, a.since, a.kind = phaseIdle, a.owner, m.now, kindHandoff
	}
	return nil
}

// startTakeover moves a to node to under the next epoch: to fences the
// members it can reach (cutting the old owner off), then assembles.
func (m *Machine) startTakeover(a *array, to string, kind eventKind) {
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
	m.sendFence(a, old, oldEpoch)
}

// sendFence orders a's owner to fence the members it can reach under a's
// epoch (a takeover's first step, or a restored machine's resumption of
// one: see ArrayObserved.Claimed).
func (m *Machine) sendFence(a *array, old string, oldEpoch uint64) {
	var reach []string
	for _, mb := range a.members {
		if m.nodes[mb.node].state != NodeDown {
			reach = append(reach, mb.drive)
		}
	}
	m.emit(Fence{Array: a.name, Node: a.owner, OldOwner: old, OldEpoch: oldEpoch, NewEpoch: a.epoch, Members: reach})
}

// startRelease begins a planned hand-off of a to node to: its owner
// releases it first (Release, then Released starts the takeover).
func (m *Machine) startRelease(a *array, to string) {
	a.phase, a.phaseAt, a.since, a.target, a.from = phaseReleasing, m.now, m.now, to, a.owner
	m.emit(Release{Array: a.name, Node: a.owner, Epoch: a.epoch, To: to})
}

// clearRetry lets every abandoned hand-off be tried again now (a node
// came back, drained or undrained).
func (m *Machine) clearRetry() {
	for _, a := range m.arrays {
		a.retryAt = 0
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

// attemptFailed: the takeover of array name by nodeID at epoch failed in
// phase want; a report of any other attempt is ignored.
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
	m.record(kindTakeoverFailed, RecordEvent{Array: a.name, Node: node, Epoch: a.epoch, Message: reason})
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
