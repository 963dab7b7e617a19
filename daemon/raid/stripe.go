package raid

import (
	"errors"
	"fmt"
	"sync"

	"tier0/daemon/blockdev"
)

// A partial or full update of one RAID-5/6 stripe runs in three steps,
// all under the stripe lock: planStripe takes the member view (a value,
// stripePlan); one strategy — full stripe, read-modify-write or
// reconstruct-write on a healthy stripe, or degraded — reads what it
// needs, computes the new parity and the partial parity log entry, and
// queues the member writes; commitStripe logs, writes and handles a
// member lost mid-update. The buffers live in a pooled stripeWork, so a
// stripe update allocates nothing of its own. See docs/RAID.md.

// cover is the byte range [a, b) of a data chunk that a write modifies.
type cover struct{ a, b int64 }

// chunkCover is the part of data chunk i (size C) that the byte range
// [lo, hi) of a stripe's data covers; false when it covers none of it.
func chunkCover(lo, hi, C int64, i int) (cover, bool) {
	cs := int64(i) * C
	x, y := max(lo, cs), min(hi, cs+C)
	return cover{x - cs, y - cs}, x < y
}

// stripePlan is one stripe update as seen when it was planned.
type stripePlan struct {
	s        int64
	lo, hi   int64  // byte range inside the stripe's data
	buf      []byte // the caller's bytes for [lo, hi)
	fua      bool
	C        int64 // chunk size
	nd, np   int
	mask     uint64 // modified data chunks
	rlo, rhi int64  // row range: the union of the modified rows
	cov      [maxMembers]cover
	dm       [maxMembers]*member // data members by data index
	din      [maxMembers]bool    // in sync
	pm       [2]*member          // parity members (P, Q)
	pin      [2]bool
	healthy  bool
	// missingData: data chunks out of sync; presentParity: parity
	// chunks in sync.
	missingData, presentParity int
}

func (p *stripePlan) rows() int64        { return p.rhi - p.rlo }
func (p *stripePlan) touched(i int) bool { return p.mask&(1<<i) != 0 }

// covers reports whether the write replaces chunk i over the whole row range.
func (p *stripePlan) covers(i int) bool { return p.cov[i].a <= p.rlo && p.cov[i].b >= p.rhi }
func (p *stripePlan) data() []*member   { return p.dm[:p.nd] }

// newBytes is the caller's new content of chunk i (its covered rows).
func (p *stripePlan) newBytes(i int) []byte {
	cs := int64(i) * p.C
	return p.buf[cs+p.cov[i].a-p.lo : cs+p.cov[i].b-p.lo]
}

// stripeWork holds one stripe update's plan and buffers; pooled.
type stripeWork struct {
	p       stripePlan
	sc      scratch
	reads   []mop
	ops     []mop
	shards  [maxMembers + 2][]byte // data by index, then parity
	partial [2][]byte
	ent     logEntry
	logged  bool
	roles   [2]int
}

var workPool = sync.Pool{New: func() any { return new(stripeWork) }}

func getWork() *stripeWork { return workPool.Get().(*stripeWork) }

func (w *stripeWork) release() {
	w.sc.release()
	clear(w.reads)
	clear(w.ops)
	w.reads, w.ops = w.reads[:0], w.ops[:0]
	clear(w.shards[:])
	w.partial = [2][]byte{}
	w.ent = logEntry{}
	w.logged = false
	w.p.buf = nil
	clear(w.p.dm[:])
	w.p.pm = [2]*member{}
	workPool.Put(w)
}

func (w *stripeWork) read(m *member, buf []byte, off int64) {
	w.reads = append(w.reads, mop{m: m, buf: buf, off: off, slow: true})
}

func (w *stripeWork) write(m *member, buf []byte, off int64) {
	w.ops = append(w.ops, mop{m: m, buf: buf, off: off, write: true, fua: w.p.fua})
}

