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
func Assemble(members []blockdev.Device, opts AssembleOptions) (*Array, []Rejection, error) {
	type cand struct {
		slot int
		dev  blockdev.Device
		sb   *superblock
	}
	var rejected []Rejection
	var cands []cand
	for i, d := range members {
		if d == nil {
			continue
		}
		sb, err := readSB(d)
		if err != nil {
			e := ErrNoSuperblock
			if !errors.Is(err, ErrNoSuperblock) {
				e = err
			}
			rejected = append(rejected, Rejection{Slot: i, Role: -1, Reason: err.Error(), Err: e})
			continue
		}
		cands = append(cands, cand{i, d, sb})
	}
	// The reference: the newest superblock of the wanted array.
	var ref *superblock
	for _, c := range cands {
		if opts.UUID != ([16]byte{}) && c.sb.ArrayUUID != opts.UUID {
			continue
		}
		if ref == nil || c.sb.Events > ref.Events {
			ref = c.sb
		}
	}
	if ref == nil {
		return nil, rejected, &AssembleError{Err: fmt.Errorf("no member of array %s found among %d devices: %w", fmtUUID(opts.UUID), len(members), ErrTooManyFailed), Rejected: rejected}
	}
	if ref.Epoch > opts.Epoch {
		return nil, rejected, fmt.Errorf("array %s was assembled under epoch %d, caller holds %d: %w", fmtUUID(ref.ArrayUUID), ref.Epoch, opts.Epoch, ErrStaleEpoch)
	}
	g := geometryFromSB(ref)
	var refDev blockdev.Device
	for _, c := range cands {
		if c.sb == ref {
			refDev = c.dev
		}
	}
	if need := int64(ref.DataOffset) + int64(ref.Stripes)*int64(ref.ChunkSize); refDev.Size() < need {
		return nil, rejected, &AssembleError{Err: fmt.Errorf("array %s: the newest superblock describes %d bytes per member, its device has %d: %w",
			fmtUUID(ref.ArrayUUID), need, refDev.Size(), ErrMismatch), Rejected: rejected}
	}
	byRole := make([]*cand, g.Members)
	for i := range cands {
		c := &cands[i]
		rej := func(why string, e error) {
			rejected = append(rejected, Rejection{Slot: c.slot, Role: int(c.sb.Role), Reason: why, Err: e})
		}
		if c.sb.ArrayUUID != ref.ArrayUUID {
			rej(fmt.Sprintf("belongs to array %s, not %s", fmtUUID(c.sb.ArrayUUID), fmtUUID(ref.ArrayUUID)), ErrMismatch)
			continue
		}
		if why := sameGeometry(ref, c.sb); why != "" {
			rej(why, ErrMismatch)
			continue
		}
		r := int(c.sb.Role)
		if r >= g.Members {
			rej(fmt.Sprintf("role %d out of range", r), ErrMismatch)
			continue
		}
		if st := ref.RoleState[r]; st == roleFailed || st == roleEmpty {
			rej(fmt.Sprintf("marked failed in the array's superblock (member event %d, array event %d); use ReAdd", c.sb.Events, ref.Events), ErrStale)
			continue
		}
		if ref.RoleState[r] == roleMissing {
			// It left unreachable, not failed: every write since is in
			// the bitmap. Taken back below under a resync, if its own
			// superblock is one of this array's (it never learnt that it
			// went missing).
			if own := c.sb.RoleState[r]; own != roleActive && own != roleRebuilding {
				rej(fmt.Sprintf("missing in the array's superblock, but its own superblock says state %d (event %d): stale; use ReAdd", own, c.sb.Events), ErrStale)
				continue
			}
		} else if ref.RoleState[r] == roleDown {
			// It failed with the array: nothing was acknowledged after
			// it left, so it is current if its own superblock is the
			// one it had then.
			if at := ref.Recovery[r]; c.sb.Events+1 < at || c.sb.RoleState[r] != roleActive {
				rej(fmt.Sprintf("failed with the array at event %d, but its own superblock is at event %d (state %d): stale; use ReAdd", at, c.sb.Events, c.sb.RoleState[r]), ErrStale)
				continue
			}
		} else if c.sb.Events+1 < ref.Events {
			rej(fmt.Sprintf("stale: event counter %d, array is at %d; use ReAdd", c.sb.Events, ref.Events), ErrStale)
			continue
		}
		if need := int64(c.sb.DataOffset) + int64(c.sb.Stripes)*int64(c.sb.ChunkSize); c.dev.Size() < need {
			rej(fmt.Sprintf("device of %d bytes is smaller than the %d bytes its superblock describes", c.dev.Size(), need), ErrMismatch)
			continue
		}
		if byRole[r] != nil {
			old := byRole[r]
			if old.sb.Events >= c.sb.Events {
				rej(fmt.Sprintf("duplicate of role %d (device %d is newer)", r, old.slot), ErrStale)
				continue
			}
			rejected = append(rejected, Rejection{Slot: old.slot, Role: r, Reason: fmt.Sprintf("duplicate of role %d (device %d is newer)", r, c.slot), Err: ErrStale})
		}
		byRole[r] = c
	}
	pol := opts.Policy
	a, err := newArray(g, ref, pol)
	if err != nil {
		return nil, rejected, err
	}
	a.sbt.Epoch = opts.Epoch
	missing := 0
	for r := 0; r < g.Members; r++ {
		c := byRole[r]
		m := &member{role: r, full: true}
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
			missing++
		} else if ref.RoleState[r] == roleMissing {
			m.dev = c.dev
			m.state.Store(uint32(roleRebuilding))
			m.full = ref.RoleFull[r] != 0 || c.sb.Events < ref.EventsCleared || c.sb.RoleState[r] == roleRebuilding && c.sb.RoleFull[r] != 0
			a.log.Info("raid member taken back under a resync: it was unreachable, not failed", "uuid", fmtUUID(ref.ArrayUUID), "member", r,
				"member-event", c.sb.Events, "full", m.full)
			missing++
		} else {
			m.dev = c.dev
			st := ref.RoleState[r]
			if st == roleDown {
				st = roleActive
				a.log.Info("raid member taken back: it failed with the array, its data is current", "uuid", fmtUUID(ref.ArrayUUID), "member", r,
					"member-event", c.sb.Events, "down-at", ref.Recovery[r])
			}
			m.state.Store(uint32(st))
			if st == roleRebuilding {
				m.full = ref.RoleFull[r] != 0
				m.recovery.Store(int64(ref.Recovery[r]))
				missing++
			}
		}
		a.members[r].Store(m)
	}
	for _, rj := range rejected {
		a.emit(Event{Kind: MemberRejected, Member: rj.Role, Reason: rj.Reason})
	}
	if a.failedRoles() > g.Level.redundancy(g.Members) {
		return nil, rejected, &AssembleError{Err: fmt.Errorf("array %s: %d of %d members usable, %s needs %d: %w", fmtUUID(ref.ArrayUUID),
			g.Members-a.failedRoles(), g.Members, g.Level, g.Members-g.Level.redundancy(g.Members), ErrTooManyFailed), Rejected: rejected}
	}
	// Load the bitmap (OR of every present member's copy).
	if err := a.bm.load(); err != nil {
		return nil, rejected, err
	}
	for r := 0; r < g.Members; r++ {
		if m := a.member(r); uint8(m.state.Load()) == roleRebuilding && !m.full {
			m.dirty = a.bm.snapshot()
		}
	}
	clean := ref.Flags&flagClean != 0
	// Sequence numbers continue above anything ever logged.
	// Sequence numbers continue above anything ever logged; the tail
	// stays where it was until the replay is done.
	a.jl.nextSeq = max(ref.LogSeq, 1)
	a.jl.tail = a.jl.nextSeq
	if !clean && a.logOn {
		a.jl.tail = max(ref.LogTail, 1)
	}
	a.sbt.Flags &^= flagClean
	if err := a.writeSuperblocks(); err != nil {
		return nil, rejected, err
	}
	a.dirtyOnSB.Store(true)
	if !clean && a.logOn {
		n, err := a.jl.replay(ref.LogTail, ref.LogSeq)
		if err != nil {
			return nil, rejected, fmt.Errorf("array %s: replaying the partial parity log: %w", fmtUUID(ref.ArrayUUID), err)
		}
		if err := a.flushMembers(); err != nil {
			return nil, rejected, err
		}
		if err := a.writeSuperblocks(); err != nil { // persists the new log tail
			return nil, rejected, err
		}
		a.emit(Event{Kind: LogReplayed, Member: -1, Count: int64(n)})
	}
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
	a.log.Info("raid array assembled", "uuid", fmtUUID(a.uuid), "level", g.Level, "state", a.describe(), "clean", clean, "rejected", len(rejected))
	return a, rejected, nil
}
