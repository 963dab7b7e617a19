package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/raid"
	"tier0/daemon/store"
)

// The owner's side of a takeover, in the order the state machine asks for
// it: Fence (claim the epoch in the store, import the members, register
// the epoch as reservation key and preempt-and-abort the old owner on
// every member), Assemble (start the RAID; replay the partial parity log),
// SetANA optimized. A planned hand-off starts with Release on the old
// owner. Every step checks the store's ownership record first.

func (s *served) role(drive string) int { return slices.Index(s.cfg.Members, drive) }

// arrayUUID is the RAID UUID of a configured array: derived from its name,
// so that any node can assemble it and no other array's member is taken.
func (n *Node) arrayUUID(name string) [16]byte { return derive16("raid", n.cfg.Cluster, name) }

// dialMember imports one member drive over the backend fabric.
func (n *Node) dialMember(ctx context.Context, arrayName, drive string) (*host.Controller, *host.Namespace, error) {
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
	c, err := host.Dial(dctx, node.AdvertiseAddr(node.Backend), host.Options{
		SubNQN:           n.cfg.DriveNQN(drive),
		HostNQN:          hostNQN(n.cfg, n.me.Name),
		HostID:           hostID(n.cfg, n.me.Name),
		IOQueues:         max(1, f.Queues),
		QueueDepth:       max(16, f.QueueDepth),
		HeaderDigest:     f.HeaderDigest,
		DataDigest:       f.DataDigest,
		KATO:             5 * time.Second,
		IOTimeout:        n.cfg.Policies.MemberIOTimeout.D(),
		DialTimeout:      2 * time.Second,
		ReconnectDelay:   200 * time.Millisecond,
		CtrlLossTimeout:  time.Second,
		DHCHAPSecret:     secret,
		DHCHAPCtrlSecret: ctrlSecret,
		Logger:           n.log.With("member", drive),
	})
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

// fenceNS makes this node the reservation holder of a member under key
// (the ownership epoch), preempting and aborting any other holder.
func (n *Node) fenceNS(ns *host.Namespace, key uint64) error {
	if err := ns.Register(nvme.ResvRegister, 0, key, false); err != nil {
		if err2 := ns.Register(nvme.ResvReplace, 0, key, true); err2 != nil {
			return fmt.Errorf("register key %d: %w (replace: %v)", key, err, err2)
		}
	}
	st, err := ns.Report()
	if err != nil {
		return fmt.Errorf("reservation report: %w", err)
	}
	me := hostID(n.cfg, n.me.Name)
	for _, r := range st.Registrants {
		if !r.Holder {
			continue
		}
		if r.HostID == me && r.RKey == key {
			return nil
		}
		if err := ns.Acquire(nvme.ResvPreemptAndAbort, nvme.ResvWriteExclusive, key, r.RKey); err != nil {
			return fmt.Errorf("preempt-and-abort holder key %d: %w", r.RKey, err)
		}
		return nil
	}
	if err := ns.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, key, 0); err != nil {
		return fmt.Errorf("acquire with key %d: %w", key, err)
	}
	return nil
}