// planStripe fills p for the update of sp; it fails when the stripe
// lacks data.
func (a *Array) planStripe(p *stripePlan, sp span, fua bool) error {
	C := a.geo.ChunkSize
	s := sp.s
	*p = stripePlan{s: s, lo: sp.lo, hi: sp.hi, buf: sp.buf, fua: fua, C: C, nd: a.geo.DataDisks, np: a.geo.ParityDisks,
		rlo: C, healthy: true}
	for i := 0; i < p.nd; i++ {
		if c, ok := chunkCover(sp.lo, sp.hi, C, i); ok {
			p.cov[i] = c
			p.mask |= 1 << i
			p.rlo, p.rhi = min(p.rlo, c.a), max(p.rhi, c.b)
		}
		p.dm[i] = a.member(a.dataRole(s, i))
		p.din[i] = a.inSync(p.dm[i], s)
		if !p.din[i] {
			p.healthy = false
			p.missingData++
		}
	}
	for k := 0; k < p.np; k++ {
		p.pm[k] = a.member(a.parityRole(s, k))
		p.pin[k] = a.inSync(p.pm[k], s)
		if p.pin[k] {
			p.presentParity++
		} else {
			p.healthy = false
		}
	}
	if p.missingData+(p.np-p.presentParity) > p.np {
		return a.unavailable(s)
	}
	return nil
}

// writeSpanLocked updates one stripe (stripe lock held).
func (a *Array) writeSpanLocked(sp span, fua bool) error {
	w := getWork()
	defer w.release()
	p := &w.p
	if err := a.planStripe(p, sp, fua); err != nil {
		return err
	}
	// Whatever happens below, the members failed now or during the
	// update missed this stripe (a ReAdd catches them up on it).
	defer a.noteMissed(p)
	var err error
	switch {
	case p.healthy && p.lo == 0 && p.hi == a.geo.StripeSize:
		a.planFullStripe(w)
	case p.healthy:
		err = a.planPartial(w)
	default:
		err = a.planDegraded(w)
	}
	if err != nil {
		return err
	}
	return a.commitStripe(w)
}

// planFullStripe: the whole stripe is new, no reads.
func (a *Array) planFullStripe(w *stripeWork) {
	p := &w.p
	nd, np, C := p.nd, p.np, p.C
	sh := w.shards[:nd+np]
	for i := 0; i < nd; i++ {
		sh[i] = p.newBytes(i)
	}
	for k := 0; k < np; k++ {
		sh[nd+k] = w.sc.get(C)
	}
	a.coder.encodeShards(sh)
	// Logged while a member of the stripe rebuilds: a data chunk's so
	// that the entry carries its new content (logFragile); a parity
	// chunk's so that, after a crash with the write in flight, the
	// replay marks the stripe for the members away at the assembly
	// (apply), which missedInFlight does only after an optimal array's
	// stop.
	if a.logOn && (a.jl.needsMarker(p.s) || fragile(p.data()) || fragile(p.pm[:p.np])) {
		w.logged = true
		w.ent = logEntry{stripe: p.s, lo: p.lo, hi: p.hi, rlo: 0, rhi: C, mask: p.mask, zero: true}
		logFragile(&w.ent, p.data(), sh[:nd])
	}
	for i := 0; i < nd; i++ {
		w.write(p.dm[i], sh[i], a.moff(p.s, 0))
	}
	for k := 0; k < np; k++ {
		w.write(p.pm[k], sh[nd+k], a.moff(p.s, 0))
	}
}

