package raid

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
)

type member struct {
	role     int
	dev      blockdev.Device
	state    atomic.Uint32 // roleActive, roleFailed, roleRebuilding, roleEmpty
	recovery atomic.Int64  // rebuilding: stripes below this are in sync
	// durable (rebuilding): the recovery position of the last checkpoint,
	// when what the rebuild wrote below it was flushed; the superblocks
	// record this one (a crash drops the rebuild's unflushed writes).
	durable atomic.Int64
	full    bool   // rebuilding: every stripe needs rebuilding
	dirty   []bool // rebuilding (delta): regions that need it
	reason  string
	// lat: moving average of this member's request time in ns (fanout.go).
	lat atomic.Int64
	// unit: its request time per mergeUnit bytes (a smaller request
	// counts as mergeUnit), in ns, a floor estimate (noteUnit): whether
	// merging its requests pays (runMerged).
	unit atomic.Int64
	// late: requests abandoned at a deadline that have not ended yet
	// (memberio.go, hedge.go); a member with one is not read to rebuild
	// another member's late chunk.
	late atomic.Int32
	// busy, busySince, doneAt (timed requests, memberio.go): requests
	// running, when busy last went from 0 to 1, and when the last one
	// ended, on monoNow's clock. A member busy since before a moment
	// with nothing ended since is silent too (claimSlow).
	busy      atomic.Int32
	busySince atomic.Int64
	doneAt    atomic.Int64
	// missed: rebuilding after a ReAdd in the same run of the array, the
	// stripes it must catch up (it then replaces dirty).
	missed *stripeSet
	// since (RAID-5/6, failed from active): the stripes written since it
	// failed; a ReAdd of the same device takes it as missed.
	// sinceCache: since also holds the stripes unflushed when it left
	// (it left unreachable, markFailedLocked), so it stands for a device
	// whose node restarted meanwhile (incarnation.go).
	since      *stripeSet
	sinceCache bool
	// withArray: failed when or after the array failed (no write was
	// acknowledged after it left), so its data is as current as the
	// survivors'; recorded as roleDown with downAt, the event counter of
	// its last superblock, so that Assemble can take it back.
	withArray bool
	downAt    uint64
	// missing (failed only): it left because it could not be reached
	// (Policy.Unreachable), not because the device refused a request; it
	// is recorded as roleMissing and taken back by a resync (missingFull:
	// it was under a full rebuild when it left, so only a full one).
	missing     bool
	missingFull bool
	// recorded (failed through failAs or a slow write, guarded by a.mu):
	// closed once the failure is recorded (survivors flushed,
	// superblocks written); another request that finds m failed waits
	// for it before its write is acknowledged.
	recorded chan struct{}
}

// needs reports whether rebuilding member m must still rebuild stripe s
// (ignoring the recovery position).
func (m *member) needs(s, regionStripes int64) bool {
	if m.full {
		return true
	}
	if m.missed != nil {
		return m.missed.get(s)
	}
	return m.dirty[s/regionStripes]
}

// stripeSet is a set of stripes, safe for concurrent use.
type stripeSet struct{ w []atomic.Uint64 }

func newStripeSet(n int64) *stripeSet { return &stripeSet{w: make([]atomic.Uint64, (n+63)/64)} }

func (x *stripeSet) set(s int64) {
	w := &x.w[s/64]
	for {
		o := w.Load()
		if o&(1<<(s%64)) != 0 || w.CompareAndSwap(o, o|1<<(s%64)) {
			return
		}
	}
}

func (x *stripeSet) get(s int64) bool { return x.w[s/64].Load()&(1<<(s%64)) != 0 }

func (a *Array) member(role int) *member { return a.members[role].Load() }

// lateLoad is m.late, 0 for no member.
func (m *member) lateLoad() int32 {
	if m == nil {
		return 0
	}
	return m.late.Load()
}

// reAddLateWait bounds how long a re-add waits for the requests its
// member's previous device still runs (addMember).
const reAddLateWait = time.Second

// inSync reports whether role holds valid data for stripe s.
func (a *Array) inSync(m *member, s int64) bool {
	if m == nil {
		return false
	}
	switch uint8(m.state.Load()) {
	case roleActive:
		return true
	case roleRebuilding:
		if s < m.recovery.Load() {
			return true
		}
		return !m.needs(s, a.bm.regionStripes)
	}
	return false
}

