package raid

import (
	"errors"
	"fmt"
	"strings"

	"tier0/daemon/blockdev"
)

// Rejection says why Assemble left a device out.
type Rejection struct {
	Slot   int // index in the members slice given to Assemble
	Role   int // role from its superblock, -1 when unknown
	Reason string
	Err    error // ErrMismatch, ErrStale, ErrNoSuperblock or an I/O error
}

// AssembleError is returned when Assemble cannot start the array; it lists
// every rejected device.
type AssembleError struct {
	Err      error
	Rejected []Rejection
}

func (e *AssembleError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	for _, r := range e.Rejected {
		fmt.Fprintf(&b, "; device %d (role %d): %s", r.Slot, r.Role, r.Reason)
	}
	return b.String()
}

func (e *AssembleError) Unwrap() error { return e.Err }

// Assemble starts an existing array from its members' superblocks.
// members may be in any order; nil entries (and devices that fail to read)
// count as missing. Devices of another array or geometry, and stale ones
// (marked failed in the newest superblock, or with an older event
// counter), are refused and listed in Rejected. With too few members left
// Assemble fails with ErrTooManyFailed. After an unclean stop it replays
// the partial parity log and resyncs the dirty bitmap regions (in the
// background).
//
// The steps, in order: read the superblocks, choose the newest one of the
// wanted array as the reference, pick one current device per role, build
// the members, load the bitmap, open the log (replaying it after an
// unclean stop) and start the background tasks.
func Assemble(members []blockdev.Device, opts AssembleOptions) (*Array, []Rejection, error) {
	cands, rejected := readSuperblocks(members)
	ref, err := chooseReference(cands, opts, len(members))
	if err != nil {
		return nil, rejected, withRejected(err, rejected)
	}
	g := geometryFromSB(ref)
	byRole := pickMembers(ref, g, cands, &rejected)
	a, err := newArray(g, ref, opts.Policy)
	if err != nil {
		return nil, rejected, err
	}
	a.sbt.Epoch = opts.Epoch
	missing := a.buildMembers(ref, byRole)
	for _, rj := range rejected {
		a.emit(Event{Kind: MemberRejected, Member: rj.Role, Reason: rj.Reason})
	}
	if a.failedRoles() > g.Level.redundancy(g.Members) {
		return nil, rejected, &AssembleError{Err: fmt.Errorf("array %s: %d of %d members usable, %s needs %d: %w", fmtUUID(ref.ArrayUUID),
			g.Members-a.failedRoles(), g.Members, g.Level, g.Members-g.Level.redundancy(g.Members), ErrTooManyFailed), Rejected: rejected}
	}
	if err := a.loadBitmap(); err != nil {
		return nil, rejected, err
	}
	clean := ref.Flags&flagClean != 0
	if !clean {
		a.missedInFlight(ref)
	}
	if err := a.openLog(ref, clean); err != nil {
		return nil, rejected, err
	}
	a.startAssembled(clean, missing)
	a.log.Info("raid array assembled", "uuid", fmtUUID(a.uuid), "level", g.Level, "state", a.describe(), "clean", clean, "rejected", len(rejected))
	return a, rejected, nil
}

// candidate is a device that Assemble found a superblock on.
type candidate struct {
	slot int
	dev  blockdev.Device
	sb   *superblock
	inc  uint64 // the member incarnation its superblock recorded (incarnation.go)
}

// readSuperblocks reads the superblock of every device given (nil entries
// are missing): the devices with one are candidates, the others rejected
// (ErrNoSuperblock, or the I/O error that kept it from being read).
func readSuperblocks(members []blockdev.Device) ([]candidate, []Rejection) {
	var rejected []Rejection
	var cands []candidate
	for i, d := range members {
		if d == nil {
			continue
		}
		sb, inc, err := readSBInc(d)
		if err != nil {
			e := ErrNoSuperblock
			if !errors.Is(err, ErrNoSuperblock) {
				e = err
			}
			rejected = append(rejected, Rejection{Slot: i, Role: -1, Reason: err.Error(), Err: e})
			continue
		}
		cands = append(cands, candidate{i, d, sb, inc})
	}
	return cands, rejected
}