// importAll dials every member not imported yet, in parallel, and fences
// each with key. Members that cannot be reached or fenced stay nil.
func (s *served) importAll(ctx context.Context, key uint64, skip []string) int {
	n := s.n
	if s.members == nil {
		s.members = make([]*host.Namespace, len(s.cfg.Members))
		s.ctrls = make([]*host.Controller, len(s.cfg.Members))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, d := range s.cfg.Members {
		if s.members[i] != nil || slices.Contains(skip, d) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, ns, err := n.dialMember(ctx, s.cfg.Name, d)
			if err == nil {
				if err = n.fenceNS(ns, key); err != nil {
					c.Close()
				}
			}
			if err != nil {
				n.log.Warn("member not imported", "array", s.cfg.Name, "member", d, "err", err)
				return
			}
			mu.Lock()
			s.members[i], s.ctrls[i] = ns, c
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Members already imported get the new key too.
	count := 0
	for i, ns := range s.members {
		if ns == nil {
			continue
		}
		if err := n.fenceNS(ns, key); err != nil {
			n.log.Warn("member fence failed", "array", s.cfg.Name, "member", s.cfg.Members[i], "err", err)
			s.dropMember(i)
			continue
		}
		count++
	}
	return count
}

func (s *served) dropMember(i int) {
	if s.ctrls != nil && s.ctrls[i] != nil {
		s.ctrls[i].Close()
	}
	if s.members != nil {
		s.members[i], s.ctrls[i] = nil, nil
	}
}

// stopLocked stops serving the array. abort stops it without writing
// (ownership lost); otherwise it flushes and records a clean stop.
func (s *served) stopLocked(abort bool) {
	_ = s.setANA(nvme.ANAInaccessible)
	s.gate.set(nil)
	if s.epoch != 0 {
		// Tell a coordinator rebuilding its machine that this array is not
		// served here any more (best effort: the record also ages out).
		go s.n.publishStopped(s.cfg.Name, s.epoch)
	}
	if s.array != nil {
		if abort {
			s.array.Abort()
		} else if err := s.array.Close(); err != nil {
			s.n.log.Warn("array close", "array", s.cfg.Name, "err", err)
		}
		s.array = nil
	}
	for i := range s.members {
		s.dropMember(i)
	}
	s.members, s.ctrls = nil, nil
	s.epoch = 0
	s.pending = map[int]string{}
}

func (s *served) stop(abort bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(abort)
}

// owns reports whether the store names this node owner of the array at
// epoch.
func (n *Node) owns(ctx context.Context, array string, epoch uint64) (store.Ownership, bool) {
	own, err := n.st.Ownership(ctx, array)
	if err != nil {
		return own, false
	}
	return own, own.Owner == n.me.Name && own.Epoch == epoch
}

func (n *Node) served(name string) *served {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.arrays[name]
}

func (n *Node) isFenced() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fenced
}

func (n *Node) doFence(ctx context.Context, a cluster.Fence) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	fail := func(reason string) {
		n.sendReport(report{Kind: "fence-failed", Array: a.Array, Epoch: a.NewEpoch, Reason: reason})
	}
	if n.isFenced() {
		fail("this node has lost its lease")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := n.st.ClaimOwnership(ctx, a.Array, n.me.Name, a.NewEpoch); err != nil {
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			n.sendReport(report{Kind: "ownership-lost", Array: a.Array, Epoch: a.NewEpoch, Winner: ce.Current.Owner, WinnerEpoch: ce.Current.Epoch})
			return
		}
		fail(err.Error())
		return
	}
	if s.array != nil && s.epoch < a.NewEpoch {
		s.stopLocked(true) // re-taking under a new epoch: start afresh
	}
	got := s.importAll(ctx, a.NewEpoch, nil)
	need := len(s.cfg.Members) - s.cfg.Parity()
	if got < need {
		fail(fmt.Sprintf("fenced %d of %d members; at least %d are needed", got, len(s.cfg.Members), need))
		return
	}
	s.epoch = a.NewEpoch
	n.log.Info("fenced", "array", a.Array, "epoch", a.NewEpoch, "members", got)
	n.sendReport(report{Kind: "fence-done", Array: a.Array, Epoch: a.NewEpoch})
}

func (n *Node) raidPolicy(s *served) raid.Policy {
	p := n.cfg.Policies
	retries := 1
	if p.MemberIORetries != nil {
		retries = *p.MemberIORetries
	}
	adaptive := p.RebuildAdaptive == nil || *p.RebuildAdaptive
	return raid.Policy{
		Retries:     retries,
		IOTimeout:   p.MemberIOTimeout.D(),
		RebuildRate: float64(p.RebuildRateMiBs),
		Adaptive:    adaptive,
		Logger:      n.log.With("array", s.cfg.Name),
		Listener:    s.onEvent,
	}
}