// present reports whether role takes part in I/O at all (active or
// rebuilding).
func present(m *member) bool {
	if m == nil {
		return false
	}
	st := uint8(m.state.Load())
	return st == roleActive || st == roleRebuilding
}

// each runs f on every present member in parallel and returns the errors
// by role.
func (a *Array) each(f func(m *member) error) []error {
	errs := make([]error, a.geo.Members)
	var wg sync.WaitGroup
	for r := range a.members {
		m := a.member(r)
		if !present(m) {
			continue
		}
		if a.serial() {
			errs[r] = f(m)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(m)
		}()
	}
	wg.Wait()
	return errs
}

// failedCount counts roles not active (failed, missing or rebuilding).
func (a *Array) notActive() int {
	c := 0
	for r := range a.members {
		m := a.member(r)
		if m == nil || uint8(m.state.Load()) != roleActive {
			c++
		}
	}
	return c
}

// degraded reports whether any role is not fully active.
func (a *Array) degraded() bool { return a.notActive() > 0 }

func (a *Array) failedRoles() int {
	c := 0
	for r := range a.members {
		m := a.member(r)
		if m == nil || uint8(m.state.Load()) == roleFailed || uint8(m.state.Load()) == roleEmpty {
			c++
		}
	}
	return c
}

// classify turns a member error into the engine's reaction: ErrFenced
// stops the array; other errors fail the member.
func (a *Array) memberErr(m *member, op string, err error) error {
	if errors.Is(err, blockdev.ErrFenced) {
		if !a.fenced.Swap(true) {
			a.log.Warn("raid fenced: this node lost ownership", "uuid", fmtUUID(a.uuid), "member", m.role, "err", err)
			a.emit(Event{Kind: Fenced, Member: m.role, Reason: err.Error()})
		}
		return fmt.Errorf("raid %s member %d %s: %w", fmtUUID(a.uuid), m.role, op, blockdev.ErrFenced)
	}
	if a.stopped.Load() {
		return fmt.Errorf("raid %s: %w", fmtUUID(a.uuid), ErrStopped)
	}
	a.failAs(m, fmt.Sprintf("%s: %v", op, err), a.unreachable(err))
	return errGone
}

// unreachable reports whether a member error means the member could not
// be reached rather than a device error (Policy.Unreachable).
func (a *Array) unreachable(err error) bool {
	if a.pol.Unreachable != nil && a.pol.Unreachable(err) {
		return true
	}
	return errors.Is(err, blockdev.ErrTimeout) || errors.Is(err, blockdev.ErrClosed) || errors.Is(err, blockdev.ErrNoPath)
}

// fail marks m failed and records it on the other members' superblocks
// before returning, so that m can never be assembled as current again.
// It returns the error that stops the array (fenced, stopped, failed,
// superblocks not writable), or nil when the array runs on degraded.
func (a *Array) fail(m *member, reason string) error { return a.failAs(m, reason, false) }

// failAs is fail; missing says the member was unreachable rather than
// refused by its device (it is then recorded missing, see member.missing).
func (a *Array) failAs(m *member, reason string, missing bool) error {
	a.mu.Lock()
	if !a.markFailedLocked(m, reason, missing) {
		rec := m.recorded
		a.mu.Unlock()
		if rec != nil {
			// Failed by another request, which is recording it: a
			// write that missed m is acknowledged only once m is
			// recorded failed on the survivors, as for that request.
			<-rec
		}
		return nil
	}
	m.recorded = make(chan struct{})
	a.mu.Unlock()
	return a.recordFailure(m, reason, missing)
}

