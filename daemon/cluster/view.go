package cluster

import "slices"

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
	Phase   string         `json:"phase"` // idle, releasing, fencing, assembling, active
	Policy  FailbackPolicy `json:"failback"`
	Members []MemberView   `json:"members"`
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
	}
	return v
}
