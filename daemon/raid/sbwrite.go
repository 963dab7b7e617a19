package raid

import (
	"errors"
	"fmt"
	"sync"

	"tier0/daemon/blockdev"
)

// writeSuperblocks bumps the event counter and writes the superblock to
// every present member. Members that fail are marked failed and the
// update is repeated for the others.
func (a *Array) writeSuperblocks() error {
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	for loop := 0; loop <= a.geo.Members; loop++ {
		a.mu.Lock()
		a.sbt.Events++
		base := a.sbt
		base.LogTail, base.LogSeq = a.jl.persistTail()
		for r := range a.members {
			m := a.member(r)
			base.RoleState[r], base.RoleFull[r], base.Recovery[r] = roleFailed, 0, 0
			if m == nil {
				continue
			}
			st := uint8(m.state.Load())
			base.RoleState[r] = st
			if st == roleEmpty {
				base.RoleState[r] = roleFailed
			}
			if st == roleFailed && m.withArray {
				base.RoleState[r], base.Recovery[r] = roleDown, m.downAt
			} else if st == roleFailed && m.missing {
				base.RoleState[r] = roleMissing
				if m.missingFull {
					base.RoleFull[r] = 1
				}
			}
			if st == roleRebuilding {
				base.Recovery[r] = uint64(m.durable.Load())
				if m.full {
					base.RoleFull[r] = 1
				}
			}
		}
		a.mu.Unlock()
		var failed []*member
		var unreach []bool
		var why []string
		var fenced error
		var fmu sync.Mutex
		a.each(func(m *member) error {
			sb := base
			sb.Role = uint32(m.role)
			if err := writeSB(m.dev, &sb); err != nil {
				fmu.Lock()
				if errors.Is(err, blockdev.ErrFenced) {
					fenced = err
				} else {
					failed = append(failed, m)
					unreach = append(unreach, a.unreachable(err))
					why = append(why, "superblock write: "+err.Error())
				}
				fmu.Unlock()
				return err
			}
			return nil
		})
		if fenced != nil {
			a.memberErr(a.member(0), "superblock write", fenced)
			return fmt.Errorf("raid %s superblock: %w", fmtUUID(a.uuid), blockdev.ErrFenced)
		}
		if len(failed) == 0 {
			return nil
		}
		var newly []*member
		var newlyMissing, newlyWith []bool
		a.mu.Lock()
		for i, m := range failed {
			if a.markFailedLocked(m, why[i], unreach[i]) {
				newly, newlyMissing, newlyWith = append(newly, m), append(newlyMissing, unreach[i]), append(newlyWith, m.withArray)
			}
		}
		a.mu.Unlock()
		for i, m := range newly {
			a.log.Warn("raid member failed", "uuid", fmtUUID(a.uuid), "member", m.role, "reason", m.reason)
			a.emit(Event{Kind: MemberFailed, Member: m.role, Reason: m.reason, Missing: newlyMissing[i], WithArray: newlyWith[i]})
		}
		if !a.checkDead() && len(newly) > 0 {
			a.emit(Event{Kind: Degraded, Member: newly[0].role, Reason: "superblock write failed"})
		}
	}
	return fmt.Errorf("raid %s: superblock could not be written to enough members: %w", fmtUUID(a.uuid), ErrTooManyFailed)
}

// markDirty records "not clean" on the superblocks before the first write
// after a clean state.
func (a *Array) markDirty() error {
	if a.dirtyOnSB.Load() {
		return nil
	}
	a.mu.Lock()
	if a.dirtyOnSB.Load() {
		a.mu.Unlock()
		return nil
	}
	a.sbt.Flags &^= flagClean
	a.mu.Unlock()
	if err := a.writeSuperblocks(); err != nil {
		return err
	}
	a.dirtyOnSB.Store(true)
	return nil
}
