package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// memberOptions are the timeouts and failure behaviour of a member
// drive's controller (the rest is filled in by dialMember).
func memberOptions(p config.Policies) host.Options {
	return host.Options{
		KATO:            5 * time.Second,
		IOTimeout:       p.MemberIOTimeout.D(),
		DialTimeout:     2 * time.Second,
		ReconnectDelay:  200 * time.Millisecond,
		CtrlLossTimeout: time.Second,
		// The array is the redundancy: I/O to a member whose connection
		// is down fails at once and the array goes degraded (the member
		// is missing, resynced from the bitmap when back) instead of
		// waiting for the reconnect and for the lost writes' quiesce.
		FailFast: true,
		// A member's connection does not go on to its drive node's next
		// boot (the drive's volatile cache may be lost with it): its I/O
		// fails as a path error, the member is missing, and the re-add
		// imports it afresh, whose incarnation (host.Namespace, from the
		// target's Identify Controller) tells raid to catch it up.
		OneIncarnation: true,
	}
}

// dialMember imports one member drive over the backend fabric: NVMe/TCP
// with tr nil, else over tr (NVMe/RDMA: dialMemberRDMA).
func (n *Node) dialMember(ctx context.Context, arrayName, drive string, tr transport.Transport) (*host.Controller, *host.Namespace, error) {
	node, _, ok := n.cfg.Drive(drive)
	if !ok {
		return nil, nil, fmt.Errorf("drive %s is not in the site config", drive)
	}
	nsid := uint32(max(1, slices.Index(n.cfg.DriveShares(drive), arrayName)+1))
	f := n.cfg.Fabrics.Backend
	secret, err := config.Secret(f.DHCHAPSecret)
	if err != nil {
		return nil, nil, fmt.Errorf("fabrics.backend.dhchap_secret: %w", err)
	}
	ctrlSecret, err := config.Secret(f.DHCHAPCtrlSecret)
	if err != nil {
		return nil, nil, fmt.Errorf("fabrics.backend.dhchap_ctrl_secret: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	o := memberOptions(n.cfg.Policies)
	o.SubNQN, o.HostNQN, o.HostID = n.cfg.DriveNQN(drive), hostNQN(n.cfg, n.me.Name), hostID(n.cfg, n.me.Name)
	o.IOQueues, o.QueueDepth = max(1, f.Queues), max(16, f.QueueDepth)
	o.HeaderDigest, o.DataDigest = f.HeaderDigest, f.DataDigest
	o.DHCHAPSecret, o.DHCHAPCtrlSecret = secret, ctrlSecret
	o.Logger = n.log.With("member", drive)
	o.Transport = tr
	c, err := host.Dial(dctx, node.AdvertiseAddr(node.Backend), o)
	if err != nil {
		return nil, nil, fmt.Errorf("import member %s from node %s: %w", drive, node.Name, err)
	}
	ns, err := c.Namespace(nsid)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("import member %s namespace %d: %w", drive, nsid, err)
	}
	return c, ns, nil
}

// SupersededError: a member's reservation is held under a key (an
// ownership epoch) at least as new as the one this node acts under. The
// node does not own the array at that epoch any more and must stop acting
// as its owner; it never preempts such a holder.
type SupersededError struct {
	Member string // drive (or namespace, until the caller names the drive)
	Holder string // node holding the reservation ("" when not one of the site's nodes)
	Key    uint64 // the holder's key
	Ours   uint64 // the key (epoch) this node acted under
}

func (e *SupersededError) Error() string {
	who := e.Holder
	if who == "" {
		who = "a host that is not a node of this site"
	}
	return fmt.Sprintf("member %s is reserved by %s under epoch %d, not older than this node's epoch %d: a newer owner fenced it; this node stops serving the array instead of taking the member back",
		e.Member, who, e.Key, e.Ours)
}

// fenceMember is fenceNS for one member drive (errors name it).
func (n *Node) fenceMember(ns Member, drive string, key uint64) error {
	err := n.fenceNS(ns, key)
	var se *SupersededError
	if errors.As(err, &se) {
		se.Member = drive
		return se
	}
	if err != nil {
		return fmt.Errorf("member %s: %w", drive, err)
	}
	return nil
}

// nodeOfHost names the site node with NVMe host ID id ("" when none).
func (n *Node) nodeOfHost(id [16]byte) string {
	for _, o := range n.cfg.Nodes {
		if hostID(n.cfg, o.Name) == id {
			return o.Name
		}
	}
	return ""
}

// fenceNS makes this node the reservation holder of a member under key,
// the ownership epoch of the action. The rule: the reservation key is the
// epoch, and no node ever preempts a holder whose key is greater than or
// equal to its own — that holder is a newer (or concurrent) owner, so
// fenceNS returns a *SupersededError and the caller fences itself for the
// array. Only an older holder is preempted and aborted. The backend target
// enforces the same rule (EpochFencing), so a holder that changes between
// the report and the preempt is never overtaken either.
func (n *Node) fenceNS(ns Member, key uint64) error {
	member := fmt.Sprintf("namespace %d", ns.NSID())
	me := hostID(n.cfg, n.me.Name)
	superseded := func(r nvme.Registrant) error {
		return &SupersededError{Member: member, Holder: n.nodeOfHost(r.HostID), Key: r.RKey, Ours: key}
	}
	holderOf := func() (nvme.Registrant, bool, error) {
		st, err := ns.Report()
		if err != nil {
			return nvme.Registrant{}, false, fmt.Errorf("reservation report: %w", err)
		}
		for _, r := range st.Registrants {
			if r.Holder {
				return r, true, nil
			}
		}
		return nvme.Registrant{}, false, nil
	}
	h, held, err := holderOf()
	if err != nil {
		return err
	}
	if held && h.HostID == me && h.RKey == key {
		return nil
	}
	if held && h.RKey >= key && !legacyStaleRepair.Load() {
		// Checked before registering: a stale node must not even lower
		// its own registration (or the holder's, when it is itself).
		return superseded(h)
	}
	if err := ns.Register(nvme.ResvRegister, 0, key, false); err != nil {
		if err2 := ns.Register(nvme.ResvReplace, 0, key, true); err2 != nil {
			return fmt.Errorf("register key %d: %w (replace: %v)", key, err, err2)
		}
	}
	switch {
	case held && h.HostID == me:
		// Our own older reservation: the replace above raised its key.
	case held:
		err = ns.Acquire(nvme.ResvPreemptAndAbort, nvme.ResvWriteExclusive, key, h.RKey)
		if err != nil {
			err = fmt.Errorf("preempt-and-abort of holder key %d: %w", h.RKey, err)
		}
	default:
		err = ns.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, key, 0)
		if err != nil {
			err = fmt.Errorf("acquire with key %d: %w", key, err)
		}
	}
	// Whatever happened, the member's state decides: this node holds it
	// under key, or someone at least as new does (a preempt that raced
	// with a newer owner only removed registrants of the old key).
	h2, held2, rerr := holderOf()
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	if held2 && h2.HostID == me && h2.RKey == key {
		return nil
	}
	if held2 && h2.RKey >= key && h2.HostID != me {
		return superseded(h2)
	}
	if err == nil {
		err = fmt.Errorf("not the reservation holder under key %d after acquiring it (holder key %d, held %v); retry the fence", key, h2.RKey, held2)
	}
	return err
}

