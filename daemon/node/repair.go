package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/raid"
)

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
	if !n.repairAllowedLocked(ctx, s, a, kind, fail) {
		return
	}
	if s.arrayFailed() && !n.reassembleFailedLocked(ctx, s, a, fail) {
		return
	}
	if !n.repairNeededLocked(s, i, a, kind, full, fail) {
		return
	}
	n.startRepairLocked(ctx, s, i, a, kind, full, fail)
}

// repairAllowedLocked (s.mu held) reports whether this node may repair
// array a now: it is not fenced, runs the array (or holds it failed) under
// the decision's epoch, and the store names it owner at that epoch. A
// refusal has been reported through fail; an owner found newer stops the
// array here.
func (n *Node) repairAllowedLocked(ctx context.Context, s *served, a cluster.Resync, kind string, fail func(string)) bool {
	if n.isFenced() {
		fail("this node has fenced itself (lease lost)")
		return false
	}
	if s.array == nil && !s.arrayFailed() {
		fail("the array is not running on this node")
		n.notServing(a.Array, kind+" of "+a.Member)
		return false
	}
	if s.epoch != a.Epoch && !legacyStaleRepair.Load() {
		fail(fmt.Sprintf("ordered at epoch %d but the array runs here under epoch %d", a.Epoch, s.epoch))
		return false
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
		return false
	}
	return true
}

// reassembleFailedLocked (s.mu held) brings a failed array back by a fresh
// assembly from its members (those that failed with it are current), not
// member by member. It reports whether the array runs again.
func (n *Node) reassembleFailedLocked(ctx context.Context, s *served, a cluster.Resync, fail func(string)) bool {
	why := s.failReason()
	if err := s.assembleLocked(ctx, a.Epoch, nil); err != nil {
		fail("the array failed (" + why + ") and re-assembling it from its members failed: " + err.Error())
		return false
	}
	n.log.Info("failed array re-assembled", "array", a.Array, "epoch", a.Epoch)
	n.sendReport(report{Kind: "assembled", Array: a.Array, Epoch: a.Epoch})
	n.recordEvent("array-recovered", a.Array, a.Epoch, "re-assembled from its members after: "+why)
	return true
}

// repairNeededLocked (s.mu held) reports whether role i needs a repair
// started. The RAID engine's view of the member decides, not only the
// record of a repair started here: a repair whose member was lost again
// before it ended left that record behind (nemesis seed 411: "repair
// already running" for ever). An active member is reported done; a
// running repair is resumed (or, when a full rebuild is asked of a member
// that resyncs, failed so that the rebuild starts).
func (n *Node) repairNeededLocked(s *served, i int, a cluster.Resync, kind string, full bool, fail func(string)) bool {
	st := s.array.Status()
	state := ""
	if i < len(st.Members) {
		state = st.Members[i].State
	}
	switch k, ok := s.pending[i]; {
	case state == "active":
		delete(s.pending, i)
		n.sendReport(report{Kind: kind + "-done", Array: a.Array, Member: a.Member, Epoch: s.epoch})
		return false
	case state == "rebuilding" && full && k != "rebuild":
		// A full rebuild is asked for (the drive was replaced) while the
		// member resyncs from its old contents: that resync is void.
		if err := s.array.FailMember(i, "replaced: rebuilt in full"); err != nil {
			fail(err.Error())
			return false
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
			return false
		}
		n.log.Info("repair already running", "array", a.Array, "member", a.Member, "kind", k)
		return false
	case ok:
		n.log.Warn("the repair started earlier ended without a report (its member was lost again); starting it again",
			"array", a.Array, "member", a.Member, "kind", k, "state", state, "reason", st.Members[i].Reason)
		delete(s.pending, i)
	}
	return true
}