// recordFailure is the rest of failAs once m is marked failed (a.mu
// released, m.recorded set): events, the survivors flushed, the
// superblocks written; then m.recorded is closed.
func (a *Array) recordFailure(m *member, reason string, missing bool) error {
	defer close(m.recorded)
	if missing {
		a.log.Warn("raid member missing: unreachable, its writes are tracked for a resync", "uuid", fmtUUID(a.uuid), "member", m.role, "reason", reason)
	} else {
		a.log.Warn("raid member failed", "uuid", fmtUUID(a.uuid), "member", m.role, "reason", reason)
	}
	a.mu.Lock()
	with := m.withArray
	a.mu.Unlock()
	a.emit(Event{Kind: MemberFailed, Member: m.role, Reason: reason, Missing: missing, WithArray: with})
	if !a.checkDead() {
		a.emit(Event{Kind: Degraded, Member: m.role, Reason: reason})
		if n := a.unavailableStripes(); n > 0 {
			why := fmt.Sprintf("member %d failed (%s) while other members are rebuilding: %d stripes lack data until a member returns", m.role, reason, n)
			a.log.Error("raid stripes unavailable", "uuid", fmtUUID(a.uuid), "stripes", n, "reason", why)
			a.emit(Event{Kind: StripesUnavailable, Member: m.role, Count: n, Reason: why})
		}
	}
	// Make every completed write durable on the survivors before the
	// array runs degraded: from now on a missing chunk exists only as
	// parity, and parity and data must not diverge in a later crash.
	if err := a.flushMembers(); err != nil && (a.fenced.Load() || a.stopped.Load()) {
		// Another node owns the members now (or the array stopped):
		// write nothing more, not even a superblock.
		return err
	}
	if err := a.writeSuperblocks(); err != nil {
		a.log.Warn("raid superblock update after member failure", "uuid", fmtUUID(a.uuid), "member", m.role, "err", err)
		return err
	}
	return a.usable()
}

// markFailedLocked marks m failed (caller holds a.mu); false when it
// was failed already or no longer holds its role.
func (a *Array) markFailedLocked(m *member, reason string, missing bool) bool {
	st := uint8(m.state.Load())
	if st == roleFailed || a.member(m.role) != m {
		return false
	}
	m.reason = reason
	m.downAt = a.sbt.Events
	m.missing = missing
	m.missingFull = st == roleRebuilding && m.full
	if (a.geo.Level == RAID5 || a.geo.Level == RAID6) && st == roleActive {
		m.since = newStripeSet(a.geo.Stripes) // before the state: writers look at it once they see "failed"
		if missing && a.jl != nil {
			// Unreachable, not refusing: its node may have lost power,
			// and its writes not yet flushed with it, so they count as
			// missed too (docs/RELIABILITY.md known problem 8, seed 965).
			// A member that answers with errors is powered: its cache
			// stands, and it catches up only what it missed.
			a.jl.markUnflushed(m.since, a.geo.Stripes)
			m.sinceCache = true
		}
	}
	m.state.Store(uint32(roleFailed))
	a.losses.Add(1) // after the state: a writer that sees the count sees the loss (exposed.go)
	// The array fails with this member, or failed before it: nothing was
	// acknowledged after it left, so its data is as current as the
	// survivors'.
	m.withArray = st == roleActive && (a.dead.Load() || a.failedRoles() > a.geo.Level.redundancy(a.geo.Members))
	return true
}

// checkDead fails the array when more members are gone (failed or
// missing; a rebuilding member is present) than the level tolerates. It
// reports whether the array is failed.
func (a *Array) checkDead() bool {
	a.mu.Lock()
	if a.failedRoles() <= a.geo.Level.redundancy(a.geo.Members) {
		a.mu.Unlock()
		return a.dead.Load()
	}
	why := a.goneTextLocked() + ": re-assemble the array when enough members return"
	a.deadWhy.Store(&why)
	a.mu.Unlock()
	if !a.dead.Swap(true) {
		a.log.Error("raid array failed: too many members lost", "uuid", fmtUUID(a.uuid), "reason", why)
		a.emit(Event{Kind: ArrayFailed, Member: -1, Reason: why})
	}
	return true
}

// FailMember marks role index failed (operator action or health policy).
func (a *Array) FailMember(index int, reason string) error {
	if index < 0 || index >= a.geo.Members {
		return fmt.Errorf("member index %d: the array has members 0..%d: %w", index, a.geo.Members-1, ErrInvalidConfig)
	}
	m := a.member(index)
	if m == nil || !present(m) {
		return nil
	}
	if err := a.fail(m, reason); err != nil {
		return err
	}
	return a.usable()
}

// Replace puts a new device in role index (which must be failed or
// missing) and starts a full rebuild onto it in the background.
func (a *Array) Replace(index int, dev blockdev.Device) error {
	return a.addMember(index, dev, true)
}

// ReAdd brings back the device that held role index before a transient
// loss. When its superblock shows it left after the last bitmap clear,
// only the regions written while it was away are rebuilt (delta resync);
// otherwise it gets a full rebuild.
func (a *Array) ReAdd(index int, dev blockdev.Device) error {
	return a.addMember(index, dev, false)
}