// chooseReference picks the reference superblock: the newest (highest
// event counter) of the wanted array (opts.UUID; any when zero). It
// refuses an array assembled under a newer epoch than the caller holds
// (ErrStaleEpoch), and one whose reference device is smaller than its
// superblock describes (ErrMismatch). n is how many devices were given.
// An *AssembleError it returns has no Rejected yet (see withRejected).
func chooseReference(cands []candidate, opts AssembleOptions, n int) (*superblock, error) {
	var ref *candidate
	for i := range cands {
		c := &cands[i]
		if opts.UUID != ([16]byte{}) && c.sb.ArrayUUID != opts.UUID {
			continue
		}
		if ref == nil || c.sb.Events > ref.sb.Events {
			ref = c
		}
	}
	if ref == nil {
		return nil, &AssembleError{Err: fmt.Errorf("no member of array %s found among %d devices: %w", fmtUUID(opts.UUID), n, ErrTooManyFailed)}
	}
	sb := ref.sb
	if sb.Epoch > opts.Epoch {
		return nil, fmt.Errorf("array %s was assembled under epoch %d, caller holds %d: %w", fmtUUID(sb.ArrayUUID), sb.Epoch, opts.Epoch, ErrStaleEpoch)
	}
	if need := int64(sb.DataOffset) + int64(sb.Stripes)*int64(sb.ChunkSize); ref.dev.Size() < need {
		return nil, &AssembleError{Err: fmt.Errorf("array %s: the newest superblock describes %d bytes per member, its device has %d: %w",
			fmtUUID(sb.ArrayUUID), need, ref.dev.Size(), ErrMismatch)}
	}
	return sb, nil
}

// withRejected fills in the rejected devices of an *AssembleError; other
// errors are returned as they are.
func withRejected(err error, rejected []Rejection) error {
	if ae, ok := err.(*AssembleError); ok {
		ae.Rejected = rejected
	}
	return err
}

// pickMembers chooses, for each role, the candidate that is a current
// member of the reference's array (same array, same geometry, role in
// range, not failed or stale in the reference, device large enough; of
// two for one role the newer). The others are appended to *rejected.
func pickMembers(ref *superblock, g Geometry, cands []candidate, rejected *[]Rejection) []*candidate {
	byRole := make([]*candidate, g.Members)
	for i := range cands {
		c := &cands[i]
		if why, e := checkCandidate(ref, g, c); why != "" {
			*rejected = append(*rejected, Rejection{Slot: c.slot, Role: int(c.sb.Role), Reason: why, Err: e})
			continue
		}
		r := int(c.sb.Role)
		if byRole[r] != nil {
			old := byRole[r]
			if old.sb.Events >= c.sb.Events {
				*rejected = append(*rejected, Rejection{Slot: c.slot, Role: int(c.sb.Role), Reason: fmt.Sprintf("duplicate of role %d (device %d is newer)", r, old.slot), Err: ErrStale})
				continue
			}
			*rejected = append(*rejected, Rejection{Slot: old.slot, Role: r, Reason: fmt.Sprintf("duplicate of role %d (device %d is newer)", r, c.slot), Err: ErrStale})
		}
		byRole[r] = c
	}
	return byRole
}

