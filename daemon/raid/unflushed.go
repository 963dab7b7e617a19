package raid

import (
	"errors"
	"sync"
	"sync/atomic"
)

// Per-stripe unflushed state. A log entry's partial parity is computed
// from the current content of the bytes the write does not modify, and
// the replay after a crash trusts it: parity := partial ⊕ the modified
// chunks as they are on the members. If a byte the partial covers was
// written since the last flush, a crash may revert it, and a chunk
// rebuilt from that parity (a member lost with the crash) is wrong in
// rows it never wrote: acknowledged data lost. So before such an entry is
// logged, the members are flushed.
//
// The state is hashed per stripe (wstSlots entries). Stripes sharing a
// slot share a stripe lock (wstSlots is a multiple of stripeLocks), and
// every access happens under that lock, so lo and hi need no atomics.
// Two stripes in one slot merge their ranges: more flushes, never fewer.
const wstSlots = 1 << 16

// Every stripe of a wst slot hashes to the same stripe lock.
var _ [wstSlots % stripeLocks]struct{} = [0]struct{}{}

type wstate struct {
	gen    atomic.Uint64 // generation of the last completed write
	vgen   atomic.Uint64 // generation of the last completed write not made durable (no FUA)
	lo, hi int64         // bytes of the stripe's data written since the last flush (conservative union; empty when lo >= hi)
	// owner is the stripe whose writes lo and hi hold, plus one, or
	// ownerMixed when writes of two stripes of the slot merged there
	// (only a flush of every member then covers them all).
	owner int64
}

const ownerMixed = -1

func (j *journal) wslot(s int64) *wstate { return &j.wst[uint64(s)%wstSlots] }

// wrote records that a write of [lo, hi) of stripe s's data completed
// (stripe lock held); durable: written with FUA, so nothing of it can
// revert.
func (j *journal) wrote(s, lo, hi int64, durable bool) {
	w := j.wslot(s)
	if w.gen.Load() <= j.flushedGen.Load() {
		w.lo, w.hi = 0, 0 // everything written before is flushed
	}
	g := j.gen.Load()
	if !durable {
		if w.lo >= w.hi {
			w.lo, w.hi, w.owner = lo, hi, s+1
		} else {
			w.lo, w.hi = min(w.lo, lo), max(w.hi, hi)
			if w.owner != s+1 {
				w.owner = ownerMixed
			}
		}
		w.vgen.Store(g)
	}
	w.gen.Store(g)
}

// unflushed reports whether stripe s may hold writes not yet durable.
func (j *journal) unflushed(s int64) bool {
	return j.wslot(s).gen.Load() > j.flushedGen.Load()
}

// partialUnflushed reports whether the partial parity of a write of
// [lo, hi) of stripe s's data over rows [rlo, rhi) (chunk size C) covers
// a byte written since the last flush: a byte of the rows outside the
// write (stripe lock held).
func (j *journal) partialUnflushed(s, lo, hi, rlo, rhi, C int64) bool {
	w := j.wslot(s)
	if w.gen.Load() <= j.flushedGen.Load() || w.lo >= w.hi || rlo >= rhi {
		return false
	}
	// The dirty range minus the write: at most two pieces.
	return rowsMeet(w.lo, min(w.hi, lo), rlo, rhi, C) || rowsMeet(max(w.lo, hi), w.hi, rlo, rhi, C)
}

// rowsMeet reports whether a byte of [x, y) lies in rows [rlo, rhi) of its
// chunk (rlo < rhi ≤ C).
func rowsMeet(x, y, rlo, rhi, C int64) bool {
	if x >= y {
		return false
	}
	if y-x >= C {
		return true
	}
	a, b := x%C, x%C+(y-x) // residues [a, b), b may pass C (wraps)
	if a < rhi && b > rlo {
		return true
	}
	return b > C && b-C > rlo
}

// markUnflushed adds to set every stripe that may hold writes not yet
// durable (every stripe of a slot with a write not made durable, no FUA,
// after the last completed flush): a member that leaves unreachable may
// have lost them with its node's power, so it catches them up when it is
// taken back, as it does the stripes written while it was away.
func (j *journal) markUnflushed(set *stripeSet, stripes int64) {
	flushed := j.flushedGen.Load()
	for k := int64(0); k < wstSlots && k < stripes; k++ {
		if j.wst[k].vgen.Load() <= flushed {
			continue
		}
		for s := k; s < stripes; s += wstSlots {
			set.set(s)
		}
	}
}

// flushForPartial makes durable, before the log entry of plan p is
// written, the bytes its partial parity covers that were written since
// the last flush (partialUnflushed; stripe lock held). On a healthy
// stripe whose slot holds this stripe's writes alone, that is a flush of
// the members those writes went to: the data members of every chunk the
// written range spans and the stripe's parity members. Afterwards every
// completed write of the stripe is durable on every member it reached,
// exactly as after a flush of all members as far as this stripe is
// concerned, so its range is emptied and the slots of its older entries
// are freed (stripeDurable: rows whose data and parity are durable and
// agree need no replay). The parities are flushed too although the new
// entry's replay rewrites them over its rows: parity rows outside that
// entry that earlier writes of the interval changed must be durable once
// those writes' entries are freed. Nothing else changes: the log tail and the generations
// (flushedGen) move only with a flush of all members, so the entries of
// other stripes, markUnflushed and unflushed stay as conservative as
// before. A mixed slot, a degraded stripe or a failed member flush
// falls back to flushing every member.
func (a *Array) flushForPartial(p *stripePlan) error {
	w := a.jl.wslot(p.s)
	if !p.healthy || w.owner != p.s+1 || w.lo >= w.hi {
		return a.flushMembers()
	}
	roles := make([]int, 0, a.geo.Members)
	for i := w.lo / p.C; i <= (w.hi-1)/p.C && i < int64(a.geo.DataDisks); i++ {
		roles = append(roles, a.dataRole(p.s, int(i)))
	}
	for k := 0; k < a.geo.ParityDisks; k++ {
		roles = append(roles, a.parityRole(p.s, k))
	}
	if err := a.flushRoles(roles); err != nil {
		return a.flushMembers() // a member failed: the full path handles it
	}
	w.lo, w.hi = 0, 0
	a.jl.stripeDurable(p.s)
	return nil
}

// flushRoles flushes the members of roles in parallel; any of them not
// present or failing is an error (the caller then flushes every member).
func (a *Array) flushRoles(roles []int) error {
	errs := make([]error, len(roles))
	var wg sync.WaitGroup
	for x, r := range roles {
		m := a.member(r)
		if m == nil || uint8(m.state.Load()) != roleActive {
			return errGone
		}
		if a.serial() {
			errs[x] = a.call(m, "flush", m.dev.Flush)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[x] = a.call(m, "flush", m.dev.Flush)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