// importAll dials every member not imported yet, in parallel, and fences
// each with key. Members that cannot be reached or fenced stay nil. When a
// member is held under a key at least as new as key, the node has been
// superseded: importAll returns that error and the caller must stop acting
// as the array's owner (no member is fenced under the stale key).
func (s *served) importAll(ctx context.Context, key uint64, skip []string) (int, *SupersededError) {
	n := s.n
	if s.members == nil {
		s.members = make([]Member, len(s.cfg.Members))
		s.ctrls = make([]MemberConn, len(s.cfg.Members))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var superseded *SupersededError
	noteSuperseded := func(err error) {
		var se *SupersededError
		if errors.As(err, &se) {
			mu.Lock()
			if superseded == nil || se.Key > superseded.Key {
				superseded = se
			}
			mu.Unlock()
		}
	}
	for i, d := range s.cfg.Members {
		if s.members[i] != nil || slices.Contains(skip, d) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, ns, err := n.importMember(ctx, s.cfg.Name, d)
			if err == nil {
				if err = n.fenceMember(ns, d, key); err != nil {
					c.Close()
				}
			}
			if err != nil {
				noteSuperseded(err)
				n.log.Warn("member not imported", "array", s.cfg.Name, "member", d, "err", err)
				return
			}
			mu.Lock()
			s.members[i], s.ctrls[i] = ns, c
			mu.Unlock()
		}()
	}
	wg.Wait()
	if superseded != nil {
		return 0, superseded
	}
	// Members already imported get the new key too.
	count := 0
	for i, ns := range s.members {
		if ns == nil {
			continue
		}
		if err := n.fenceMember(ns, s.cfg.Members[i], key); err != nil {
			noteSuperseded(err)
			n.log.Warn("member fence failed", "array", s.cfg.Name, "member", s.cfg.Members[i], "err", err)
			s.dropMember(i)
			continue
		}
		count++
	}
	if superseded != nil {
		return 0, superseded
	}
	return count, nil
}

// supersededLocked fences this node for one array after a member showed a
// newer owner's reservation: stop without writing, tell the coordinator.
func (s *served) supersededLocked(epoch uint64, se *SupersededError) {
	n := s.n
	n.log.Warn("a newer owner holds the array's members; stopping it here", "array", s.cfg.Name, "epoch", epoch, "err", se)
	s.stopLocked(true)
	if se.Holder == "" {
		return
	}
	n.sendReport(report{Kind: "ownership-lost", Array: s.cfg.Name, Epoch: epoch, Winner: se.Holder, WinnerEpoch: se.Key})
}

func (s *served) dropMember(i int) {
	if s.ctrls != nil && s.ctrls[i] != nil {
		s.ctrls[i].Close()
	}
	if s.members != nil {
		s.members[i], s.ctrls[i] = nil, nil
	}
}