func (a *Array) addMember(index int, dev blockdev.Device, full bool) error {
	if a.dead.Load() && !a.fenced.Load() && !a.stopped.Load() {
		return fmt.Errorf("%w; a failed array is not repaired member by member: stop it (Abort) and re-assemble it from all its members once enough are back (Assemble takes back the members that failed with the array and rejects the stale ones as ErrStale, which then come back by ReAdd)", a.usable())
	}
	if err := a.usable(); err != nil {
		return err
	}
	if index < 0 || index >= a.geo.Members {
		return fmt.Errorf("member index %d: the array has members 0..%d: %w", index, a.geo.Members-1, ErrInvalidConfig)
	}
	if a.geo.Level == RAID0 {
		return fmt.Errorf("raid0 has no redundancy to rebuild a member from: %w", ErrInvalidConfig)
	}
	if dev.Size() < a.geo.DataOffset+a.geo.Stripes*a.geo.ChunkSize {
		return fmt.Errorf("device of %d bytes is smaller than the %d bytes a member needs: %w", dev.Size(), a.geo.DataOffset+a.geo.Stripes*a.geo.ChunkSize, ErrInvalidConfig)
	}
	if a.geo.BlockSize%dev.BlockSize() != 0 {
		return fmt.Errorf("device block size %d does not divide the array's %d: %w", dev.BlockSize(), a.geo.BlockSize, ErrInvalidConfig)
	}
	old := a.member(index)
	if old != nil && present(old) {
		return fmt.Errorf("member %d is %s; fail it first: %w", index, map[bool]string{true: "active", false: "rebuilding"}[uint8(old.state.Load()) == roleActive], ErrInvalidConfig)
	}
	nm := &member{role: index, dev: dev, full: true}
	if !full {
		if err := a.reAddCatchUp(nm, old); err != nil {
			return err
		}
	}
	// Requests to the old device abandoned at a deadline (IOTimeout,
	// SlowWrite) may still land on it: one landing after the resync
	// would put old data under newer writes. Wait a while for them to
	// end, then refuse (a Replace by another device need not wait).
	fenceLate := old != nil && (!full || old.dev == dev)
	if fenceLate {
		for t0 := time.Now(); old.late.Load() > 0 && time.Since(t0) < reAddLateWait; {
			time.Sleep(5 * time.Millisecond)
		}
	}
	nm.state.Store(uint32(roleRebuilding))
	// A barrier: every write holds its stripe's lock from planning
	// until it has recorded the stripe in the failed member's missed
	// set, so once all locks are taken the set is complete, and later
	// writes see the new member; and no stripe update can abandon a
	// request to the old member any more.
	for i := range a.locks {
		a.locks[i].Lock()
	}
	if n := old.lateLoad(); fenceLate && n > 0 {
		for i := range a.locks {
			a.locks[i].Unlock()
		}
		return fmt.Errorf("re-add of member %d: %d requests to its previous device, abandoned at a deadline, have not ended after %v; one landing after the resync would put old data under newer writes: add it again once they end (closing its old connection ends them): %w",
			index, n, reAddLateWait, ErrInFlight)
	}
	a.mu.Lock()
	a.members[index].Store(nm)
	a.mu.Unlock()
	for i := range a.locks {
		a.locks[i].Unlock()
	}
	// Empty log, new bitmap and superblock on the member before it
	// takes writes (its old log entries must never be replayed). The
	// empty log is made durable before the superblock that takes the
	// member back: the array may have reused the sequence numbers of
	// entries only this member held (it was lost with a crash), and a
	// replay would merge such an old entry with the new one.
	if err := a.resetLog(dev); err != nil {
		a.failAs(nm, "log reset: "+err.Error(), a.unreachable(err))
		return err
	}
	a.jl.forgetLog(index)
	if err := a.bm.writeAll(dev); err != nil {
		a.failAs(nm, "bitmap write: "+err.Error(), a.unreachable(err))
		return err
	}
	if err := a.writeSuperblocks(); err != nil {
		return err
	}
	if uint8(nm.state.Load()) != roleRebuilding {
		// Lost again while being added (its superblock write failed): no
		// rebuild will run for it, so say so rather than succeed.
		a.mu.Lock()
		why := nm.reason
		a.mu.Unlock()
		return fmt.Errorf("re-add of member %d: the member was lost again while being added (%s); add it again once it is reachable: %w", index, why, blockdev.ErrIO)
	}
	a.log.Info("raid member added", "uuid", fmtUUID(a.uuid), "member", index, "full", nm.full, "stripes-missed", nm.missed != nil)
	a.bg.enqueue(task{kind: taskRebuild, role: index})
	// A rebuild that stopped on stripes lacking data may go on now.
	for r := range a.members {
		if m := a.member(r); r != index && m != nil && uint8(m.state.Load()) == roleRebuilding {
			a.bg.enqueue(task{kind: taskRebuild, role: r})
		}
	}
	return nil
}

