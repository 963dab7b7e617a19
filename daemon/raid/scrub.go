package raid

import (
	"bytes"
	"errors"
	"fmt"

	"tier0/daemon/blockdev"
)

// syncStripe checks stripe s (lock held) and, with fix, rewrites parity
// (or mirrors) from data. With locate (RAID-6 scrub) a single bad data
// chunk is found and repaired instead. It reports a mismatch and whether
// it was repaired.
func (a *Array) syncStripe(s int64, fix, locate bool) (bool, bool, error) {
	C := a.geo.ChunkSize
	if a.geo.Level == RAID1 {
		// The reference is the first active member (the one mirror reads
		// use during a resync); every other in-sync member is compared.
		var refM *member
		for r := range a.members {
			if m := a.member(r); m != nil && uint8(m.state.Load()) == roleActive {
				refM = m
				break
			}
		}
		if refM == nil {
			return false, false, nil
		}
		ref := blockdev.AlignedBuffer(int(C))
		if err := a.mread(refM, ref, a.moff(s, 0)); err != nil {
			return false, false, err
		}
		mismatch := false
		for r := range a.members {
			m := a.member(r)
			if m == refM || !a.inSync(m, s) {
				continue
			}
			buf := blockdev.AlignedBuffer(int(C))
			if err := a.mread(m, buf, a.moff(s, 0)); err != nil {
				return false, false, err
			}
			if !bytes.Equal(ref, buf) {
				mismatch = true
				if fix {
					if err := a.mwrite(m, ref, a.moff(s, 0), false); err != nil {
						return true, false, err
					}
				}
			}
		}
		return mismatch, mismatch && fix, nil
	}
	if a.geo.Level == RAID0 {
		return false, false, nil
	}
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	shards := make([][]byte, nd+np)
	var reads []mop
	have := 0
	for x := 0; x < nd+np; x++ {
		var r int
		if x < nd {
			r = a.dataRole(s, x)
		} else {
			r = a.parityRole(s, x-nd)
		}
		if m := a.member(r); a.inSync(m, s) {
			shards[x] = blockdev.AlignedBuffer(int(C))
			reads = append(reads, mop{m: m, buf: shards[x], off: a.moff(s, 0)})
			have++
		}
	}
	if have <= nd {
		return false, false, nil // nothing to compare against
	}
	if err := a.run(reads); err != nil {
		return false, false, err
	}
	if have < nd+np {
		// Degraded: rebuild the missing shards from the first nd, then
		// compare what is left.
		orig := make([][]byte, nd+np)
		copy(orig, shards)
		if err := a.coder.enc.Reconstruct(shards); err != nil {
			return false, false, err
		}
		ok, err := a.coder.enc.Verify(shards)
		return err == nil && !ok, false, err
	}
	syn := make([][]byte, np)
	for k := range syn {
		syn[k] = make([]byte, C)
		copy(syn[k], shards[nd+k])
		for i := 0; i < nd; i++ {
			a.coder.mulXor(k, i, shards[i], syn[k])
		}
	}
	bad := false
	for k := range syn {
		if !isZero(syn[k]) {
			bad = true
		}
	}
	if !bad {
		return false, false, nil
	}
	if !fix {
		return true, false, nil
	}
	if locate && np == 2 && !isZero(syn[0]) && !isZero(syn[1]) {
		if z := locateQ(syn[0], syn[1], nd); z >= 0 {
			xorInto(shards[z], syn[0])
			err := a.mwrite(a.member(a.dataRole(s, z)), shards[z], a.moff(s, 0), false)
			return true, err == nil, err
		}
	}
	// Rewrite the parity from the data (RAID-5 cannot tell which chunk
	// is wrong; RAID-6 with one bad parity chunk lands here too).
	for k := 0; k < np; k++ {
		if isZero(syn[k]) {
			continue
		}
		xorInto(shards[nd+k], syn[k])
		if err := a.mwrite(a.member(a.parityRole(s, k)), shards[nd+k], a.moff(s, 0), false); err != nil {
			return true, false, err
		}
	}
	return true, true, nil
}

// StartScrub queues a scrub: every stripe's parity is checked; with
// repair, mismatches are fixed (RAID-6 locates and repairs a single bad
// chunk; RAID-5 rewrites parity). Results arrive as ScrubMismatch and
// ScrubDone events.
func (a *Array) StartScrub(repair bool) error {
	if err := a.usable(); err != nil {
		return err
	}
	if a.degraded() {
		return fmt.Errorf("scrub needs every member in sync: %w", ErrDegraded)
	}
	a.bg.enqueue(task{kind: taskScrub, repair: repair})
	return nil
}

func (a *Array) scrub(repair bool) (bad int64, err error) {
	p := a.newProgress(ScrubProgress, "scrub", -1, a.geo.Stripes*a.geo.ChunkSize)
	a.bg.scrubUpdate(func(st *ScrubStatus) { *st = ScrubStatus{Running: true, Repair: repair, Started: a.clock.Now()} })
	defer func() {
		a.bg.scrubUpdate(func(st *ScrubStatus) {
			st.Running = false
			if err != nil {
				st.Err = err.Error()
			} else {
				st.Finished = a.clock.Now()
			}
		})
	}()
	a.emit(Event{Kind: ScrubStarted, Member: -1, Total: p.total})
	for s := int64(0); s < a.geo.Stripes; s++ {
		if a.bg.pass() {
			return bad, ErrStopped
		}
		if err := a.usable(); err != nil {
			return bad, err
		}
		if a.degraded() {
			return bad, fmt.Errorf("scrub interrupted at stripe %d: %w", s, ErrDegraded)
		}
		a.lockStripe(s)
		mismatch, repaired, err := a.syncStripe(s, repair, true)
		a.unlockStripe(s)
		if err != nil {
			a.bg.scrubUpdate(func(st *ScrubStatus) { st.Unreadable++ })
			if !errors.Is(err, errGone) {
				return bad, err
			}
		}
		a.bg.scrubUpdate(func(st *ScrubStatus) {
			st.Stripes++
			if mismatch {
				st.Mismatches++
			}
			if repaired {
				st.Repaired++
			}
		})
		if mismatch {
			bad++
			a.emit(Event{Kind: ScrubMismatch, Member: -1, Stripe: s, Repaired: repaired})
		}
		p.step(a.geo.ChunkSize)
	}
	e := p.event()
	e.Kind, e.Count = ScrubDone, bad
	a.emit(e)
	return bad, nil
}

// Check verifies the parity (or mirrors) of every stripe that has a
// member to compare against and returns an error wrapping
// ErrInconsistent naming the bad stripes. It takes each stripe lock in
// turn and may run alongside I/O. Tests call it after every array.
func (a *Array) Check() error {
	if err := a.usable(); err != nil {
		return err
	}
	var bad []int64
	for s := int64(0); s < a.geo.Stripes; s++ {
		var mismatch bool
		var err error
		for attempt := 0; attempt <= a.geo.Members; attempt++ {
			a.lockStripe(s)
			mismatch, _, err = a.syncStripe(s, false, false)
			a.unlockStripe(s)
			if !errors.Is(err, errGone) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("raid %s check: stripe %d: %w", fmtUUID(a.uuid), s, err)
		}
		if mismatch {
			bad = append(bad, s)
		}
	}
	if len(bad) > 0 {
		show := bad
		if len(show) > 8 {
			show = show[:8]
		}
		return fmt.Errorf("raid %s: %d stripes fail the parity check, first %v: %w", fmtUUID(a.uuid), len(bad), show, ErrInconsistent)
	}
	return nil
}