// checkCandidate says why c cannot serve its role in the reference's
// array ("" when it can), with the error that classes the reason
// (ErrMismatch or ErrStale).
func checkCandidate(ref *superblock, g Geometry, c *candidate) (string, error) {
	if c.sb.ArrayUUID != ref.ArrayUUID {
		return fmt.Sprintf("belongs to array %s, not %s", fmtUUID(c.sb.ArrayUUID), fmtUUID(ref.ArrayUUID)), ErrMismatch
	}
	if why := sameGeometry(ref, c.sb); why != "" {
		return why, ErrMismatch
	}
	r := int(c.sb.Role)
	if r >= g.Members {
		return fmt.Sprintf("role %d out of range", r), ErrMismatch
	}
	if st := ref.RoleState[r]; st == roleFailed || st == roleEmpty {
		return fmt.Sprintf("marked failed in the array's superblock (member event %d, array event %d); use ReAdd", c.sb.Events, ref.Events), ErrStale
	}
	if ref.RoleState[r] == roleMissing {
		// It left unreachable, not failed: every write since is in
		// the bitmap. Taken back under a resync (buildMembers), if its
		// own superblock is one of this array's (it never learnt that
		// it went missing).
		if own := c.sb.RoleState[r]; own != roleActive && own != roleRebuilding {
			return fmt.Sprintf("missing in the array's superblock, but its own superblock says state %d (event %d): stale; use ReAdd", own, c.sb.Events), ErrStale
		}
	} else if ref.RoleState[r] == roleDown {
		// It failed with the array: nothing was acknowledged after
		// it left, so it is current if its own superblock is the
		// one it had then.
		if at := ref.Recovery[r]; c.sb.Events+1 < at || c.sb.RoleState[r] != roleActive {
			return fmt.Sprintf("failed with the array at event %d, but its own superblock is at event %d (state %d): stale; use ReAdd", at, c.sb.Events, c.sb.RoleState[r]), ErrStale
		}
	} else if c.sb.Events+1 < ref.Events {
		return fmt.Sprintf("stale: event counter %d, array is at %d; use ReAdd", c.sb.Events, ref.Events), ErrStale
	}
	if need := int64(c.sb.DataOffset) + int64(c.sb.Stripes)*int64(c.sb.ChunkSize); c.dev.Size() < need {
		return fmt.Sprintf("device of %d bytes is smaller than the %d bytes its superblock describes", c.dev.Size(), need), ErrMismatch
	}
	return "", nil
}

// buildMembers sets up every role of the array from the device picked
// for it (nil: missing) and the reference superblock's state for it. It
// returns how many roles are missing or rebuilding.
func (a *Array) buildMembers(ref *superblock, byRole []*candidate) int {
	// Members whose node restarted since their last superblock (their
	// cache may be lost) catch up the bitmap's dirty regions; when more
	// restarted than the level tolerates there is no one to catch up
	// from, and they are taken as they are (as after a power loss of
	// the whole array: only flushed writes are promised then).
	restarted := make([]bool, a.geo.Members)
	n := 0
	for r, c := range byRole {
		if st := ref.RoleState[r]; c != nil && (st == roleActive || st == roleDown) && ref.Flags&flagClean == 0 && a.geo.ParityDisks > 0 && c.restarted() {
			restarted[r] = true
			n++
		}
	}
	if n > a.geo.Level.redundancy(a.geo.Members) {
		a.log.Warn("raid members restarted since their last superblock, more than the level tolerates: taken as they are", "uuid", fmtUUID(ref.ArrayUUID), "restarted", n)
		clear(restarted)
	}
	missing := 0
	for r := 0; r < a.geo.Members; r++ {
		m, absent := a.memberAtAssembly(ref, r, a.emptyStaleLog(ref, r, byRole[r]), restarted[r])
		if absent {
			missing++
		}
		a.members[r].Store(m)
	}
	return missing
}

// emptyStaleLog empties the log of c, role r's device, when the
// reference records it missing (it left unreachable and is taken back
// under a resync), before the replay reads the logs: its entries are
// those of the run it left, and the runs since, which could not read
// them, may have issued their sequence numbers again; a replay would
// merge such an old entry, another stripe's, into the new one and write
// wrong parity (docs/RELIABILITY.md known problem 9, seed 133638). Its
// chunks of the stripes written since are resynced, so its old entries
// are not needed. A device whose log cannot be emptied is left out: it
// returns nil, role r is then missing.
func (a *Array) emptyStaleLog(ref *superblock, r int, c *candidate) *candidate {
	if c == nil || ref.RoleState[r] != roleMissing {
		return c
	}
	if err := a.resetLog(c.dev); err != nil {
		a.log.Warn("raid member left out of the assembly: its old log could not be emptied", "uuid", fmtUUID(ref.ArrayUUID), "member", r, "err", err)
		return nil
	}
	return c
}

