package raid

import (
	"fmt"
	"strings"

	"tier0/daemon/blockdev"
)

// memberText describes role r for an error about one stripe. Caller
// holds a.mu or accepts a racy reason.
func (a *Array) memberTextLocked(r int, s int64) string {
	m := a.member(r)
	if m == nil {
		return fmt.Sprintf("member %d (missing)", r)
	}
	switch uint8(m.state.Load()) {
	case roleRebuilding:
		if m.full {
			return fmt.Sprintf("member %d (rebuilding, stripe not yet rebuilt)", r)
		}
		return fmt.Sprintf("member %d (delta resync, stripe not yet resynced)", r)
	case roleActive:
		return fmt.Sprintf("member %d (active)", r)
	}
	return fmt.Sprintf("member %d (failed: %s)", r, m.reason)
}

// outOfSync lists the roles that hold no valid chunk of stripe s.
func (a *Array) outOfSync(s int64) []int {
	var out []int
	for r := range a.members {
		if !a.inSync(a.member(r), s) {
			out = append(out, r)
		}
	}
	return out
}

// stripeLost reports whether stripe s lacks data: more of its chunks
// are out of sync than the level can reconstruct.
func (a *Array) stripeLost(s int64) bool {
	if a.geo.Level == RAID1 || a.geo.Level == RAID0 {
		return false // decided per request by the callers
	}
	c := 0
	for r := range a.members {
		if !a.inSync(a.member(r), s) {
			c++
		}
	}
	return c > a.geo.ParityDisks
}

// unavailable is the error of I/O to stripe s when the stripe lacks
// data while the array as a whole has not failed.
func (a *Array) unavailable(s int64) error {
	if err := a.usable(); err != nil {
		return err
	}
	roles := a.outOfSync(s)
	a.mu.Lock()
	var parts []string
	for _, r := range roles {
		parts = append(parts, a.memberTextLocked(r, s))
	}
	a.mu.Unlock()
	lo := s * a.geo.StripeSize
	return fmt.Errorf("raid %s: stripe %d (array bytes [%d, %d)): no valid chunk on %s; %s reconstructs at most %d: %w: %w",
		fmtUUID(a.uuid), s, lo, lo+a.geo.StripeSize, strings.Join(parts, " and "), a.geo.Level, a.geo.ParityDisks, ErrUnavailable, blockdev.ErrIO)
}

// unavailableStripes counts the stripes that lack data now.
func (a *Array) unavailableStripes() int64 {
	if a.geo.Level != RAID5 && a.geo.Level != RAID6 || a.dead.Load() {
		return 0
	}
	np := a.geo.ParityDisks
	if a.notActive() <= np {
		return 0
	}
	rs := a.bm.regionStripes
	var n int64
	for r0 := int64(0); r0 < a.geo.Stripes; r0 += rs {
		r1 := min(r0+rs, a.geo.Stripes)
		// Members that may be out of sync somewhere in the region.
		maybe := 0
		for r := range a.members {
			m := a.member(r)
			if m == nil || !present(m) {
				maybe++
				continue
			}
			if uint8(m.state.Load()) == roleRebuilding && r1 > m.recovery.Load() && (m.full || m.missed != nil || m.dirty[r0/rs]) {
				maybe++
			}
		}
		if maybe <= np {
			continue
		}
		for s := r0; s < r1; s++ {
			if a.stripeLost(s) {
				n++
			}
		}
	}
	return n
}

func (a *Array) lockStripe(s int64) { a.locks[uint64(s)%stripeLocks].Lock() }

func (a *Array) unlockStripe(s int64) { a.locks[uint64(s)%stripeLocks].Unlock() }

// roles of stripe s: dataRole(s,i) holds data index i; parityRole(s,k)
// holds P (k=0) or Q (k=1). md left-symmetric.
func (a *Array) dataRole(s int64, i int) int {
	n := int64(a.geo.Members)
	switch a.geo.Level {
	case RAID5:
		pd := n - 1 - s%n
		return int((pd + 1 + int64(i)) % n)
	case RAID6:
		pd := n - 1 - s%n
		return int((pd + 2 + int64(i)) % n)
	}
	return i
}

func (a *Array) parityRole(s int64, k int) int {
	n := int64(a.geo.Members)
	pd := n - 1 - s%n
	return int((pd + int64(k)) % n)
}

// moff is the member offset of row r of stripe s.
func (a *Array) moff(s int64, r int64) int64 { return a.geo.DataOffset + s*a.geo.ChunkSize + r }

func (a *Array) describe() string {
	var b strings.Builder
	for r := range a.members {
		m := a.member(r)
		if m == nil {
			b.WriteString("-")
		} else {
			fmt.Fprintf(&b, "%d", m.state.Load())
		}
	}
	return b.String()
}
