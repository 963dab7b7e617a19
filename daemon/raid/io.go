package raid

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"tier0/daemon/blockdev"
)

// errRetry: the member set changed during a stripe operation before
// anything was written; plan it again.
var errRetry = errors.New("retry stripe")

func (a *Array) checkIO(p []byte, off int64) error {
	if err := blockdev.CheckRange(off, int64(len(p)), a.geo.Capacity, a.geo.BlockSize); err != nil {
		return fmt.Errorf("raid %s: %w", fmtUUID(a.uuid), err)
	}
	return a.usable()
}

// ReadAt implements blockdev.Device. Chunks of missing members are
// reconstructed from the others.
func (a *Array) ReadAt(p []byte, off int64) (int, error) {
	if err := a.checkIO(p, off); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	a.fgBegin()
	defer a.fgDone(a.fgStart())
	var err error
	if a.geo.Level == RAID1 {
		err = a.readMirror(p, off)
	} else {
		err = a.readStriped(p, off)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (a *Array) readMirror(p []byte, off int64) error {
	n := a.geo.Members
	for attempt := 0; attempt <= n; attempt++ {
		if err := a.usable(); err != nil {
			return err
		}
		start := int(a.rr.Add(1))
		if a.resyncing.Load() {
			start = 0
		}
		var m *member
		for k := 0; k < n; k++ {
			c := a.member((start + k) % n)
			if c != nil && uint8(c.state.Load()) == roleActive {
				m = c
				break
			}
		}
		if m == nil {
			// No active mirror: a rebuilding one that is in sync over
			// the whole request still serves it.
			C := a.geo.ChunkSize
			s0, s1 := off/C, (off+int64(len(p))-1)/C
			for k := 0; k < n && m == nil; k++ {
				c := a.member(k)
				ok := c != nil && uint8(c.state.Load()) == roleRebuilding
				for s := s0; ok && s <= s1; s++ {
					ok = a.inSync(c, s)
				}
				if ok {
					m = c
				}
			}
			if m == nil {
				for s := s0; s <= s1; s++ {
					if a.mirrorLost(s) {
						return a.unavailable(s)
					}
				}
				if s1 > s0 {
					// Each chunk has a mirror, not one for all: chunk by chunk.
					for pos := off; pos < off+int64(len(p)); {
						end := min((pos/C+1)*C, off+int64(len(p)))
						if err := a.readMirror(p[pos-off:end-off], pos); err != nil {
							return err
						}
						pos = end
					}
					return nil
				}
				break
			}
		}
		err := a.mread(m, p, a.geo.DataOffset+off)
		if !errors.Is(err, errGone) {
			return err
		}
	}
	if err := a.usable(); err != nil {
		return err
	}
	return fmt.Errorf("raid %s: no active mirror left: %w", fmtUUID(a.uuid), ErrTooManyFailed)
}

// span is the part of a request inside one stripe.
type span struct {
	s      int64
	lo, hi int64  // byte range inside the stripe's data
	buf    []byte // the caller's bytes for [lo, hi)
}

// readSpanLocked reads one span (its stripe lock held), reconstructing
// the chunks of members that are not in sync (the general path).
func (a *Array) readSpanLocked(sp span) error {
	C := a.geo.ChunkSize
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	var sc scratch
	defer sc.release()
	if a.geo.Level == RAID0 {
		np = 0
	}
	var ops []mop
	var missing []int
	rlo, rhi := C, int64(0)
	type piece struct {
		i        int
		row, len int64
		buf      []byte
	}
	var pieces []piece
	for pos := sp.lo; pos < sp.hi; {
		i := int(pos / C)
		row := pos % C
		l := min(C-row, sp.hi-pos)
		buf := sp.buf[pos-sp.lo : pos-sp.lo+l]
		m := a.member(a.dataRole(sp.s, i))
		if a.inSync(m, sp.s) {
			ops = append(ops, mop{m: m, buf: buf, off: a.moff(sp.s, row)})
		} else {
			missing = append(missing, i)
			pieces = append(pieces, piece{i, row, l, buf})
			rlo, rhi = min(rlo, row), max(rhi, row+l)
		}
		pos += l
	}
	if len(missing) > 0 {
		if np == 0 {
			return fmt.Errorf("raid %s: stripe %d data chunk %d has no redundancy: %w", fmtUUID(a.uuid), sp.s, missing[0], ErrTooManyFailed)
		}
		L := rhi - rlo
		shards := make([][]byte, nd+np)
		have := 0
		for i := 0; i < nd; i++ {
			m := a.member(a.dataRole(sp.s, i))
			if a.inSync(m, sp.s) {
				shards[i] = sc.get(L)
				ops = append(ops, mop{m: m, buf: shards[i], off: a.moff(sp.s, rlo)})
				have++
			}
		}
		for k := 0; k < np; k++ {
			m := a.member(a.parityRole(sp.s, k))
			if a.inSync(m, sp.s) && have < nd {
				shards[nd+k] = sc.get(L)
				ops = append(ops, mop{m: m, buf: shards[nd+k], off: a.moff(sp.s, rlo)})
				have++
			}
		}
		if have < nd {
			return a.unavailable(sp.s)
		}
		if err := a.run(ops); err != nil {
			return err
		}
		if err := a.coder.reconstruct(shards); err != nil {
			return fmt.Errorf("raid %s: stripe %d reconstruct: %v: %w", fmtUUID(a.uuid), sp.s, err, ErrTooManyFailed)
		}
		for _, pc := range pieces {
			copy(pc.buf, shards[pc.i][pc.row-rlo:pc.row-rlo+pc.len])
		}
		return nil
	}
	return a.run(ops)
}

// WriteAt implements blockdev.Device.
func (a *Array) WriteAt(p []byte, off int64) (int, error) { return a.write(p, off, false) }

// WriteAtFUA implements blockdev.FUAWriter: the data (and the parity that
// protects it) is durable on every member involved when it returns.
func (a *Array) WriteAtFUA(p []byte, off int64) (int, error) { return a.write(p, off, true) }

func (a *Array) write(p []byte, off int64, fua bool) (int, error) {
	if err := a.checkIO(p, off); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	a.fgBegin()
	defer a.fgDone(a.fgStart())
	if err := a.markDirty(); err != nil {
		return 0, err
	}
	// With no redundancy left, durable before the ack (exposed.go).
	lost, fua := a.losses.Load(), fua || a.exposed()
	var err error
	switch a.geo.Level {
	case RAID0:
		err = a.writeRAID0(p, off, fua)
	case RAID1:
		err = a.writeMirror(p, off, fua)
	default:
		err = a.writeParity(p, off, fua)
	}
	if err == nil && !fua {
		err = a.lostDuring(lost)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (a *Array) writeRAID0(p []byte, off int64, fua bool) error {
	C := a.geo.ChunkSize
	var ops []mop
	for _, sp := range a.spans(p, off) {
		for pos := sp.lo; pos < sp.hi; {
			i := int(pos / C)
			row := pos % C
			l := min(C-row, sp.hi-pos)
			ops = append(ops, mop{m: a.member(a.dataRole(sp.s, i)), buf: sp.buf[pos-sp.lo : pos-sp.lo+l], off: a.moff(sp.s, row), write: true, fua: fua})
			pos += l
		}
	}
	if err := a.runGrouped(ops); err != nil && !errors.Is(err, errGone) {
		return err
	}
	return a.usable()
}

func (a *Array) writeMirror(p []byte, off int64, fua bool) error {
	C := a.geo.ChunkSize
	s0, s1 := off/C, (off+int64(len(p))-1)/C
	if err := a.bm.start(s0, s1); err != nil {
		return err
	}
	defer a.bm.end(s0, s1)
	var idx []int
	for s := s0; s <= s1; s++ {
		idx = append(idx, int(uint64(s)%stripeLocks))
		if len(idx) > stripeLocks {
			break
		}
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, i := range idx {
		a.locks[i].Lock()
	}
	defer func() {
		for _, i := range idx {
			a.locks[i].Unlock()
		}
	}()
	for s := s0; s <= s1; s++ {
		if a.mirrorLost(s) {
			return a.unavailable(s)
		}
	}
	var ops []mop
	for r := range a.members {
		m := a.member(r)
		if !present(m) {
			continue
		}
		if uint8(m.state.Load()) == roleActive {
			ops = append(ops, mop{m: m, buf: p, off: a.geo.DataOffset + off, write: true, fua: fua})
			continue
		}
		for s := s0; s <= s1; s++ {
			if !a.inSync(m, s) {
				continue
			}
			lo, hi := max(off, s*C), min(off+int64(len(p)), (s+1)*C)
			ops = append(ops, mop{m: m, buf: p[lo-off : hi-off], off: a.geo.DataOffset + lo, write: true, fua: fua})
		}
	}
	if err := a.run(ops); err != nil {
		if !errors.Is(err, errGone) {
			return err
		}
		// A mirror failed under the write: not acknowledged if no
		// mirror holds it now (the others are not yet rebuilt there).
		for s := s0; s <= s1; s++ {
			if a.mirrorLost(s) {
				return a.unavailable(s)
			}
		}
	}
	return a.usable()
}

func (a *Array) writeParity(p []byte, off int64, fua bool) error {
	rw := getReadWork()
	defer rw.release()
	rw.spans = a.spansInto(rw.spans, p, off)
	sps := rw.spans
	s0, s1 := sps[0].s, sps[len(sps)-1].s
	if err := a.bm.start(s0, s1); err != nil {
		return err
	}
	defer a.bm.end(s0, s1)
	if len(sps) == 1 {
		return a.writeSpan(sps[0], fua)
	}
	// Whole stripes in the middle of the request go out in batches, one
	// merged write per member per batch.
	var rest []span
	for x := 0; x < len(sps); {
		y := x
		for y < len(sps) && sps[y].lo == 0 && sps[y].hi == a.geo.StripeSize && y-x < fullBatch {
			y++
		}
		if y-x >= 2 {
			done, err := a.writeFullBatch(rw, sps[x:y], fua)
			if err != nil {
				return err
			}
			if !done {
				rest = append(rest, sps[x:y]...)
			}
			x = y
			continue
		}
		rest = append(rest, sps[x])
		x++
	}
	sps = rest
	// Stripes in parallel, a few at a time; each holds one stripe lock.
	par := 4
	if a.serial() {
		par = 1
	}
	errs := make([]error, len(sps))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for x, sp := range sps {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[x] = a.writeSpan(sp, fua)
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func (a *Array) writeSpan(sp span, fua bool) error {
	for attempt := 0; attempt <= a.geo.Members+1; attempt++ {
		if err := a.usable(); err != nil {
			return err
		}
		a.lockStripe(sp.s)
		err := a.writeSpanLocked(sp, fua)
		a.unlockStripe(sp.s)
		if errors.Is(err, errRetry) || errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			return err
		}
		return a.usable()
	}
	if err := a.usable(); err != nil {
		return err
	}
	return fmt.Errorf("raid %s: stripe %d: members keep failing: %w", fmtUUID(a.uuid), sp.s, ErrTooManyFailed)
}

// mirrorLost reports whether no mirror holds valid data of chunk s.
func (a *Array) mirrorLost(s int64) bool {
	for r := range a.members {
		if a.inSync(a.member(r), s) {
			return false
		}
	}
	return true
}

// fragile reports whether a data member is being rebuilt: its chunks are
// in sync up to the rebuild position, but after a crash the rebuild
// restarts from the last checkpoint, so they may count as missing then.
func fragile(dm []*member) bool {
	for _, m := range dm {
		if uint8(m.state.Load()) == roleRebuilding {
			return true
		}
	}
	return false
}

// logFragile adds the new content of modified chunks on rebuilding
// members to the entry, as for missing members.
func logFragile(ent *logEntry, dm []*member, cols [][]byte) {
	for i, m := range dm {
		if ent.mask&(1<<i) != 0 && uint8(m.state.Load()) == roleRebuilding {
			if ent.missing == nil {
				ent.missing = map[int][]byte{}
			}
			ent.missing[i] = cols[i]
		}
	}
}

func retryOn(err error) error {
	if errors.Is(err, errGone) {
		return errRetry
	}
	return err
}

// WriteZeroes implements blockdev.Device (as writes of zeroes, so that
// parity stays consistent).
func (a *Array) WriteZeroes(off, length int64) error {
	if err := blockdev.CheckRange(off, length, a.geo.Capacity, a.geo.BlockSize); err != nil {
		return fmt.Errorf("raid %s: %w", fmtUUID(a.uuid), err)
	}
	step := a.geo.StripeSize
	for step < 1<<20 {
		step *= 2
	}
	zero := blockdev.AlignedBuffer(int(min(step, length)))
	for length > 0 {
		n := min(int64(len(zero)), length)
		if _, err := a.WriteAt(zero[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// Discard implements blockdev.Device; the range reads back as zeroes.
func (a *Array) Discard(off, length int64) error { return a.WriteZeroes(off, length) }