func (n *Node) doAssemble(ctx context.Context, a cluster.Assemble) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	fail := func(reason string) {
		n.log.Warn("assemble failed", "array", a.Array, "epoch", a.Epoch, "reason", reason)
		n.sendReport(report{Kind: "assemble-failed", Array: a.Array, Epoch: a.Epoch, Reason: reason})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := n.owns(ctx, a.Array, a.Epoch); !ok || n.isFenced() {
		fail("the store does not name this node owner at this epoch")
		return
	}
	if s.array != nil && s.epoch == a.Epoch {
		n.sendReport(report{Kind: "assembled", Array: a.Array, Epoch: a.Epoch})
		return
	}
	// A coordinator that took over replays FenceDone: import what is missing.
	s.importAll(ctx, a.Epoch, a.Degraded)
	for _, d := range a.Degraded {
		if i := s.role(d); i >= 0 {
			s.dropMember(i)
		}
	}
	devs := make([]blockdev.Device, len(s.cfg.Members))
	present := 0
	for i, ns := range s.members {
		if ns != nil {
			devs[i] = ns
			present++
		}
	}
	lvl, err := raid.ParseLevel(s.cfg.Level)
	if err != nil {
		fail(err.Error())
		return
	}
	pol := n.raidPolicy(s)
	arr, rejected, err := raid.Assemble(devs, raid.AssembleOptions{UUID: n.arrayUUID(a.Array), Epoch: a.Epoch, Policy: pol})
	if err != nil && present == len(devs) && allNoSuperblock(rejected, len(devs)) {
		// A new array: every member is present and blank.
		arr, err = raid.Create(devs, raid.Config{Level: lvl, ChunkSize: s.cfg.ChunkKiB << 10, UUID: n.arrayUUID(a.Array), Epoch: a.Epoch, Policy: pol})
		rejected = nil
		if err == nil {
			n.log.Info("array created", "array", a.Array, "capacity", arr.Size())
		}
	}
	if err != nil {
		fail(err.Error())
		return
	}
	if arr.Size() != s.gate.size {
		arr.Abort()
		fail(fmt.Sprintf("assembled capacity %d differs from the frontend namespace size %d: the members' sizes changed", arr.Size(), s.gate.size))
		return
	}
	s.array, s.epoch = arr, a.Epoch
	s.gate.set(arr)
	// Members refused as stale come back through a delta resync.
	for _, r := range rejected {
		if r.Slot >= 0 && r.Slot < len(devs) && errors.Is(r.Err, raid.ErrStale) && devs[r.Slot] != nil {
			if err := arr.ReAdd(r.Slot, devs[r.Slot]); err == nil {
				s.pending[r.Slot] = "resync"
			}
		}
	}
	n.log.Info("assembled", "array", a.Array, "epoch", a.Epoch, "members", present, "state", arr.Status().State)
	n.sendReport(report{Kind: "assembled", Array: a.Array, Epoch: a.Epoch})
}

func allNoSuperblock(rej []Rejection, n int) bool {
	if len(rej) != n {
		return false
	}
	for _, r := range rej {
		if !errors.Is(r.Err, raid.ErrNoSuperblock) {
			return false
		}
	}
	return true
}

// Rejection is raid.Rejection (named here for brevity).
type Rejection = raid.Rejection

func (n *Node) doSetANA(ctx context.Context, a cluster.SetANA) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.State == cluster.ANAOptimized {
		if a.Epoch != 0 && a.Epoch != s.epoch {
			n.log.Warn("refusing optimized ANA state for another epoch", "array", a.Array, "asked", a.Epoch, "running", s.epoch)
			return
		}
		if s.array == nil || n.isFenced() {
			n.log.Warn("refusing optimized ANA state: the array is not running here", "array", a.Array)
			if s.array == nil && !n.isFenced() {
				n.notServing(a.Array, "optimized ANA state")
			}
			return
		}
		if _, ok := n.owns(ctx, a.Array, s.epoch); !ok {
			n.log.Warn("refusing optimized ANA state: the store names another owner", "array", a.Array)
			return
		}
		if err := s.setANA(nvme.ANAOptimized); err != nil {
			n.log.Warn("ANA change failed", "array", a.Array, "err", err)
		}
		return
	}
	_ = s.setANA(nvme.ANAInaccessible)
}

func (n *Node) doRelease(a cluster.Release) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.array != nil && s.epoch > a.Epoch {
		s.mu.Unlock()
		return // a newer takeover of our own; the release is stale
	}
	s.stopLocked(false)
	s.mu.Unlock()
	n.log.Info("released", "array", a.Array, "epoch", a.Epoch, "to", a.To)
	n.sendReport(report{Kind: "released", Array: a.Array, Epoch: a.Epoch})
}

