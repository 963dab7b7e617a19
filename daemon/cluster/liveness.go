package cluster

import (
	"fmt"
	"slices"
)

// stepLiveness applies the events of node membership and liveness: a node
// joins, renews or loses its lease, restarts, fences itself, suspects a
// partition or stops suspecting it.
func (m *Machine) stepLiveness(ev Event) error {
	switch e := ev.(type) {
	case NodeJoined:
		return m.join(e)
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
		// The registration the machine already saw (reported again, by
		// the node's own report after the store's watch or the other way
		// round), or an older one reported late: nothing new.
		seen := e.Started != 0 && e.Started == n.started && e.Fences <= n.fences
		if !seen {
			n.started, n.fences = e.Started, e.Fences
			if n.state != NodeDown {
				// The daemon restarted before its old lease expired, or
				// fenced itself and registered again: the old process
				// served nothing after it died (or fenced), and the new
				// registration serves nothing yet.
				m.restarted(n)
			}
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
			m.record(kindPartitionSuspected, RecordEvent{Node: n.id})
		}
	case PartitionCleared:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if n.suspect {
			n.suspect = false
			m.record(kindPartitionCleared, RecordEvent{Node: n.id})
		}
	default:
		return badEvent(ev)
	}
	return nil
}

// join adds a node (up, its lease fresh) and exports its drives; a node
// that joins again is returning.
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

// heartbeat: n renewed its lease. A node that was down comes back (its
// members stale, to be resynced); one that had fenced itself takes its
// arrays back under a new epoch.
func (m *Machine) heartbeat(n *node) {
	n.lastBeat = m.now
	switch n.state {
	case NodeDown:
		n.state = NodeUp
		m.record(kindNodeReturned, RecordEvent{Node: n.id})
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
		m.record(kindLeaseRegained, RecordEvent{Node: n.id})
		m.nodeBack(n)
		for _, name := range m.arrayOrder {
			a := m.arrays[name]
			if a.owner == n.id && a.phase != phaseIdle {
				a.phase, a.from, a.kind = phaseIdle, n.id, kindFailover
			}
		}
	}
}

// restarted: n's daemon restarted within its lease. It is treated as lost
// and back at once: its arrays are taken over again, its members resynced.
func (m *Machine) restarted(n *node) {
	m.record(kindNodeRestarted, RecordEvent{Node: n.id})
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
			a.phase, a.from, a.kind = phaseIdle, n.id, kindFailover
		}
	}
}

// selfFence: n stopped renewing its lease and stops serving; its arrays
// wait until its lease is renewed or expires.
func (m *Machine) selfFence(n *node, reason string) {
	if n.state != NodeUp {
		return
	}
	n.state = NodeFenced
	m.emit(SelfFence{Node: n.id})
	m.record(kindSelfFence, RecordEvent{Node: n.id, Message: reason})
	for _, name := range m.arrayOrder {
		if a := m.arrays[name]; a.owner == n.id && a.phase == phaseActive {
			a.since = m.now // the outage of its arrays starts now
		}
	}
}

// nodeLost: n's lease expired. Its members are missing, its arrays go to
// other nodes (the outage counted from its last renewal), and it is
// drained in Slurm.
func (m *Machine) nodeLost(n *node, reason string) {
	if n.state == NodeDown {
		return
	}
	n.state = NodeDown
	m.record(kindNodeLost, RecordEvent{Node: n.id, Message: reason})
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
			a.phase, a.from, a.kind = phaseIdle, n.id, kindFailover
		}
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
