package target

import (
	"fmt"
	"slices"

	"tier0/daemon/nvme"
)

// Per-namespace host allow-lists. A namespace may be limited to some of
// the hosts its subsystem admits (NamespaceConfig.Hosts): to any other
// host's controllers it is an inactive NSID, absent from the Active
// Namespace ID list, all zeroes in Identify Namespace, and every command
// naming it fails with Invalid Namespace or Format, exactly as an NSID
// with no namespace. Nil or empty: every admitted host.

// nsHosts is a namespace's allow-list; nil: every admitted host.
type nsHosts map[string]bool

func newNSHosts(hosts []string) (nsHosts, error) {
	if len(hosts) == 0 {
		return nil, nil
	}
	m := nsHosts{}
	for _, h := range hosts {
		if err := validNQN(h); err != nil {
			return nil, fmt.Errorf("namespace allowed host: %w", err)
		}
		m[h] = true
	}
	return m, nil
}

// visibleTo reports whether the host with that NQN may see and use ns.
func (ns *namespace) visibleTo(hostNQN string) bool {
	h := ns.hosts.Load()
	return h == nil || (*h)[hostNQN]
}

// namespace is the subsystem's namespace nsid if this controller's host
// may see it, else nil.
func (c *controller) namespace(nsid uint32) *namespace {
	ns := c.sub.namespace(nsid)
	if ns == nil || !ns.visibleTo(c.hostNQN) {
		return nil
	}
	return ns
}

// nsids are the namespace IDs this controller's host may see, ascending.
func (c *controller) nsids() []uint32 {
	return slices.DeleteFunc(c.sub.nsids(), func(id uint32) bool { return c.namespace(id) == nil })
}

// SetNamespaceHosts replaces the hosts allowed to see and use a namespace
// (nil or empty: every host the subsystem admits). Every connected
// controller is told its namespace list changed, so that hosts rescan: a
// newly allowed host finds the namespace, a host no longer allowed drops
// it. Commands a removed host has already started complete; every later
// one fails with Invalid Namespace or Format.
func (t *Target) SetNamespaceHosts(subnqn string, nsid uint32, hosts []string) error {
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	m, err := newNSHosts(hosts)
	if err != nil {
		return fmt.Errorf("namespace %d of %s: %w", nsid, subnqn, err)
	}
	s.mu.RLock()
	ns, ok := s.ns[nsid]
	ctrls := s.ctrlsLocked()
	s.mu.RUnlock()
	if !ok {
		return fmt.Errorf("namespace %d of %s: %w", nsid, subnqn, ErrNotFound)
	}
	ns.setHosts(m)
	for _, c := range ctrls {
		c.nsChanged(nsid)
	}
	t.log.Info("namespace hosts set", "subnqn", subnqn, "nsid", nsid, "hosts", len(m))
	return nil
}

func (ns *namespace) setHosts(m nsHosts) {
	if m == nil {
		ns.hosts.Store(nil)
		return
	}
	ns.hosts.Store(&m)
}

// anaLog is the subsystem's ANA log page as this controller's host sees
// it: the groups' NSID lists hold only the namespaces it may see.
func (c *controller) anaLog() nvme.ANALog {
	l := c.sub.anaLog()
	for i := range l.Groups {
		d := &l.Groups[i]
		d.NSIDs = slices.DeleteFunc(d.NSIDs, func(id uint32) bool { return c.namespace(id) == nil })
	}
	return l
}