// doRepair brings a member back: a delta resync (ReAdd) or a full rebuild
// (Replace).
func (n *Node) doRepair(ctx context.Context, array, member string, full bool) {
	s := n.served(array)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.role(member)
	if i < 0 {
		return
	}
	if s.array == nil {
		n.notServing(array, "repair of "+member)
		return
	}
	if kind, ok := s.pending[i]; ok {
		n.log.Info("repair already running", "array", array, "member", member, "kind", kind)
		return
	}
	st := s.array.Status()
	if i < len(st.Members) && st.Members[i].State == "active" {
		n.sendReport(report{Kind: map[bool]string{false: "resync-done", true: "rebuild-done"}[full], Array: array, Member: member, Epoch: s.epoch})
		return
	}
	s.dropMember(i)
	c, ns, err := n.dialMember(ctx, array, member)
	if err == nil {
		if err = n.fenceNS(ns, s.epoch); err != nil {
			c.Close()
		}
	}
	if err != nil {
		n.log.Warn("repair: member not reachable yet", "array", array, "member", member, "err", err)
		return
	}
	s.members[i], s.ctrls[i] = ns, c
	if full {
		err = s.array.Replace(i, ns)
	} else {
		err = s.array.ReAdd(i, ns)
	}
	if err != nil {
		n.log.Warn("repair refused", "array", array, "member", member, "err", err)
		s.dropMember(i)
		return
	}
	s.pending[i] = map[bool]string{false: "resync", true: "rebuild"}[full]
	n.log.Info("repair started", "array", array, "member", member, "full", full)
}

// onEvent receives the RAID engine's events (from its goroutines: it must
// not block or call into the array).
func (s *served) onEvent(ev raid.Event) {
	member := ""
	if ev.Member >= 0 && ev.Member < len(s.cfg.Members) {
		member = s.cfg.Members[ev.Member]
	}
	switch ev.Kind {
	case raid.ResyncDone, raid.RebuildDone:
		go func() {
			s.mu.Lock()
			kind := s.pending[ev.Member]
			delete(s.pending, ev.Member)
			s.mu.Unlock()
			r := "rebuild-done"
			if kind == "resync" || (kind == "" && ev.Kind == raid.ResyncDone) {
				r = "resync-done"
			}
			s.mu.Lock()
			epoch := s.epoch
			s.mu.Unlock()
			if member != "" {
				s.n.sendReport(report{Kind: r, Array: s.cfg.Name, Member: member, Epoch: epoch})
			}
		}()
	case raid.RebuildProgress, raid.ResyncProgress:
		if member != "" && ev.Total > 0 {
			pct := int(ev.Done * 100 / ev.Total)
			go func() {
				s.mu.Lock()
				epoch := s.epoch
				s.mu.Unlock()
				s.n.sendReport(report{Kind: "progress", Array: s.cfg.Name, Member: member, Percent: pct, Epoch: epoch})
			}()
		}
	case raid.Fenced:
		// A member refused our writes: another node owns the array now.
		go func() {
			s.n.log.Warn("array fenced by a newer owner; stopping it", "array", s.cfg.Name)
			s.stop(true)
		}()
	case raid.MemberFailed:
		s.n.log.Warn("member failed", "array", s.cfg.Name, "member", member, "reason", ev.Reason)
	}
}

// selfFence stops acting as owner of anything: every ANA state
// inaccessible, every array stopped without writing more.
func (n *Node) selfFence(reason string) {
	n.mu.Lock()
	n.fenced = true
	arrays := make([]*served, 0, len(n.arrays))
	for _, s := range n.arrays {
		arrays = append(arrays, s)
	}
	n.mu.Unlock()
	n.log.Warn("self-fencing", "reason", reason)
	for _, s := range arrays {
		s.stop(true)
	}
}

// doFailMember fails a member of a running array on the operator's word.
func (n *Node) doFailMember(a failMember) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.role(a.Member)
	if s.array == nil || i < 0 {
		return
	}
	if err := s.array.FailMember(i, "failed by the operator"); err != nil {
		n.log.Warn("fail member", "array", a.Array, "member", a.Member, "err", err)
		return
	}
	delete(s.pending, i)
	s.dropMember(i)
	n.log.Info("member failed by the operator", "array", a.Array, "member", a.Member)
}

// notServing tells the coordinator that this node was asked to act on an
// array it does not run (it stopped it when it fenced itself, say): the
// machine then treats the node as returned and takes its arrays over again
// under new epochs, rather than waiting on a stopped array.
func (n *Node) notServing(array, what string) {
	n.log.Warn("asked to act on an array that is not running here; reporting this node as returned", "array", array, "task", what)
	n.sendReport(report{Kind: "returned", Array: array})
}

// publishStopped records that array no longer runs here.
func (n *Node) publishStopped(array string, epoch uint64) {
	if n.st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, _ = n.st.Put(ctx, store.Observed, "arrays", array, observedArray{Owner: n.me.Name, Epoch: epoch, Serving: false, Time: time.Now()})
}
