package raid

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Striped reads (RAID-0/5/6). Chunks of in-sync members are read without
// a lock, one merged request per member. A stripe with a data chunk out
// of sync is read under its stripe lock; the stripes of one request are
// read as one batch (all their locks, one merged request per member), and
// a single missing data chunk is rebuilt by XOR from P and the other data
// chunks of its rows — the chunks the request reads anyway serve as
// sources where they cover those rows, so a sequential degraded read costs
// about one extra read (P) per missing chunk and one XOR pass. Two missing
// chunks, or a missing P, take the general reconstruction (readSpanLocked).

// lockStripes takes the stripe locks rw.locks names (indexes into
// a.locks, in any order, repeats allowed) in ascending order without
// repeats, so that two requests taking several never deadlock;
// unlockStripes releases them.
func (a *Array) lockStripes(rw *readWork) {
	slices.Sort(rw.locks)
	rw.locks = slices.Compact(rw.locks)
	for _, i := range rw.locks {
		a.locks[i].Lock()
	}
}

func (a *Array) unlockStripes(rw *readWork) {
	for _, i := range rw.locks {
		a.locks[i].Unlock()
	}
}

// readWork holds a striped read's plan and buffers; pooled.
type readWork struct {
	spans   []span
	slow    []span
	general []span
	ops     []mop
	srcs    [][]byte
	recons  []recon
	locks   []int
	req     []bool
	sc      scratch
	avoid   *member        // read around this member (a slow read, hedge.go)
	rb      [2]rebuildPart // a rebuild run's steps (rebuild.go)
}

// recon is one missing piece: dst = XOR of srcs[first:end].
type recon struct {
	dst        []byte
	first, end int
}

var readPool = sync.Pool{New: func() any { return new(readWork) }}

func getReadWork() *readWork { return readPool.Get().(*readWork) }

func (rw *readWork) release() {
	rw.sc.release()
	rw.rb[0].reset()
	rw.rb[1].reset()
	clear(rw.spans)
	clear(rw.slow)
	clear(rw.general)
	clear(rw.ops)
	clear(rw.srcs)
	clear(rw.recons)
	rw.spans, rw.slow, rw.general, rw.ops = rw.spans[:0], rw.slow[:0], rw.general[:0], rw.ops[:0]
	rw.srcs, rw.recons, rw.locks = rw.srcs[:0], rw.recons[:0], rw.locks[:0]
	rw.avoid = nil
	readPool.Put(rw)
}

// spans appends to dst the parts of a request inside each stripe.
func (a *Array) spansInto(dst []span, p []byte, off int64) []span {
	ss := a.geo.StripeSize
	end := off + int64(len(p))
	for pos := off; pos < end; {
		s := pos / ss
		lo := pos % ss
		hi := min(ss, lo+end-pos)
		dst = append(dst, span{s: s, lo: lo, hi: hi, buf: p[pos-off : pos-off+hi-lo]})
		pos += hi - lo
	}
	return dst
}

func (a *Array) spans(p []byte, off int64) []span { return a.spansInto(nil, p, off) }

func (a *Array) readStriped(p []byte, off int64) error {
	rw := getReadWork()
	defer rw.release()
	C := a.geo.ChunkSize
	rw.spans = a.spansInto(rw.spans, p, off)
	for _, sp := range rw.spans {
		ok := true
		start := len(rw.ops)
		for pos := sp.lo; pos < sp.hi; {
			i := int(pos / C)
			row := pos % C
			l := min(C-row, sp.hi-pos)
			m := a.member(a.dataRole(sp.s, i))
			if !a.inSync(m, sp.s) {
				ok = false
				break
			}
			rw.ops = append(rw.ops, mop{m: m, buf: sp.buf[pos-sp.lo : pos-sp.lo+l], off: a.moff(sp.s, row)})
			pos += l
		}
		if !ok {
			rw.ops = rw.ops[:start]
			rw.slow = append(rw.slow, sp)
		}
	}
	if len(rw.slow) > 0 && len(rw.spans) > 1 {
		// Degraded: all the request's stripes in one locked batch, so
		// that each member serves one merged request.
		return a.readSlow(rw.spans)
	}
	var err error
	if len(rw.ops) == 1 && len(rw.slow) == 0 && a.pol.SlowRead > 0 && (a.geo.Level == RAID5 || a.geo.Level == RAID6) {
		err = a.readHedged(rw.ops[0], rw.spans[0])
	} else {
		err = a.runGrouped(rw.ops)
	}
	if errors.Is(err, errGone) {
		// A member failed under us: do everything the careful way.
		return a.readSlow(rw.spans)
	}
	if err != nil {
		return err
	}
	return a.readSlow(rw.slow)
}

// slowBatch is the most stripes read under their locks as one batch.
const slowBatch = 16

// readSlow reads spans under their stripe locks, reconstructing chunks of
// members that are not in sync.
func (a *Array) readSlow(sps []span) error {
	for len(sps) > 0 {
		n := min(len(sps), slowBatch)
		if err := a.readSlowBatch(sps[:n]); err != nil {
			return err
		}
		sps = sps[n:]
	}
	return nil
}