// startRepairLocked (s.mu held) imports and fences role i's drive afresh
// and starts its resync (ReAdd) or, with full, its rebuild (Replace).
func (n *Node) startRepairLocked(ctx context.Context, s *served, i int, a cluster.Resync, kind string, full bool, fail func(string)) {
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
		if member != "" && !ev.Missing && !ev.WithArray {
			// Refused by its drive (a media error, a write fault) or
			// failed by the operator: the drive is to be replaced. The
			// coordinator holds it failed, the array degraded, until it
			// is (the owner never re-adds it: readdMissingLocked). It
			// used to hear only of the operator's failures: a drive
			// failed by its errors left the array "optimal" in every
			// view, nothing replaced it, and a second fault lost the
			// array (nemesis seed 1515020). A member unreachable is
			// taken back under a resync once it answers; one that left
			// as the array failed is as current as the survivors.
			epoch := s.runEpoch.Load()
			s.n.goBG(func() {
				s.n.sendReport(report{Kind: "member-failed", Array: s.cfg.Name, Node: s.n.me.Name, Member: member, Epoch: epoch})
			})
		}
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

// readdMissingLocked re-adds the members that the RAID engine holds as
// missing (they stopped answering, or were away at the assembly), and
// those refused as stale at the assembly whose re-add failed there, once
// they answer again, under a resync (ReAdd): the coordinator orders a
// resync only for a member whose node it saw go and return, not for one
// behind a stalled or partitioned link while its node stayed up (nemesis
// seed 201: an array re-assembled with a member away stayed degraded
// with stripes lacking data). A repair record whose repair is gone (the
// member is missing again: nemesis seed 2 in CI, "C2=stale" for good) does
// not stop it: the record is dropped, the coordinator told (repair-failed)
// and the member re-added. Each member's failed tries back off (readdRetry
// doubling to readdRetryMax) and log why. Caller holds s.mu.
func (n *Node) readdMissingLocked(ctx context.Context, s *served) {
	if s.array == nil || s.epoch == 0 {
		return
	}
	tr := readdOf(s)
	now := n.clk().Now()
	st := s.array.Status()
	var want []int
	for i, ms := range st.Members {
		if i >= len(s.cfg.Members) {
			continue
		}
		if ms.State == "active" || ms.State == "rebuilding" {
			tr.forget(i)
			continue
		}
		if ms.State != "missing" && !tr.rejected[i] {
			continue // failed by its drive or the operator: the coordinator's to repair
		}
		if now.Before(tr.next[i]) {
			continue
		}
		want = append(want, i)
	}
	if len(want) == 0 {
		return
	}
	if _, err := n.ownsAt(ctx, s.cfg.Name, s.epoch); err != nil {
		n.log.Info("members not active, not re-added: ownership not confirmed", "array", s.cfg.Name, "members", len(want), "err", err)
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
		if kind, busy := s.pending[i]; busy {
			// Its engine state says the repair is gone (the member was
			// lost again, or the re-add never took): end its record.
			delete(s.pending, i)
			n.log.Warn("repair record without a running repair (its member is not under rebuild); re-adding the member",
				"array", s.cfg.Name, "member", drive, "kind", kind, "state", st.Members[i].State, "reason", st.Members[i].Reason)
			n.sendReport(report{Kind: "repair-failed", Array: s.cfg.Name, Member: drive, Epoch: s.epoch,
				Reason: kind + " of " + drive + " ended without a report (member " + st.Members[i].State + ": " + st.Members[i].Reason + "); the owner re-adds it"})
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
			n.readdFailed(s, tr, i, now, "not reachable yet: "+err.Error())
			continue
		}
		s.members[i], s.ctrls[i] = ns, c
		if err := s.array.ReAdd(i, ns); err != nil {
			s.dropMember(i)
			n.readdFailed(s, tr, i, now, "re-add refused: "+err.Error())
			continue
		}
		tr.forget(i)
		s.pending[i] = "resync"
		n.log.Info("missing member reachable again: resync started", "array", s.cfg.Name, "member", drive, "epoch", s.epoch)
	}
}

// The owner's re-add of a member not active backs off from readdRetry,
// doubling, to readdRetryMax between failed tries.
const (
	readdRetry    = time.Second
	readdRetryMax = 30 * time.Second
)

// readdTries is an array's record of the owner's re-adds (guarded by the
// array's s.mu): members refused as stale at its assembly whose re-add
// failed there, and each member's failed tries, next try and last error.
type readdTries struct {
	rejected map[int]bool
	fails    map[int]int
	next     map[int]time.Time
	lastErr  map[int]string
}

// readdOf returns s's record (created empty). The record is s's own, so
// that it goes with the array. Caller holds s.mu.
func readdOf(s *served) *readdTries {
	if s.readd == nil {
		s.readd = &readdTries{rejected: map[int]bool{}, fails: map[int]int{}, next: map[int]time.Time{}, lastErr: map[int]string{}}
	}
	return s.readd
}

// failed records a failed try of member i and reports whether why is new
// (not the last try's reason).
func (tr *readdTries) failed(i int, now time.Time, why string) bool {
	tr.fails[i]++
	tr.next[i] = now.Add(min(readdRetry<<min(tr.fails[i]-1, 16), readdRetryMax))
	changed := tr.lastErr[i] != why
	tr.lastErr[i] = why
	return changed
}

// readdFailed records a failed re-add of member i (log; the event log, where
// `tier0 events` shows it, when the reason is new).
func (n *Node) readdFailed(s *served, tr *readdTries, i int, now time.Time, why string) {
	drive := s.cfg.Members[i]
	changed := tr.failed(i, now, why)
	n.log.Warn("member not active and not re-added yet; the owner retries", "array", s.cfg.Name, "member", drive,
		"attempt", tr.fails[i], "next", tr.next[i].Sub(now), "reason", why)
	if changed {
		n.recordEvent("member-not-readded", s.cfg.Name, s.epoch, fmt.Sprintf("%s: %s (attempt %d; the owner retries in %s)", drive, why, tr.fails[i], tr.next[i].Sub(now)))
	}
}

func (tr *readdTries) forget(i int) {
	delete(tr.rejected, i)
	delete(tr.fails, i)
	delete(tr.next, i)
	delete(tr.lastErr, i)
}

// staleNotReadded records, at an assembly, a member refused as stale
// (raid.ErrStale) whose re-add failed there: the owner's periodic re-add
// takes it up whatever its engine state (nothing else would: the
// coordinator orders a resync only for a member whose node it saw go).
// Caller holds s.mu.
func (s *served) staleNotReadded(i int, reason string, err error) {
	tr := readdOf(s)
	tr.rejected[i] = true
	tr.lastErr[i] = "refused as stale at assembly (" + reason + ") and its re-add failed: " + err.Error()
	member := ""
	if i >= 0 && i < len(s.cfg.Members) {
		member = s.cfg.Members[i]
	}
	s.n.log.Warn("member refused as stale at assembly and not re-added; the owner retries", "array", s.cfg.Name, "member", member, "reason", reason, "err", err)
}