// planPartial updates part of a healthy stripe by read-modify-write (read
// the old data of the modified chunks and the parity) or reconstruct-
// write (read the unmodified chunks), whichever reads less.
func (a *Array) planPartial(w *stripeWork) error {
	p := &w.p
	nd, np, L, s := p.nd, p.np, p.rows(), p.s
	cols := w.shards[:nd]
	ntouch, npartial := 0, 0
	for i := 0; i < nd; i++ {
		if p.touched(i) {
			ntouch++
			if !p.covers(i) {
				npartial++
			}
		}
	}
	if ntouch+np < nd-ntouch+npartial {
		// Read-modify-write: partial = old parity - old modified data.
		for k := 0; k < np; k++ {
			w.partial[k] = w.sc.get(L)
			w.read(p.pm[k], w.partial[k], a.moff(s, p.rlo))
		}
		for i := 0; i < nd; i++ {
			if p.touched(i) {
				cols[i] = w.sc.get(L)
				w.read(p.dm[i], cols[i], a.moff(s, p.rlo))
			}
		}
		if err := a.run(w.reads); err != nil {
			return retryOn(err)
		}
		for k := 0; k < np; k++ {
			for i := 0; i < nd; i++ {
				if p.touched(i) {
					a.coder.mulXor(k, i, cols[i], w.partial[k])
				}
			}
		}
	} else {
		// Reconstruct-write: partial = parity of the unmodified data.
		for i := 0; i < nd; i++ {
			if !p.touched(i) || !p.covers(i) {
				cols[i] = w.sc.get(L)
				w.read(p.dm[i], cols[i], a.moff(s, p.rlo))
			}
		}
		if err := a.run(w.reads); err != nil {
			return retryOn(err)
		}
		for k := 0; k < np; k++ {
			w.partial[k] = w.sc.zero(L)
			for i := 0; i < nd; i++ {
				if !p.touched(i) {
					a.coder.mulXor(k, i, cols[i], w.partial[k])
				}
			}
		}
	}
	// New content of the modified columns, then the new parity.
	for i := 0; i < nd; i++ {
		if !p.touched(i) {
			continue
		}
		if p.covers(i) {
			cols[i] = p.newBytes(i)[p.rlo-p.cov[i].a : p.rhi-p.cov[i].a]
		} else {
			copy(cols[i][p.cov[i].a-p.rlo:], p.newBytes(i))
		}
	}
	for k := 0; k < np; k++ {
		par := w.sc.get(L)
		copy(par, w.partial[k])
		for i := 0; i < nd; i++ {
			if p.touched(i) {
				a.coder.mulXor(k, i, cols[i], par)
			}
		}
		w.shards[nd+k] = par
	}
	if a.logOn {
		w.logged = true
		a.addUncovered(p, w.partial, cols)
		w.ent = logEntry{stripe: s, lo: p.lo, hi: p.hi, rlo: p.rlo, rhi: p.rhi, mask: p.mask}
		copy(w.ent.partial[:], w.partial[:np])
		logFragile(&w.ent, p.data(), cols)
	}
	for i := 0; i < nd; i++ {
		if p.touched(i) {
			w.write(p.dm[i], p.newBytes(i), a.moff(s, p.cov[i].a))
		}
	}
	for k := 0; k < np; k++ {
		w.write(p.pm[k], w.shards[nd+k], a.moff(s, p.rlo))
	}
	return nil
}

// addUncovered adds to the partial parity the rows of each partly written
// chunk that the write leaves as they are (cols holds their content over
// the row range), so that the partial covers every unmodified byte of the
// rows: a replay then needs a modified chunk's content only where the
// write covers it, and a partly written chunk whose member is gone at
// the replay keeps its untouched rows.
func (a *Array) addUncovered(p *stripePlan, partial [2][]byte, cols [][]byte) {
	for i := 0; i < p.nd; i++ {
		if !p.touched(i) || p.covers(i) {
			continue
		}
		c := p.cov[i]
		for k := 0; k < p.np; k++ {
			if partial[k] == nil {
				continue
			}
			if c.a > p.rlo {
				a.coder.mulXor(k, i, cols[i][:c.a-p.rlo], partial[k][:c.a-p.rlo])
			}
			if c.b < p.rhi {
				a.coder.mulXor(k, i, cols[i][c.b-p.rlo:], partial[k][c.b-p.rlo:])
			}
		}
	}
}