// memberAtAssembly is role r's member at assembly, from c (nil when no
// device was picked for it); absent says it is missing or rebuilding.
// restarted: its node restarted since its last superblock (buildMembers).
func (a *Array) memberAtAssembly(ref *superblock, r int, c *candidate, restarted bool) (m *member, absent bool) {
	g := a.geo
	m = &member{role: r, full: true}
	if c == nil {
		m.state.Store(uint32(roleFailed))
		m.reason = "missing at assembly"
		switch st := ref.RoleState[r]; st {
		case roleActive, roleDown:
			// Current when the array stopped: it misses only this
			// run's writes, which the writers record (m.since), so a
			// ReAdd catches up just those.
			m.missing = true
			m.downAt = ref.Events
			if st == roleDown {
				m.downAt = ref.Recovery[r]
			}
			if g.Level == RAID5 || g.Level == RAID6 {
				m.since = newStripeSet(g.Stripes)
			}
		case roleRebuilding, roleMissing:
			m.missing, m.missingFull = true, ref.RoleFull[r] != 0
		default:
			m.reason = "marked failed in the array's superblock and not there at assembly"
		}
		return m, true
	}
	m.dev = c.dev
	if ref.RoleState[r] == roleMissing {
		m.state.Store(uint32(roleRebuilding))
		m.full = ref.RoleFull[r] != 0 || c.sb.Events < ref.EventsCleared || c.sb.RoleState[r] == roleRebuilding && c.sb.RoleFull[r] != 0
		a.log.Info("raid member taken back under a resync: it was unreachable, not failed", "uuid", fmtUUID(ref.ArrayUUID), "member", r,
			"member-event", c.sb.Events, "full", m.full)
		return m, true
	}
	st := ref.RoleState[r]
	if restarted {
		// Its node restarted since the array last wrote its superblock:
		// it may have lost writes it had completed (its volatile cache)
		// while the array stood failed or stopped, so it is not as
		// current as the others. Taken back under a resync of the
		// bitmap's dirty regions, which hold every write not yet
		// flushed.
		m.state.Store(uint32(roleRebuilding))
		m.full = false
		a.log.Info("raid member taken back under a resync: its node restarted since its last superblock, its volatile cache may be lost", "uuid", fmtUUID(ref.ArrayUUID), "member", r,
			"member-event", c.sb.Events, "recorded-incarnation", c.inc, "incarnation", incarnationOf(c.dev))
		return m, true
	}
	if st == roleDown {
		st = roleActive
		a.log.Info("raid member taken back: it failed with the array, its data is current", "uuid", fmtUUID(ref.ArrayUUID), "member", r,
			"member-event", c.sb.Events, "down-at", ref.Recovery[r])
	}
	m.state.Store(uint32(st))
	if st == roleRebuilding {
		m.full = ref.RoleFull[r] != 0
		m.recovery.Store(int64(ref.Recovery[r]))
		m.durable.Store(int64(ref.Recovery[r]))
		return m, true
	}
	return m, false
}

// missedInFlight, after an unclean stop of an optimal array, adds to the
// stripes that each member away at assembly must catch up (m.since) those
// of the regions dirty at the stop: writes in flight then may have landed
// on some members and not on others, and a full-stripe write of an
// optimal array is not in the log, so the absent member's chunks there
// may differ from what the array serves without it. Without this its
// return would serve them as in sync: a read could go back to an older
// value. While a member is away or rebuilding every stripe write is
// logged, and the replay marks what the absent member missed (apply); the
// regions are then dirty for the members away, not for writes in flight,
// and are not added. (A whole-stripe write to a healthy stripe is logged
// while any member of the stripe rebuilds, also one holding its parity:
// planFullStripe; adding the dirty regions here then would make a member
// away catch up stripes that another member under resync cannot rebuild
// without it, TestUnreachableMemberTakenBackAtAssembly.)
//
// After the stop of an array that was not optimal, only the stripes of
// the dirty regions whose every parity member is absent now (away or out
// of sync) are added: their entries lie on those members only, so the
// replay cannot mark what the away member missed, and its parity chunk
// there (it can hold only parity: the data members are all present) is
// rebuilt from present data alone (RAID-6 seeds 26402 and 32602 of the
// crash model: P on the member lost with the crash, Q on one failed
// before; its return served a stale parity chunk).
func (a *Array) missedInFlight(ref *superblock) {
	optimal := true
	for r := 0; r < a.geo.Members; r++ {
		if ref.RoleState[r] != roleActive {
			optimal = false
		}
	}
	dirty := a.bm.snapshot()
	rs := a.bm.regionStripes
	if !optimal {
		a.missedInFlightParityAbsent(dirty, rs)
		return
	}
	for r := 0; r < a.geo.Members; r++ {
		m := a.member(r)
		if m == nil || m.since == nil {
			continue
		}
		for reg, d := range dirty {
			if !d {
				continue
			}
			for s := int64(reg) * rs; s < min(int64(reg+1)*rs, a.geo.Stripes); s++ {
				m.since.set(s)
			}
		}
	}
}

