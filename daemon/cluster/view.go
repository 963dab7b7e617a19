package cluster

import (
	"fmt"
	"slices"
	"strings"
)

// NodeView is a read-only copy of one node's state.
type NodeView struct {
	Name     string    `json:"name"`
	Domain   string    `json:"domain"`
	State    NodeState `json:"state"`
	Draining bool      `json:"draining"`
	Suspect  bool      `json:"suspect"`
	Drives   []string  `json:"drives"`
	Owns     []string  `json:"owns"` // arrays it owns or is taking over
}

// MemberView is a read-only copy of one member's state.
type MemberView struct {
	Drive    string      `json:"drive"`
	Node     string      `json:"node"`
	State    MemberState `json:"state"`
	Progress int         `json:"progress"` // resync/rebuild percent
}

// ArrayView is a read-only copy of one array's state.
type ArrayView struct {
	Name    string         `json:"name"`
	Level   string         `json:"level"`
	Home    string         `json:"home"`
	Owner   string         `json:"owner"`
	Epoch   uint64         `json:"epoch"`
	State   ArrayState     `json:"state"`
	Phase   string         `json:"phase"` // idle, releasing, fencing, assembling, active, failed
	Policy  FailbackPolicy `json:"failback"`
	Members []MemberView   `json:"members"`
	// Reason says why the array is failed or offline (empty otherwise):
	// the owner's report or the members lost, and what it waits for.
	Reason string `json:"reason,omitempty"`
	// Missing lists the members that hold nothing usable now (node down,
	// drive failed, replaced or rebuilding), in member order.
	Missing []string `json:"missing,omitempty"`
	// LastError is the last refused or failed action (a takeover, a
	// repair, the array failing on its owner) with its reason; it is
	// cleared when that action succeeds.
	LastError string `json:"last_error,omitempty"`
	// Failures counts the consecutive failures of that action; the wait
	// before the next try doubles with each (Config.BackoffMaxTicks).
	Failures int `json:"failures,omitempty"`
}

// Nodes returns every node, sorted by name.
func (m *Machine) Nodes() []NodeView {
	out := make([]NodeView, 0, len(m.nodes))
	for _, id := range m.nodeOrder {
		n := m.nodes[id]
		v := NodeView{Name: id, Domain: n.domain, State: n.state, Draining: n.draining, Suspect: n.suspect, Drives: slices.Clone(n.drives)}
		for _, name := range m.arrayOrder {
			if a := m.arrays[name]; a.owner == id && a.phase != phaseIdle {
				v.Owns = append(v.Owns, name)
			}
		}
		out = append(out, v)
	}
	return out
}

// Arrays returns every array, sorted by name.
func (m *Machine) Arrays() []ArrayView {
	out := make([]ArrayView, 0, len(m.arrays))
	for _, name := range m.arrayOrder {
		out = append(out, m.view(m.arrays[name]))
	}
	return out
}

// Array returns one array's view.
func (m *Machine) Array(name string) (ArrayView, bool) {
	a, ok := m.arrays[name]
	if !ok {
		return ArrayView{}, false
	}
	return m.view(a), true
}

func (m *Machine) view(a *array) ArrayView {
	v := ArrayView{Name: a.name, Level: a.level.String(), Home: a.home, Epoch: a.epoch, State: m.state(a), Phase: a.phase.String(), Policy: a.policy}
	if a.phase != phaseIdle {
		v.Owner = a.owner
	}
	for _, mb := range a.members {
		v.Members = append(v.Members, MemberView{Drive: mb.drive, Node: mb.node, State: mb.state, Progress: mb.progress})
		if absentState(mb.state) {
			v.Missing = append(v.Missing, mb.drive)
		}
	}
	v.Reason = m.reason(a, v.State)
	v.LastError, v.Failures = a.lastErr, a.fails
	if a.errMember != "" {
		for _, mb := range a.members {
			if mb.drive == a.errMember {
				v.Failures = mb.fails
			}
		}
	}
	if v.LastError == "" {
		v.Failures = 0
	}
	return v
}

// reason explains a failed or offline state. It depends on the machine's
// decisions only, not on the tick, so the published view changes only
// when they do.
func (m *Machine) reason(a *array, st ArrayState) string {
	switch st {
	case StateFailed:
		var r string
		if a.failedBy != "" {
			r = fmt.Sprintf("failed on %s: %s", a.failedBy, a.failed)
		} else if a.failed != "" && a.readable() {
			r = "failed: " + a.failed
		} else {
			r = fmt.Sprintf("%s lost %d of %d members, more than its parity %d", a.level, a.absent(), len(a.members), a.level.Parity())
		}
		switch {
		case !a.readable() || (a.failed != "" && a.waitBack && !a.recoverable()):
			var wait []string
			for _, mb := range a.members {
				if mb.state == MemberMissing {
					wait = append(wait, mb.drive+" (node "+mb.node+")")
				} else if mb.state != MemberOK && mb.state != MemberStale {
					wait = append(wait, mb.drive+" ("+string(mb.state)+")")
				}
			}
			if len(wait) > 0 {
				r += "; waiting for " + strings.Join(wait, ", ")
			}
		case a.phase == phaseIdle || a.phase == phaseFailed:
			r += "; to be assembled again"
		default:
			r += fmt.Sprintf("; being assembled again on %s at epoch %d", a.owner, a.epoch)
		}
		return r
	case StateOffline:
		switch {
		case a.owner != "" && a.phase != phaseIdle && m.nodes[a.owner].state == NodeFenced:
			return fmt.Sprintf("owner %s fenced itself; waiting for its lease to be renewed or to expire", a.owner)
		case a.phase == phaseReleasing:
			return fmt.Sprintf("hand-off from %s to %s", a.owner, a.target)
		case a.phase == phaseFencing || a.phase == phaseAssembling:
			return fmt.Sprintf("%s by %s at epoch %d", a.phase, a.owner, a.epoch)
		case a.phase == phaseIdle && a.fails > 0:
			return fmt.Sprintf("takeover backing off after %d failed attempts", a.fails)
		case a.phase == phaseIdle:
			return "no eligible node to serve it"
		}
	}
	return ""
}