// planDegraded updates a stripe with a member out of sync: read the
// present chunks of the row range that the update needs, reconstruct the
// missing ones, recompute the parity.
//
// A missing chunk's old content is needed only when the write leaves
// some of its rows as they are (untouched, or partly written): it counts
// in the partial parity or in the new parity there. When every missing
// data chunk is replaced over the whole row range (a full-stripe write,
// most of a sequential stream), nothing is reconstructed: the chunks the
// write replaces are not read, nor is the parity, and the update reads
// only the untouched and partly written chunks (the partial parity's),
// as planPartial's reconstruct-write does. Reading everything made a
// degraded sequential write cost about twice a healthy one.
func (a *Array) planDegraded(w *stripeWork) error {
	p := &w.p
	nd, np, L, s := p.nd, p.np, p.rows(), p.s
	sh := w.shards[:nd+np]
	recon := false
	for i := 0; i < nd; i++ {
		if !p.din[i] && !p.covers(i) {
			recon = true
		}
	}
	for i := 0; i < nd; i++ {
		switch {
		case !recon && p.covers(i):
			// replaced over the row range: its new bytes are its content
			sh[i] = p.newBytes(i)[p.rlo-p.cov[i].a : p.rhi-p.cov[i].a]
		case p.din[i]:
			sh[i] = w.sc.get(L)
			w.read(p.dm[i], sh[i], a.moff(s, p.rlo))
		default:
			sh[i] = w.sc.get(L)[:0] // filled by reconstruct, no allocation
		}
	}
	if recon {
		for k := 0; k < np; k++ {
			if p.pin[k] {
				sh[nd+k] = w.sc.get(L)
				w.read(p.pm[k], sh[nd+k], a.moff(s, p.rlo))
			}
		}
	}
	if err := a.run(w.reads); err != nil {
		return retryOn(err)
	}
	if recon {
		if err := a.coder.reconstruct(sh); err != nil {
			return fmt.Errorf("raid %s: stripe %d reconstruct: %v: %w", fmtUUID(a.uuid), s, err, ErrTooManyFailed)
		}
	}
	cols := sh[:nd]
	for k := 0; k < np; k++ {
		w.partial[k] = w.sc.zero(L)
		for i := 0; i < nd; i++ {
			if !p.touched(i) {
				a.coder.mulXor(k, i, cols[i], w.partial[k])
			}
		}
	}
	a.addUncovered(p, w.partial, cols)
	for i := 0; i < nd; i++ {
		if p.touched(i) && (recon || !p.covers(i)) {
			copy(cols[i][p.cov[i].a-p.rlo:], p.newBytes(i))
		}
	}
	for k := 0; k < np; k++ {
		sh[nd+k] = w.sc.get(L)
	}
	a.coder.encodeShards(sh)
	if a.logOn && p.presentParity > 0 {
		w.logged = true
		w.ent = logEntry{stripe: s, lo: p.lo, hi: p.hi, rlo: p.rlo, rhi: p.rhi, mask: p.mask, missing: map[int][]byte{}}
		for k := 0; k < np; k++ {
			if p.pin[k] {
				w.ent.partial[k] = w.partial[k]
			}
		}
		for i := 0; i < nd; i++ {
			if p.touched(i) && !p.din[i] {
				w.ent.missing[i] = cols[i]
			}
		}
		logFragile(&w.ent, p.data(), cols)
	}
	for i := 0; i < nd; i++ {
		if p.touched(i) && p.din[i] {
			w.write(p.dm[i], p.newBytes(i), a.moff(s, p.cov[i].a))
		}
	}
	for k := 0; k < np; k++ {
		if p.pin[k] {
			w.write(p.pm[k], sh[nd+k], a.moff(s, p.rlo))
		}
	}
	return nil
}

