package cluster

import "fmt"

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