func (a *Array) readSlowBatch(sps []span) error { return a.readAround(sps, nil) }

// readAround reads sps under their stripe locks, not reading from avoid
// (nil: every in-sync member is used).
func (a *Array) readAround(sps []span, avoid *member) error {
	var err error
	for attempt := 0; attempt <= a.geo.Members+1; attempt++ {
		if err = a.usable(); err != nil {
			return err
		}
		rw := getReadWork()
		rw.avoid = avoid
		for _, sp := range sps {
			rw.locks = append(rw.locks, int(uint64(sp.s)%stripeLocks))
		}
		a.lockStripes(rw)
		err = a.readSpansLocked(rw, sps)
		a.unlockStripes(rw)
		rw.release()
		if !errors.Is(err, errGone) {
			break
		}
	}
	if errors.Is(err, errGone) {
		return fmt.Errorf("raid %s: stripe %d: members keep failing: %w", fmtUUID(a.uuid), sps[0].s, ErrTooManyFailed)
	}
	return err
}

// readSpansLocked reads sps (their stripe locks held) as one batch.
func (a *Array) readSpansLocked(rw *readWork, sps []span) error {
	for _, sp := range sps {
		if err := a.planSlowSpan(rw, sp); err != nil {
			return err
		}
	}
	if err := a.runGrouped(rw.ops); err != nil {
		return err
	}
	for _, rc := range rw.recons {
		srcs := rw.srcs[rc.first:rc.end]
		subtle.XORBytes(rc.dst, srcs[0], srcs[1])
		for _, s := range srcs[2:] {
			xorInto(rc.dst, s)
		}
	}
	for _, sp := range rw.general {
		if err := a.readSpanLocked(sp); err != nil {
			return err
		}
	}
	return nil
}

// planSlowSpan adds the reads of sp to rw: the in-sync pieces straight
// into the caller's buffer, and for a single missing data chunk with P
// in sync the sources of its XOR; other spans go to rw.general.
func (a *Array) planSlowSpan(rw *readWork, sp span) error {
	C := a.geo.ChunkSize
	nd := a.geo.DataDisks
	missing, nmiss := -1, 0
	var row0, len0 int64
	for pos := sp.lo; pos < sp.hi; {
		i := int(pos / C)
		row := pos % C
		l := min(C-row, sp.hi-pos)
		if !rw.usable(a, a.member(a.dataRole(sp.s, i)), sp.s) {
			missing, nmiss, row0, len0 = i, nmiss+1, row, l
		}
		pos += l
	}
	if nmiss > 0 && a.geo.Level == RAID0 {
		return fmt.Errorf("raid %s: stripe %d data chunk %d has no redundancy: %w", fmtUUID(a.uuid), sp.s, missing, ErrTooManyFailed)
	}
	fast := nmiss <= 1
	if nmiss == 1 {
		fast = rw.usable(a, a.member(a.parityRole(sp.s, 0)), sp.s)
		for j := 0; j < nd && fast; j++ {
			fast = j == missing || rw.usable(a, a.member(a.dataRole(sp.s, j)), sp.s)
		}
	}
	if !fast {
		if rw.avoid != nil {
			return errNoHedge
		}
		rw.general = append(rw.general, sp)
		return nil
	}
	for pos := sp.lo; pos < sp.hi; {
		i := int(pos / C)
		row := pos % C
		l := min(C-row, sp.hi-pos)
		if i != missing {
			rw.ops = append(rw.ops, mop{m: a.member(a.dataRole(sp.s, i)), buf: sp.buf[pos-sp.lo : pos-sp.lo+l], off: a.moff(sp.s, row)})
		}
		pos += l
	}
	if nmiss == 0 {
		return nil
	}
	// Sources of the missing rows [row0, row0+len0): P and every other
	// data chunk, from the caller's buffer where the request reads those
	// rows anyway.
	rc := recon{dst: sp.buf[int64(missing)*C+row0-sp.lo : int64(missing)*C+row0+len0-sp.lo], first: len(rw.srcs)}
	for j := 0; j < nd; j++ {
		if j == missing {
			continue
		}
		lo, hi := int64(j)*C+row0, int64(j)*C+row0+len0
		if lo >= sp.lo && hi <= sp.hi {
			rw.srcs = append(rw.srcs, sp.buf[lo-sp.lo:hi-sp.lo])
			continue
		}
		b := rw.sc.get(len0)
		rw.srcs = append(rw.srcs, b)
		rw.ops = append(rw.ops, mop{m: a.member(a.dataRole(sp.s, j)), buf: b, off: a.moff(sp.s, row0)})
	}
	b := rw.sc.get(len0)
	rw.srcs = append(rw.srcs, b)
	rw.ops = append(rw.ops, mop{m: a.member(a.parityRole(sp.s, 0)), buf: b, off: a.moff(sp.s, row0)})
	rc.end = len(rw.srcs)
	rw.recons = append(rw.recons, rc)
	return nil
}

// usable reports whether m holds valid data of stripe s and may be read.
func (rw *readWork) usable(a *Array, m *member, s int64) bool {
	return m != rw.avoid && a.inSync(m, s)
}
