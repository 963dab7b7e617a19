package cluster

// stepOperator applies an operator's requests: drain a node (move its
// arrays off and give it no new ones), undrain it, fail an array back to
// its home now.
func (m *Machine) stepOperator(ev Event) error {
	switch e := ev.(type) {
	case DrainRequested:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if !n.draining {
			n.draining = true
			m.record(kindDrain, RecordEvent{Node: n.id})
			m.clearRetry()
		}
	case UndrainRequested:
		n, err := m.node(e.Node)
		if err != nil {
			return err
		}
		if n.draining {
			n.draining = false
			m.record(kindUndrain, RecordEvent{Node: n.id})
			m.clearRetry()
		}
	case FailbackRequested:
		a, err := m.array(e.Array)
		if err != nil {
			return err
		}
		a.asked, a.retryAt = true, 0
	default:
		return badEvent(ev)
	}
	return nil
}
