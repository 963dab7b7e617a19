package node

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/raid"
)

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
		Unreachable: memberUnreachable,
		Logger:      n.log.With("array", s.cfg.Name),
		Listener:    s.onEvent,
		// Reads around a stalled or dead member (issue 15: no array
		// stalls on one member): a read not answered by the deadline is
		// rebuilt from the other members.
		SlowRead: p.MemberSlowRead.D(),

		SlowWrite: p.MemberSlowWrite.D(), // writes around such a member (it goes missing; resynced when it answers)
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
	// Members refused as stale come back through a delta resync, but for
	// a drive the coordinator holds failed (its errors, or the
	// operator's word): it is replaced and rebuilt in full, as
	// readdMissingLocked leaves it. Taken back here, it ran in sync
	// while every view held it failed, and the array's next loss was
	// counted as a second one (sim seed 502924: unserved for good).
	failed := s.drivesHeldFailed(ctx)
	for _, r := range rejected {
		if r.Slot >= 0 && r.Slot < len(devs) && failed[s.cfg.Members[r.Slot]] {
			n.log.Info("member refused as stale at assembly left out: the coordinator holds its drive failed, to be replaced", "array", s.cfg.Name, "member", s.cfg.Members[r.Slot])
			continue
		}
		if r.Slot >= 0 && r.Slot < len(devs) && errors.Is(r.Err, raid.ErrStale) && devs[r.Slot] != nil {
			if err := arr.ReAdd(r.Slot, devs[r.Slot]); err == nil {
				s.pending[r.Slot] = "resync"
			} else {
				s.staleNotReadded(r.Slot, r.Reason, err)
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

// retryFailed re-assembles the failed arrays this node owns, so that an
// array comes back on its own once enough members return. It skips an
// array whose task lock is busy (an action is running on it).
func (n *Node) retryFailed(ctx context.Context) {
	for _, s := range n.servedAll() {
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

// drivesHeldFailed names the members of s whose drive the coordinator
// holds failed (awaiting replacement); none when the view is unreadable.
func (s *served) drivesHeldFailed(ctx context.Context) map[string]bool {
	out := map[string]bool{}
	v, err := s.n.view(ctx)
	if err != nil {
		return out
	}
	for _, av := range v.Arrays {
		if av.Name == s.cfg.Name {
			for _, mv := range av.Members {
				if mv.State == cluster.MemberDriveFailed {
					out[mv.Drive] = true
				}
			}
		}
	}
	return out
}