// maxLoggedChunks is how many chunks' new content one log entry carries
// (entHeader.Missing): the chunks of missing members, and those of members
// under rebuild, which a crash could leave torn.
const maxLoggedChunks = len(entHeader{}.Missing)

// unloggable refuses a write whose log entry would have to carry more
// chunks than an entry holds: on RAID-6 two members missing and a third
// rebuilding, all three modified. Writing it unlogged would leave a crash
// mid-update unrepairable, so the write is refused (fence and refuse
// rather than guess) until the rebuild has finished; reads go on.
func (a *Array) unloggable(s int64, n int) error {
	lo := s * a.geo.StripeSize
	return fmt.Errorf("raid %s: stripe %d (array bytes [%d, %d)): the write modifies %d chunks on missing or rebuilding members and the partial-parity log carries at most %d; it is refused until the rebuild finishes (or write fewer chunks of the stripe): %w: %w",
		fmtUUID(a.uuid), s, lo, lo+a.geo.StripeSize, n, maxLoggedChunks, ErrUnavailable, blockdev.ErrIO)
}

// commitStripe writes the log entry (if any), then the planned member
// writes; a member lost mid-update leaves a consistent stripe on the
// survivors, which are flushed before anyone relies on it.
func (a *Array) commitStripe(w *stripeWork) error {
	p := &w.p
	if w.logged {
		// The partial parity assumes the bytes it covers are durable
		// (unflushed.go): with a member missing or rebuilding, any
		// write to the stripe since the last flush; on a healthy
		// stripe, only one to the bytes the partial covers (a crash
		// that also loses a member would rebuild its chunk from it).
		// (The healthy case flushes only the stripe's members that
		// hold its unflushed writes, flushForPartial.)
		if !p.healthy && a.jl.unflushed(p.s) {
			if err := a.flushMembers(); err != nil {
				return retryOn(err)
			}
		} else if p.healthy && a.jl.partialUnflushed(p.s, p.lo, p.hi, p.rlo, p.rhi, p.C) {
			if err := a.flushForPartial(p); err != nil {
				return retryOn(err)
			}
		}
		if len(w.ent.missing) > maxLoggedChunks {
			return a.unloggable(p.s, len(w.ent.missing))
		}
		n := 0
		for k := 0; k < p.np; k++ {
			if p.pin[k] {
				w.roles[n] = p.pm[k].role
				n++
			}
		}
		if err := a.jl.begin(&w.ent, w.roles[:n]); err != nil {
			return retryOn(err)
		}
		defer a.jl.end(&w.ent)
	}
	// A member that fails now leaves the stripe consistent: the parity
	// written covers the new content of every chunk.
	err := a.run(w.ops)
	a.jl.wrote(p.s, p.lo, p.hi, p.fua)
	if errors.Is(err, errGone) {
		// A member failed mid-update. The survivors hold a consistent
		// stripe, but the log entry may lack the lost member's new
		// data: make the survivors durable before anyone relies on it.
		err = a.flushMembers()
		if err == nil && a.stripeLost(p.s) {
			// Not acknowledged: the stripe lacks data now (a member
			// under resync and this one).
			return a.unavailable(p.s)
		}
	}
	if err != nil && !errors.Is(err, errGone) {
		return err
	}
	return nil
}

// noteMissed records the plan's stripe in the since-failure set of every
// member of the stripe that is failed now (stripe lock held).
func (a *Array) noteMissed(p *stripePlan) {
	for _, m := range p.dm[:p.nd] {
		noteMissedOn(m, p.s)
	}
	for _, m := range p.pm[:p.np] {
		noteMissedOn(m, p.s)
	}
}

// The state is read first: markFailedLocked sets since before it stores
// "failed", so a writer that sees "failed" sees since (reading since first
// raced with a member failing under another request: the race detector in
// TestArrayFailedStopsServingAndComesBack).
func noteMissedOn(m *member, s int64) {
	if m != nil && uint8(m.state.Load()) == roleFailed && m.since != nil {
		m.since.set(s)
	}
}
