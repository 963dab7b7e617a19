package cluster

import "fmt"

// stepRepair applies what happens to members and to an array's health:
// a drive fails or is replaced, a repair reports progress, success or
// failure, the owner reports the array failed.
func (m *Machine) stepRepair(ev Event) error {
	switch e := ev.(type) {
	case ResyncDone:
		a, mb, err := m.repairReport(e.Array, e.Member, e.Epoch)
		if mb == nil {
			return err
		}
		// Stale too: the owner may have re-added the member on its own
		// (it answers again) while this machine held it back from a
		// resync order (backing off after a refusal); the owner at the
		// array's epoch is the authority that it is in sync now.
		if mb.state == MemberResyncing || mb.state == MemberStale {
			mb.state, mb.progress = MemberOK, 100
			m.repairDone(a, mb)
		}
	case RebuildDone:
		a, mb, err := m.repairReport(e.Array, e.Member, e.Epoch)
		if mb == nil {
			return err
		}
		if mb.state == MemberRebuilding || mb.state == MemberResyncing {
			mb.state, mb.progress = MemberOK, 100
			m.repairDone(a, mb)
		}
	case RebuildProgress:
		_, mb, err := m.repairReport(e.Array, e.Member, e.Epoch)
		if mb == nil {
			return err
		}
		if mb.state == MemberRebuilding || mb.state == MemberResyncing {
			mb.progress = max(0, min(100, e.Percent))
		}
	case RepairFailed:
		return m.repairFailed(e)
	case MemberFailed:
		_, mb, err := m.repairReport(e.Array, e.Member, e.Epoch)
		if mb == nil {
			return err
		}
		if mb.state != MemberDriveFailed {
			mb.state, mb.progress = MemberDriveFailed, 0
			m.record(kindMemberFailed, RecordEvent{Array: e.Array, Node: mb.node, Message: "drive " + mb.drive})
		}
	case DriveReplaced:
		if _, ok := m.drives[e.Drive]; !ok {
			return fmt.Errorf("drive %q is not on any joined node: %w", e.Drive, ErrUnknownDrive)
		}
		for _, name := range m.arrayOrder {
			a := m.arrays[name]
			for _, mb := range a.members {
				if mb.drive == e.Drive && mb.state == MemberDriveFailed {
					mb.state = MemberReplaced
					// A failed array waiting for its members to return
					// never sees a replaced drive "return" as a node
					// does: the new drive is worth a try now.
					a.waitBack, a.nextTry, mb.retryAt = false, 0, 0
				}
			}
		}
	case ArrayFailed:
		return m.arrayFailed(e)
	default:
		return badEvent(ev)
	}
	return nil
}

// repairReport looks up the array and the member a repair report names.
// The member is nil when the report names none (err says why) or when a
// superseded owner sent it: its epoch is not the array's (0 skips the
// check).
func (m *Machine) repairReport(arrayName, drive string, epoch uint64) (*array, *member, error) {
	mb, err := m.member(arrayName, drive)
	if err != nil {
		return nil, nil, err
	}
	a := m.arrays[arrayName]
	if epoch != 0 && epoch != a.epoch {
		return a, nil, nil
	}
	return a, mb, nil
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
	m.record(kindArrayFailed, RecordEvent{Array: a.name, Node: a.owner, Epoch: a.epoch, Message: reason})
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
	a, mb, err := m.repairReport(e.Array, e.Member, e.Epoch)
	if mb == nil {
		return err // nil for a report from a superseded owner
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
	m.record(kindRepairFailed, RecordEvent{Array: a.name, Node: a.owner, Epoch: a.epoch,
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
