package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// stopLocked stops serving the array. abort stops it without writing
// (ownership lost); otherwise it flushes and records a clean stop.
func (s *served) stopLocked(abort bool) {
	_ = s.setANA(nvme.ANAInaccessible)
	s.gate.set(nil)
	if s.epoch != 0 {
		// Tell a coordinator rebuilding its machine that this array is not
		// served here any more (best effort: the record also ages out).
		epoch := s.epoch
		s.n.goBG(func() { s.n.publishStopped(s.cfg.Name, epoch) })
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
	s.runEpoch.Store(0)
	s.pending = map[int]string{}
	// Not run here any more: its failure is no longer this node's to
	// report, and the gate answers "not served" (unless the node is
	// fenced, which the gate keeps saying).
	s.clearFailed()
	if !s.n.isFenced() {
		s.gate.unblock()
	}
}

func (s *served) stop(abort bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(abort)
}

// owns reports whether the store names this node owner of the array at
// epoch.
func (n *Node) owns(ctx context.Context, array string, epoch uint64) (store.Ownership, bool) {
	own, err := n.ownsAt(ctx, array, epoch)
	return own, err == nil
}

// ownsAt is owns with the reason when not: the store cannot be read, or it
// names another owner or epoch.
func (n *Node) ownsAt(ctx context.Context, array string, epoch uint64) (store.Ownership, error) {
	if epoch == 0 {
		return store.Ownership{}, fmt.Errorf("the action carries no ownership epoch; it is refused (an owner-side action is always tied to the epoch that ordered it)")
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	own, err := n.st.Ownership(ctx, array)
	if err != nil {
		return own, fmt.Errorf("cannot confirm ownership of array %s at epoch %d: %w", array, epoch, err)
	}
	if own.Owner != n.me.Name || own.Epoch != epoch {
		return own, fmt.Errorf("the store names %s owner of array %s at epoch %d, not this node (%s) at epoch %d", orNobody(own.Owner), array, own.Epoch, n.me.Name, epoch)
	}
	return own, nil
}

func orNobody(s string) string {
	if s == "" {
		return "nobody"
	}
	return s
}

// newerOwner reports whether own names another owner (or epoch) newer than
// epoch: this node has been superseded for the array.
func (n *Node) newerOwner(own store.Ownership, epoch uint64) bool {
	return own.Epoch > epoch || (own.Epoch == epoch && own.Owner != "" && own.Owner != n.me.Name)
}

func (n *Node) served(name string) *served {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.arrays[name]
}

func (n *Node) isFenced() bool { return n.fenced.Load() }

// fenceErr is what the frontend answers while the node is fenced.
func (n *Node) fenceErr() error {
	why := "lease lost"
	if p := n.fenceWhy.Load(); p != nil {
		why = *p
	}
	return fmt.Errorf("node %s has fenced itself (%s) and serves no array until it holds a lease again: %w", n.me.Name, why, blockdev.ErrNoPath)
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
	got, se := s.importAll(ctx, a.NewEpoch, nil)
	if se != nil {
		s.supersededLocked(a.NewEpoch, se)
		fail(se.Error())
		return
	}
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
		// A member whose node or connection is down is missing (resynced
		// from the bitmap when it returns), not failed: only an NVMe
		// status from its drive fails it.
		Unreachable: host.IsPathError,
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
	if n.isFenced() {
		fail("this node has fenced itself (lease lost); it assembles nothing until it holds a lease again")
		return
	}
	if own, err := n.ownsAt(ctx, a.Array, a.Epoch); err != nil {
		if s.array != nil && n.newerOwner(own, s.epoch) {
			s.stopLocked(true)
		}
		fail(err.Error())
		return
	}
	if s.array != nil && s.epoch == a.Epoch && !s.arrayFailed() && s.gate.refused() == nil {
		n.sendReport(report{Kind: "assembled", Array: a.Array, Epoch: a.Epoch})
		return
	}
	if s.array != nil && s.epoch > a.Epoch {
		fail(fmt.Sprintf("ordered at epoch %d but the array runs here at the newer epoch %d", a.Epoch, s.epoch))
		return
	}
	if err := s.assembleLocked(ctx, a.Epoch, a.Degraded); err != nil {
		fail(err.Error())
		return
	}
	n.sendReport(report{Kind: "assembled", Array: a.Array, Epoch: a.Epoch})
}

// assembleLocked imports the members (leaving out degraded) under epoch and
// starts the RAID; a running array that failed (or one of an older epoch)
// is stopped first and assembled afresh from its members: the RAID engine
// takes back members that failed with the array and resyncs the stale ones.
// A newer owner's reservation on a member stops the array here
// (supersededLocked); too few members report the array failed.
func (s *served) assembleLocked(ctx context.Context, epoch uint64, degraded []string) error {
	n := s.n
	if s.array != nil {
		s.gate.set(nil)
		s.array.Abort()
		s.array = nil
		for i := range s.members {
			s.dropMember(i) // dialled afresh below: a failed member's connection may be dead
		}
		s.pending = map[int]string{}
	}
	// A coordinator that took over replays FenceDone: import what is missing.
	if _, se := s.importAll(ctx, epoch, degraded); se != nil {
		s.supersededLocked(epoch, se)
		return se
	}
	for _, d := range degraded {
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
		return err
	}
	pol := n.raidPolicy(s)
	arr, rejected, err := raid.Assemble(devs, raid.AssembleOptions{UUID: n.arrayUUID(s.cfg.Name), Epoch: epoch, Policy: pol})
	if err != nil && present == len(devs) && allNoSuperblock(rejected, len(devs)) {
		// A new array: every member is present and blank.
		arr, err = raid.Create(devs, raid.Config{Level: lvl, ChunkSize: s.cfg.ChunkKiB << 10, UUID: n.arrayUUID(s.cfg.Name), Epoch: epoch, Policy: pol})
		rejected = nil
		if err == nil {
			n.log.Info("array created", "array", s.cfg.Name, "capacity", arr.Size())
		}
	}
	if err != nil && present < len(devs) && allNoSuperblock(rejected, present) {
		// A new array with a member not reachable yet (its node still
		// starting): nothing has failed, it cannot be created until every
		// member is there. The coordinator retries the assembly.
		return fmt.Errorf("new array %s: %d of %d members reachable and blank; it is created once all %d are (waiting for %s)", s.cfg.Name, present, len(devs), len(devs), strings.Join(s.missingMembers(), ", "))
	}
	if err != nil {
		if errors.Is(err, raid.ErrTooManyFailed) {
			reason := fmt.Sprintf("assembly at epoch %d: %d of %d members reachable, but %v", epoch, present, len(devs), err)
			s.markFailed(reason)
			n.sendReport(report{Kind: "array-failed", Array: s.cfg.Name, Epoch: epoch, Reason: reason})
		}
		return err
	}
	if arr.Size() != s.gate.size {
		arr.Abort()
		return fmt.Errorf("assembled capacity %d differs from the frontend namespace size %d: the members' sizes changed", arr.Size(), s.gate.size)
	}
	s.array, s.epoch = arr, epoch
	s.runEpoch.Store(epoch)
	s.openLease = n.leaseGen.Load()
	s.clearFailed()
	s.gate.set(arr)
	s.gate.unblock()
	if n.isFenced() {
		// Fenced while assembling: the fast path may have run before the
		// gate was opened above; close it again (ANA stays inaccessible).
		s.gate.block(n.fenceErr())
	}
	// Members refused as stale come back through a delta resync.
	for _, r := range rejected {
		if r.Slot >= 0 && r.Slot < len(devs) && errors.Is(r.Err, raid.ErrStale) && devs[r.Slot] != nil {
			if err := arr.ReAdd(r.Slot, devs[r.Slot]); err == nil {
				s.pending[r.Slot] = "resync"
			}
		}
	}
	n.log.Info("assembled", "array", s.cfg.Name, "epoch", epoch, "members", present, "state", arr.Status().State)
	return nil
}

// missingMembers names the members not imported.
func (s *served) missingMembers() []string {
	var out []string
	for i, d := range s.cfg.Members {
		if i >= len(s.members) || s.members[i] == nil {
			out = append(out, d)
		}
	}
	return out
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

// doRelease stops serving the array for a planned move. It is tied to the
// epoch that ordered it: a release of an older epoch than the one the
// array runs under here is stale and refused; the stop is clean (flushed,
// superblocks recorded) only while the store still names this node owner at
// that epoch, otherwise it aborts without writing.
func (n *Node) doRelease(ctx context.Context, a cluster.Release) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.array != nil && s.epoch != a.Epoch {
		running := s.epoch
		s.mu.Unlock()
		n.log.Warn("release refused: ordered for another epoch than the array runs under here", "array", a.Array, "asked", a.Epoch, "running", running)
		return
	}
	abort := false
	if s.array != nil {
		if _, err := n.ownsAt(ctx, a.Array, a.Epoch); err != nil {
			n.log.Warn("release: this node is not the owner at the release's epoch; stopping without writing", "array", a.Array, "epoch", a.Epoch, "err", err)
			abort = true
		}
	}
	s.stopLocked(abort)
	s.mu.Unlock()
	n.log.Info("released", "array", a.Array, "epoch", a.Epoch, "to", a.To)
	n.sendReport(report{Kind: "released", Array: a.Array, Epoch: a.Epoch})
}

// doRepair brings a member back: a delta resync (ReAdd) or a full rebuild
// (Replace). It is tied to a.Epoch, the epoch of the decision: it is
// refused unless the array runs here under that epoch and the store names
// this node owner at it, and every refusal or failure is reported to the
// coordinator (repair-failed, with the reason), which retries with backoff.
func (n *Node) doRepair(ctx context.Context, a cluster.Resync, full bool) {
	kind := map[bool]string{false: "resync", true: "rebuild"}[full]
	s := n.served(a.Array)
	if s == nil {
		return
	}
	fail := func(reason string) {
		n.log.Warn("repair refused", "array", a.Array, "member", a.Member, "kind", kind, "epoch", a.Epoch, "reason", reason)
		n.sendReport(report{Kind: "repair-failed", Array: a.Array, Member: a.Member, Epoch: a.Epoch, Reason: kind + " of " + a.Member + ": " + reason})
	}
	i := s.role(a.Member)
	if i < 0 {
		fail(fmt.Sprintf("drive %s is not a member of array %s (members %v)", a.Member, a.Array, s.cfg.Members))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n.isFenced() {
		fail("this node has fenced itself (lease lost)")
		return
	}
	if s.array == nil && !s.arrayFailed() {
		fail("the array is not running on this node")
		n.notServing(a.Array, kind+" of "+a.Member)
		return
	}
	if s.epoch != a.Epoch && !legacyStaleRepair.Load() {
		fail(fmt.Sprintf("ordered at epoch %d but the array runs here under epoch %d", a.Epoch, s.epoch))
		return
	}
	if own, err := n.ownsAt(ctx, a.Array, a.Epoch); err != nil && !legacyStaleRepair.Load() {
		if n.newerOwner(own, s.epoch) {
			// Superseded: stop acting as owner of this array at once.
			s.stopLocked(true)
			if own.Owner != "" {
				n.sendReport(report{Kind: "ownership-lost", Array: a.Array, Epoch: a.Epoch, Winner: own.Owner, WinnerEpoch: own.Epoch})
			}
		}
		fail(err.Error())
		return
	}
	if s.arrayFailed() {
		// A failed array comes back by a fresh assembly from its members
		// (those that failed with it are current), not member by member.
		why := s.failReason()
		if err := s.assembleLocked(ctx, a.Epoch, nil); err != nil {
			fail("the array failed (" + why + ") and re-assembling it from its members failed: " + err.Error())
			return
		}
		n.log.Info("failed array re-assembled", "array", a.Array, "epoch", a.Epoch)
		n.sendReport(report{Kind: "assembled", Array: a.Array, Epoch: a.Epoch})
		n.recordEvent("array-recovered", a.Array, a.Epoch, "re-assembled from its members after: "+why)
	}
	// The RAID engine's view of the member decides, not only the record
	// of a repair started here: a repair whose member was lost again
	// before it ended left that record behind (nemesis seed 411: "repair
	// already running" for ever).
	st := s.array.Status()
	state := ""
	if i < len(st.Members) {
		state = st.Members[i].State
	}
	switch k, ok := s.pending[i]; {
	case state == "active":
		delete(s.pending, i)
		n.sendReport(report{Kind: kind + "-done", Array: a.Array, Member: a.Member, Epoch: s.epoch})
		return
	case state == "rebuilding" && full && k != "rebuild":
		// A full rebuild is asked for (the drive was replaced) while the
		// member resyncs from its old contents: that resync is void.
		if err := s.array.FailMember(i, "replaced: rebuilt in full"); err != nil {
			fail(err.Error())
			return
		}
		delete(s.pending, i)
	case state == "rebuilding":
		// Running, or stopped on stripes that lack data: its member and
		// connection stay (closing them would fail the member); queue it
		// again, it ends with a done or failed report.
		if !ok {
			k = kind
			s.pending[i] = kind
		}
		if err := s.array.Resume(i); err != nil {
			delete(s.pending, i)
			fail(err.Error())
			return
		}
		n.log.Info("repair already running", "array", a.Array, "member", a.Member, "kind", k)
		return
	case ok:
		n.log.Warn("the repair started earlier ended without a report (its member was lost again); starting it again",
			"array", a.Array, "member", a.Member, "kind", k, "state", state, "reason", st.Members[i].Reason)
		delete(s.pending, i)
	}
	s.dropMember(i)
	c, ns, err := n.importMember(ctx, a.Array, a.Member)
	if err == nil {
		if err = n.fenceMember(ns, a.Member, s.epoch); err != nil {
			c.Close()
		}
	}
	var se *SupersededError
	if errors.As(err, &se) {
		s.supersededLocked(a.Epoch, se)
		fail(se.Error())
		return
	}
	if err != nil {
		fail("member not reachable yet: " + err.Error())
		return
	}
	s.members[i], s.ctrls[i] = ns, c
	if full {
		err = s.array.Replace(i, ns)
	} else {
		err = s.array.ReAdd(i, ns)
	}
	if err != nil {
		s.dropMember(i)
		fail(err.Error())
		return
	}
	s.pending[i] = kind
	n.log.Info("repair started", "array", a.Array, "member", a.Member, "full", full, "epoch", a.Epoch)
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
		s.n.goBG(func() {
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
		})
	case raid.RebuildProgress, raid.ResyncProgress:
		if member != "" && ev.Total > 0 {
			pct := int(ev.Done * 100 / ev.Total)
			s.n.goBG(func() {
				s.mu.Lock()
				epoch := s.epoch
				s.mu.Unlock()
				s.n.sendReport(report{Kind: "progress", Array: s.cfg.Name, Member: member, Percent: pct, Epoch: epoch})
			})
		}
	case raid.Fenced:
		// A member refused our writes: another node owns the array now.
		s.n.goBG(func() {
			s.n.log.Warn("array fenced by a newer owner; stopping it", "array", s.cfg.Name)
			s.stop(true)
		})
	case raid.MemberFailed:
		s.n.log.Warn("member failed", "array", s.cfg.Name, "member", member, "reason", ev.Reason)
	case raid.ArrayFailed:
		// More members lost than the parity: stop serving at once with the
		// reason (gate first, from this goroutine; it takes no lock), then
		// tell the coordinator. The array is re-assembled from its members
		// when they return (Assemble, Resync, or the owner's own retry).
		reason := ev.Reason
		if reason == "" {
			reason = "more members failed than the RAID level tolerates"
		}
		s.failure.Store(&reason)
		s.gate.block(fmt.Errorf("array %s failed on node %s: %s; it is served again once enough members return: %w", s.cfg.Name, s.n.me.Name, reason, blockdev.ErrNoPath))
		epoch := s.runEpoch.Load()
		s.n.goBG(func() {
			s.markFailed(reason)
			s.n.log.Error("array failed: stopped serving it", "array", s.cfg.Name, "epoch", epoch, "reason", reason)
			s.n.sendReport(report{Kind: "array-failed", Array: s.cfg.Name, Epoch: epoch, Reason: reason})
			s.n.recordEvent("array-failed", s.cfg.Name, epoch, reason)
		})
	case raid.ScrubStarted, raid.ScrubMismatch, raid.ScrubDone:
		s.onScrubEvent(ev)
	case raid.TaskFailed:
		s.onTaskFailed(ev, member)
	case raid.StripesUnavailable:
		// Not an array failure: stripes that lack data fail their I/O, the
		// rest is served; say so where people look.
		epoch := s.runEpoch.Load()
		s.n.goBG(func() {
			msg := fmt.Sprintf("%d stripes unavailable: %s", ev.Count, ev.Reason)
			if ev.Count == 0 {
				msg = "every stripe available again"
			}
			s.n.log.Warn(msg, "array", s.cfg.Name, "member", member)
			s.n.recordEvent("stripes-unavailable", s.cfg.Name, epoch, msg)
		})
	}
}

func (s *served) onTaskFailed(ev raid.Event, member string) {
	if ev.Member < 0 && strings.HasPrefix(ev.Reason, "scrub") {
		s.onScrubEvent(ev)
		return
	}
	epoch := s.runEpoch.Load()
	s.n.goBG(func() {
		s.mu.Lock()
		kind := ""
		if ev.Member >= 0 {
			kind = s.pending[ev.Member]
			delete(s.pending, ev.Member)
		}
		s.mu.Unlock()
		s.n.log.Warn("background task failed", "array", s.cfg.Name, "member", member, "reason", ev.Reason)
		if kind != "" && member != "" {
			s.n.sendReport(report{Kind: "repair-failed", Array: s.cfg.Name, Member: member, Epoch: epoch, Reason: kind + " of " + member + " failed: " + ev.Reason})
		}
		s.n.recordEvent("task-failed", s.cfg.Name, epoch, ev.Reason)
	})
}

// selfFence stops acting as owner of anything. Its first part takes no
// lock that an action (s.mu, held across dials and assembly) or a request
// in flight can hold, so it is bounded by itself: set the node's fenced
// flag, close every array's gate (an atomic checked by every request
// before and after the RAID call: from here on no read or write of this
// node completes successfully), and turn every ANA state inaccessible
// (anaMu, held only around the target's state change). selfFence returns
// when that is done. Stopping the arrays — aborting the RAID without
// writing, closing the member connections — follows in the background,
// each under its array's task lock, for arrays opened under the lost
// lease (an array assembled under a later lease is left alone).
// docs/CONTROL-PLANE.md states the bound.
func (n *Node) selfFence(reason string) {
	n.fenceWhy.Store(&reason)
	n.fenced.Store(true)
	gen := n.leaseGen.Load()
	err := n.fenceErr()
	for _, s := range n.arrayList {
		s.gate.block(err)
	}
	for _, s := range n.arrayList {
		if aerr := s.setANA(nvme.ANAInaccessible); aerr != nil {
			n.log.Warn("self-fence: ANA change failed (the gate refuses I/O regardless)", "array", s.cfg.Name, "err", aerr)
		}
	}
	n.log.Warn("self-fenced: every array's frontend refuses I/O and is ANA inaccessible; stopping the arrays", "reason", reason)
	if n.metrics != nil {
		n.metrics.Fenced.Set(1)
	}
	for _, s := range n.arrayList {
		n.goBG(func() { s.stopFenced(gen) })
	}
}

// stopFenced stops the array if it was opened under lease generation gen
// or earlier (the lease whose loss fenced the node).
func (s *served) stopFenced(gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.array != nil && s.openLease > gen {
		return
	}
	s.stopLocked(true)
}

// doFailMember fails a member of a running array on the operator's word,
// under the epoch the request was made at.
func (n *Node) doFailMember(ctx context.Context, a failMember) {
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
	if s.epoch != a.Epoch {
		n.log.Warn("fail member refused: ordered for another epoch", "array", a.Array, "member", a.Member, "asked", a.Epoch, "running", s.epoch)
		return
	}
	if _, err := n.ownsAt(ctx, a.Array, a.Epoch); err != nil {
		n.log.Warn("fail member refused", "array", a.Array, "member", a.Member, "err", err)
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
	_, _ = n.st.Put(ctx, store.Observed, "arrays", array, observedArray{Owner: n.me.Name, Epoch: epoch, Serving: false, Time: n.clk().Now()})
}

// recordEvent appends an entry to the cluster's event log (best effort:
// the log is for people; the coordinator has the report).
func (n *Node) recordEvent(kind, array string, epoch uint64, msg string) {
	if n.st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := n.st.AppendEvent(ctx, store.Event{Kind: kind, Array: array, Node: n.me.Name, Epoch: epoch, Message: msg}); err != nil {
		n.log.Debug("event not recorded", "kind", kind, "array", array, "err", err)
	}
}

// retryFailed re-assembles the failed arrays this node owns, so that an
// array comes back on its own once enough members return. It skips an
// array whose task lock is busy (an action is running on it).
func (n *Node) retryFailed(ctx context.Context) {
	for _, s := range n.arrayList {
		if !s.arrayFailed() && !n.isFenced() && s.mu.TryLock() {
			n.readdMissingLocked(ctx, s)
			s.mu.Unlock()
			continue
		}
		if !s.arrayFailed() || n.isFenced() || !s.mu.TryLock() {
			continue
		}
		func() {
			defer s.mu.Unlock()
			epoch := s.epoch
			if epoch == 0 || !s.arrayFailed() {
				return
			}
			if own, err := n.ownsAt(ctx, s.cfg.Name, epoch); err != nil {
				if n.newerOwner(own, epoch) {
					s.clearFailed()
					s.stopLocked(true)
				}
				return
			}
			why := s.failReason()
			if err := s.assembleLocked(ctx, epoch, nil); err != nil {
				n.log.Info("failed array: not enough members back yet", "array", s.cfg.Name, "epoch", epoch, "err", err)
				return
			}
			n.log.Info("failed array re-assembled: members returned", "array", s.cfg.Name, "epoch", epoch)
			n.sendReport(report{Kind: "assembled", Array: s.cfg.Name, Epoch: epoch})
			n.recordEvent("array-recovered", s.cfg.Name, epoch, "re-assembled from its members after: "+why)
		}()
	}
}

// goBG runs f in the background, tracked, so that shutdown (and a test)
// can wait for it before closing the store it writes to.
func (n *Node) goBG(f func()) {
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		f()
	}()
}

// readdMissingLocked re-adds the members that the RAID engine holds as
// missing (they stopped answering, or were away at the assembly) once
// they answer again, under a resync (ReAdd): the coordinator orders a
// resync only for a member whose node it saw go and return, not for one
// behind a stalled or partitioned link while its node stayed up (nemesis
// seed 201: an array re-assembled with a member away stayed degraded
// with stripes lacking data). Caller holds s.mu; members not reachable
// yet are tried again on the next call.
func (n *Node) readdMissingLocked(ctx context.Context, s *served) {
	if s.array == nil || s.epoch == 0 {
		return
	}
	st := s.array.Status()
	var want []int
	for i, ms := range st.Members {
		if _, busy := s.pending[i]; ms.State == "missing" && !busy && i < len(s.cfg.Members) {
			want = append(want, i)
		}
	}
	if len(want) == 0 {
		return
	}
	if _, err := n.ownsAt(ctx, s.cfg.Name, s.epoch); err != nil {
		return
	}
	// A drive the coordinator holds failed or replaced (the operator's
	// word) is its to repair, by a full rebuild: not re-added here.
	decided := map[string]cluster.MemberState{}
	if v, err := n.view(ctx); err == nil {
		for _, av := range v.Arrays {
			if av.Name == s.cfg.Name {
				for _, mv := range av.Members {
					decided[mv.Drive] = mv.State
				}
			}
		}
	}
	for _, i := range want {
		drive := s.cfg.Members[i]
		if st := decided[drive]; st == cluster.MemberDriveFailed || st == cluster.MemberReplaced || st == cluster.MemberRebuilding {
			continue
		}
		s.dropMember(i)
		c, ns, err := n.importMember(ctx, s.cfg.Name, drive)
		if err == nil {
			if err = n.fenceMember(ns, drive, s.epoch); err != nil {
				c.Close()
			}
		}
		var se *SupersededError
		if errors.As(err, &se) {
			s.supersededLocked(s.epoch, se)
			return
		}
		if err != nil {
			n.log.Debug("missing member not reachable yet", "array", s.cfg.Name, "member", drive, "err", err)
			continue
		}
		s.members[i], s.ctrls[i] = ns, c
		if err := s.array.ReAdd(i, ns); err != nil {
			s.dropMember(i)
			n.log.Info("missing member reachable again but not re-added", "array", s.cfg.Name, "member", drive, "err", err)
			continue
		}
		s.pending[i] = "resync"
		n.log.Info("missing member reachable again: resync started", "array", s.cfg.Name, "member", drive, "epoch", s.epoch)
	}
}