// resetLog empties dev's partial parity log, durably: a member that was
// away holds entries of a run whose sequence numbers the array has issued
// again since, and a replay must never read them (addMember; buildMembers
// for a member taken back at assembly).
func (a *Array) resetLog(dev blockdev.Device) error {
	zero := blockdev.AlignedBuffer(metaBlock)
	for k := 0; k < a.jl.slots; k++ {
		if _, err := dev.WriteAt(zero, a.jl.slotOff(k)); err != nil {
			return err
		}
	}
	return dev.Flush()
}

// reAddCatchUp reads the superblock of nm's device (a ReAdd) and chooses
// what it must catch up: the bitmap's dirty regions, the stripes recorded
// while old (the member that held the role) was away, or everything
// (nm.full stays set).
func (a *Array) reAddCatchUp(nm, old *member) error {
	index, dev := nm.role, nm.dev
	sb, inc, err := readSBInc(dev)
	switch {
	case err != nil:
		return fmt.Errorf("re-add member %d: %w; use Replace for a new device", index, err)
	case sb.ArrayUUID != a.uuid:
		return fmt.Errorf("re-add member %d: device belongs to array %s: %w", index, fmtUUID(sb.ArrayUUID), ErrMismatch)
	case int(sb.Role) != index:
		return fmt.Errorf("re-add member %d: device held role %d: %w", index, sb.Role, ErrMismatch)
	}
	if why := sameGeometry(&a.sbt, sb); why != "" {
		return fmt.Errorf("re-add member %d: %s: %w", index, why, ErrMismatch)
	}
	a.mu.Lock()
	cleared := a.sbt.EventsCleared
	a.mu.Unlock()
	// Delta when the bitmap has tracked every write since it left: it
	// was active, or under a delta resync (whose regions the bitmap
	// still holds, as it is not cleared while degraded).
	if sb.Events >= cleared && (sb.RoleState[index] == roleActive || sb.RoleState[index] == roleRebuilding && sb.RoleFull[index] == 0) {
		nm.full = false
		nm.dirty = a.bm.snapshot()
	}
	// The same device that failed in this run of the array (its
	// superblock is the one it had then): it missed exactly the
	// stripes written since, which writers recorded. Taken below,
	// with no stripe operation in flight.
	// Unless its node restarted since (its cache may be lost) and
	// the record lacks the stripes it held unflushed: then the
	// bitmap's regions (above), which hold every write not flushed.
	if old != nil && old.since != nil && sb.RoleState[index] == roleActive && sb.Events <= old.downAt && sb.Events+1 >= old.downAt &&
		(old.sinceCache || !restartedSince(inc, dev)) {
		nm.full = false
		nm.missed = old.since
	}
	if debugf != nil {
		debugf("re-add %d: member events %d, cleared %d, full %v, dirty %v", index, sb.Events, cleared, nm.full, nm.dirty)
	}
	return nil
}

// Resume queues the rebuild of role index again when the member is under
// rebuild or resync (one that stopped on stripes lacking data, say): the
// rebuild goes on from where it is and ends with RebuildDone or
// TaskFailed. It refuses a member that is not rebuilding.
func (a *Array) Resume(index int) error {
	if err := a.usable(); err != nil {
		return err
	}
	if index < 0 || index >= a.geo.Members {
		return fmt.Errorf("member index %d: the array has members 0..%d: %w", index, a.geo.Members-1, ErrInvalidConfig)
	}
	if m := a.member(index); m == nil || uint8(m.state.Load()) != roleRebuilding {
		return fmt.Errorf("member %d is not under rebuild; re-add it instead: %w", index, ErrInvalidConfig)
	}
	a.bg.enqueue(task{kind: taskRebuild, role: index})
	return nil
}
