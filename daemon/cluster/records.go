package cluster

import (
	"fmt"
	"slices"
)

// stepRecord applies what the store records about an array: its
// definition in the desired state (ArrayDefined, ArrayRemoved), and what was last
// observed of it, for a machine rebuilt from the store (ArrayObserved).
func (m *Machine) stepRecord(ev Event) error {
	switch e := ev.(type) {
	case ArrayDefined:
		return m.define(e)
	case ArrayRemoved:
		if _, err := m.array(e.Name); err != nil {
			return err
		}
		delete(m.arrays, e.Name)
		m.arrayOrder = slices.DeleteFunc(m.arrayOrder, func(n string) bool { return n == e.Name })
		return nil
	case ArrayObserved:
		return m.observed(e)
	}
	return badEvent(ev)
}

// define adds an array from the desired state after checking its level,
// members (known drives, one per node) and failback policy.
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
	a := &array{name: e.Name, level: e.Level, home: e.Home, policy: e.Failback, kind: kindAssign, lastSeen: StateOffline}
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

// observed seeds an array with the store's record of it (see
// ArrayObserved): member states first checked, then applied; an owner
// that serves it keeps it, any other record leaves it to be assigned.
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
	case e.Owner != "" && e.Claimed && known && n.state == NodeUp:
		// A takeover the previous coordinator ordered may be under way:
		// resume it at its epoch (reconcileArray sends the Fence again)
		// rather than re-take the array under the next one.
		a.owner, a.phase, a.from, a.kind, a.resume = e.Owner, phaseFencing, e.Owner, kindFailover, true
	case e.Owner == "":
		a.owner, a.phase, a.from, a.kind = "", phaseIdle, "", kindAssign
	default:
		a.owner, a.phase, a.from, a.kind = e.Owner, phaseIdle, e.Owner, kindFailover
	}
	return nil
}