// missedInFlightParityAbsent: missedInFlight for an array stopped while
// not optimal.
func (a *Array) missedInFlightParityAbsent(dirty []bool, rs int64) {
	absent := func(r int) bool {
		m := a.member(r)
		return m == nil || m.since != nil || uint8(m.state.Load()) != roleActive
	}
	np := a.geo.Level.redundancy(a.geo.Members)
	for reg, d := range dirty {
		if !d {
			continue
		}
		for s := int64(reg) * rs; s < min(int64(reg+1)*rs, a.geo.Stripes); s++ {
			all := true
			for k := 0; k < np && all; k++ {
				all = absent(a.parityRole(s, k))
			}
			// Only where every data member is present and in sync: the
			// away member's parity is rebuilt from them alone (a data
			// member out of sync too would leave the stripe lacking data,
			// TestUnreachableMemberTakenBackAtAssembly).
			for i := 0; i < a.geo.Members-np && all; i++ {
				all = !absent(a.dataRole(s, i))
			}
			if !all {
				continue
			}
			for k := 0; k < np; k++ {
				if m := a.member(a.parityRole(s, k)); m != nil && m.since != nil {
					m.since.set(s)
				}
			}
		}
	}
}

// loadBitmap loads the write-intent bitmap (the OR of every present
// member's copy) and gives each member under a delta resync its dirty
// regions.
func (a *Array) loadBitmap() error {
	if err := a.bm.load(); err != nil {
		return err
	}
	for r := 0; r < a.geo.Members; r++ {
		if m := a.member(r); uint8(m.state.Load()) == roleRebuilding && !m.full {
			m.dirty = a.bm.snapshot()
		}
	}
	return nil
}

// openLog marks the array in use (superblocks without the clean flag)
// and continues the partial parity log's sequence numbers above anything
// ever logged. After an unclean stop (clean false) it replays the log
// from where it stood, flushes the members and persists the new tail.
func (a *Array) openLog(ref *superblock, clean bool) error {
	// Sequence numbers continue above anything ever logged; the tail
	// stays where it was until the replay is done.
	a.jl.nextSeq = max(ref.LogSeq, 1)
	a.jl.tail = a.jl.nextSeq
	if !clean && a.logOn {
		a.jl.tail = max(ref.LogTail, 1)
	}
	a.sbt.Flags &^= flagClean
	if err := a.writeSuperblocks(); err != nil {
		return err
	}
	a.dirtyOnSB.Store(true)
	if clean || !a.logOn {
		return nil
	}
	n, err := a.jl.replay(ref.LogTail, ref.LogSeq)
	if err != nil {
		return fmt.Errorf("array %s: replaying the partial parity log: %w", fmtUUID(ref.ArrayUUID), err)
	}
	if err := a.flushMembers(); err != nil {
		return err
	}
	if err := a.writeSuperblocks(); err != nil { // persists the new log tail
		return err
	}
	a.emit(Event{Kind: LogReplayed, Member: -1, Count: int64(n)})
	return nil
}

// startAssembled starts the background tasks of a newly assembled array:
// a rebuild for each rebuilding member, a resync after an unclean stop
// or with dirty bitmap regions, and reports it degraded when missing
// roles are missing or rebuilding.
func (a *Array) startAssembled(clean bool, missing int) {
	g := a.geo
	a.bg.start()
	for r := 0; r < g.Members; r++ {
		if m := a.member(r); m != nil && uint8(m.state.Load()) == roleRebuilding {
			a.bg.enqueue(task{kind: taskRebuild, role: r})
		}
	}
	if (!clean || a.bm.count() > 0) && g.ParityDisks > 0 {
		a.resyncing.Store(true)
		a.bg.enqueue(task{kind: taskResync})
	}
	if missing > 0 {
		a.emit(Event{Kind: Degraded, Member: -1, Reason: fmt.Sprintf("%d member(s) missing or rebuilding at assembly", missing)})
	}
}
