package raid

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"

	"tier0/daemon/blockdev"
)

var debugf func(format string, args ...any)

type replayEntry struct {
	h       entHeader
	role    int // the member the first copy was read from
	partial [2][]byte
	zero    bool
	missing map[int][]byte
}

// replay applies the live entries of every present member's log in
// sequence order. sbTail is the tail stored in the superblock.
func (j *journal) replay(sbTail, sbSeq uint64) (int, error) {
	entries, tail, err := j.readLogs(sbTail)
	if err != nil {
		return 0, err
	}
	var seqs []uint64
	maxSeq := uint64(0)
	for s := range entries {
		if s > maxSeq {
			maxSeq = s
		}
		if s >= tail {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	// Each row of a stripe is made consistent by the newest live entry
	// whose rows [RowLo, RowHi) include it, and by no older one. Writes
	// to a stripe are serialized by the stripe lock, so an entry's
	// partial parity holds the content its rows' unmodified bytes had
	// after every older write of the stripe completed. Applied on rows
	// that a newer entry covers, an older entry would rewrite parity
	// with the content its chunks had before later, acknowledged writes
	// (and a newer entry that cannot be applied there, because a
	// modified chunk's member is gone, would leave it so). But an older
	// entry's rows that no newer entry covers can hold its write cut
	// short, or completed and not flushed (torn by the crash: a later
	// write to other rows of the stripe flushes nothing when its partial
	// parity covers none of the unflushed bytes, unflushed.go); there its
	// partial is still the parity of every unmodified byte, since each
	// later change of those rows is a newer entry covering them (a
	// partial write is always logged, a whole-stripe write is logged, as
	// a marker covering every row, while the stripe has an entry that a
	// replay could take for live: needsMarker, with the tail counted as
	// persisted only once every present member's log holds it,
	// logTailPersisted). So each entry is applied on the rows of its
	// range that no newer live entry of its stripe covers.
	byStripe := map[uint64][]uint64{}
	for _, s := range seqs {
		st := entries[s].h.Stripe
		byStripe[st] = append(byStripe[st], s) // seqs ascend
	}
	var jobs []replayJob
	for _, ss := range byStripe {
		var covered []rowSeg // rows covered by newer entries, sorted, disjoint
		for x := len(ss) - 1; x >= 0; x-- {
			e := entries[ss[x]]
			seg := rowSeg{int64(e.h.RowLo), int64(e.h.RowHi)}
			if free := subtractSegs(seg, covered); len(free) > 0 {
				jobs = append(jobs, replayJob{seq: ss[x], rows: free})
			}
			covered = addSeg(covered, seg)
		}
	}
	slices.SortFunc(jobs, func(x, y replayJob) int { return cmp.Compare(x.seq, y.seq) })
	if debugf != nil {
		debugf("replay: tail %d, %d entries read, %d live, %d to apply", tail, len(entries), len(seqs), len(jobs))
	}
	for _, jb := range jobs {
		if debugf != nil {
			e := entries[jb.seq]
			debugf("replay seq %d stripe %d rows %d-%d (applied on %v) mask %b zero %v partials %v %v missing %d", jb.seq, e.h.Stripe, e.h.RowLo, e.h.RowHi, jb.rows, e.h.ModMask, e.zero, e.partial[0] != nil, e.partial[1] != nil, len(e.missing))
		}
		if err := j.apply(entries[jb.seq], jb.rows); err != nil {
			return 0, err
		}
	}
	j.mu.Lock()
	j.nextSeq = max(j.nextSeq, maxSeq+1, sbSeq)
	j.tail = j.nextSeq
	j.mu.Unlock()
	return len(jobs), nil
}

// rowSeg is a row range [a, b) of a stripe.
type rowSeg struct{ a, b int64 }

// replayJob is one live entry and the rows it is applied on.
type replayJob struct {
	seq  uint64
	rows []rowSeg
}

// subtractSegs returns seg minus the sorted, disjoint segments of set.
func subtractSegs(seg rowSeg, set []rowSeg) []rowSeg {
	var out []rowSeg
	x := seg.a
	for _, c := range set {
		if c.b <= x || c.a >= seg.b {
			continue
		}
		if c.a > x {
			out = append(out, rowSeg{x, c.a})
		}
		x = max(x, c.b)
	}
	if x < seg.b {
		out = append(out, rowSeg{x, seg.b})
	}
	return out
}

// addSeg returns the sorted, disjoint union of set and seg.
func addSeg(set []rowSeg, seg rowSeg) []rowSeg {
	all := append(slices.Clone(set), seg)
	slices.SortFunc(all, func(x, y rowSeg) int { return cmp.Compare(x.a, y.a) })
	out := all[:1]
	for _, c := range all[1:] {
		if last := &out[len(out)-1]; c.a <= last.b {
			last.b = max(last.b, c.b)
		} else {
			out = append(out, c)
		}
	}
	return out
}

// inSegs reports whether [x, y) lies inside one of the segments.
func inSegs(segs []rowSeg, x, y int64) bool {
	for _, c := range segs {
		if c.a <= x && y <= c.b {
			return true
		}
	}
	return false
}

// readLogs reads every present member's log: the entries by sequence
// number (a RAID-6 entry has a copy on each parity member) and the
// highest tail any of them, or the superblock (sbTail), recorded.
func (j *journal) readLogs(sbTail uint64) (map[uint64]*replayEntry, uint64, error) {
	a := j.a
	entries := map[uint64]*replayEntry{}
	tail := sbTail
	var mu sync.Mutex
	var conflict error
	errs := a.each(func(m *member) error {
		return j.readLog(m, func(h entHeader, pl []byte) {
			mu.Lock()
			defer mu.Unlock()
			tail = max(tail, h.Tail)
			e := entries[h.Seq]
			if e == nil {
				e = &replayEntry{h: h, role: m.role, missing: map[int][]byte{}}
				entries[h.Seq] = e
			} else if err := e.sameWrite(&h, m.role); err != nil {
				conflict = err
				return
			}
			e.add(&h, pl)
		})
	})
	for _, e := range errs {
		if e != nil && !errors.Is(e, errGone) {
			return nil, 0, e
		}
	}
	if err := a.usable(); err != nil {
		return nil, 0, err
	}
	if conflict != nil {
		return nil, 0, fmt.Errorf("%w: refusing to replay the log; assemble the array without the member that was away (ReAdd then empties its log and resyncs it): %w", conflict, ErrStale)
	}
	return entries, tail, nil
}

// readLog reads m's log slots and gives each valid entry (header checked,
// payload CRC matching) to add with its payload.
func (j *journal) readLog(m *member, add func(h entHeader, pl []byte)) error {
	a := j.a
	for k := 0; k < j.slots; k++ {
		hb := blockdev.AlignedBuffer(metaBlock)
		if err := a.mread(m, hb, j.slotOff(k)); err != nil {
			return err
		}
		var h entHeader
		if _, err := binary.Decode(hb, binary.LittleEndian, &h); err != nil {
			continue
		}
		if string(h.Magic[:]) != entMagic || h.UUID != a.uuid ||
			crc32.Checksum(hb[:entHeaderSize-4], castagnoli) != h.HeaderCRC {
			continue
		}
		L := int64(h.RowHi) - int64(h.RowLo)
		if L <= 0 || int64(h.RowHi) > a.geo.ChunkSize || int64(h.Stripe) >= a.geo.Stripes || h.NMissing > 2 || h.Parity > 1 ||
			!a.entryRangeValid(&h) ||
			int64(h.PayloadLen) != L*(int64(h.NMissing)+int64(h.Flags&entHasPartial)/entHasPartial) ||
			int64(h.PayloadLen) > j.slotSize-metaBlock {
			continue
		}
		pl := blockdev.AlignedBuffer(int(h.PayloadLen))
		if len(pl) > 0 {
			if err := a.mread(m, pl, j.slotOff(k)+metaBlock); err != nil {
				return err
			}
		}
		if crc32.Checksum(pl, castagnoli) != h.PayloadCRC {
			continue // torn: its stripe write never started
		}
		add(h, pl)
	}
	return nil
}

// sameWrite checks that h, read from role, is a copy of e's entry: the
// copies of one entry describe one write. Two different writes under one
// sequence number mean that a member kept entries of a run whose numbers
// were issued again; merging them would apply one stripe's partial parity
// to another (docs/RELIABILITY.md known problem 9, seed 133638).
func (e *replayEntry) sameWrite(h *entHeader, role int) error {
	g := &e.h
	if g.Stripe == h.Stripe && g.RowLo == h.RowLo && g.RowHi == h.RowHi && g.DataLo == h.DataLo && g.DataHi == h.DataHi && g.ModMask == h.ModMask {
		return nil
	}
	return fmt.Errorf("log entry %d on member %d is for stripe %d bytes [%d, %d), on member %d for stripe %d bytes [%d, %d): one sequence number for two writes",
		h.Seq, e.role, g.Stripe, g.DataLo, g.DataHi, role, h.Stripe, h.DataLo, h.DataHi)
}

// add takes one copy's partial parity and logged data into e.
func (e *replayEntry) add(h *entHeader, pl []byte) {
	L := int64(h.RowHi) - int64(h.RowLo)
	e.zero = h.Flags&entZeroPartial != 0
	if h.Flags&entHasPartial != 0 {
		e.partial[h.Parity] = pl[:L]
		pl = pl[L:]
	}
	for x := 0; x < int(h.NMissing); x++ {
		e.missing[int(h.Missing[x])] = pl[:L]
		pl = pl[L:]
	}
}

// settleSegments handles, on RAID-6 with both parities in sync, the row
// segments that a replay cannot apply because exactly one modified chunk
// X there can be neither read nor taken from the entry. P and Q may then
// be torn against each other (each of their blocks old or new), and a
// second chunk Y of the segment missing too would be rebuilt from both:
// garbage in rows that hold acknowledged data. So Y, which the write did
// not modify, is taken from the partial parity of P (the parity of every
// unmodified byte), X is defined by P and the other chunks (its blocks
// old or new, as for any write in flight), and Q is rewritten to match.
// It reports the segments it settled; it leaves the segments of skip
// (rows a newer entry covers) alone.
func (j *journal) settleSegments(e *replayEntry, cuts []int64, cov []cover, data [][]byte, skip []bool) ([]bool, error) {
	a := j.a
	fixed := make([]bool, len(cuts))
	if a.geo.Level != RAID6 {
		return fixed, nil
	}
	s := int64(e.h.Stripe)
	rlo := int64(e.h.RowLo)
	nd := a.geo.DataDisks
	pm, qm := a.member(a.parityRole(s, 0)), a.member(a.parityRole(s, 1))
	if !a.inSync(pm, s) || !a.inSync(qm, s) {
		return fixed, nil
	}
	covering := func(i int, x, y int64) bool {
		return e.h.ModMask&(1<<i) != 0 && cov[i].a <= x && cov[i].b >= y
	}
	for c := 0; c+1 < len(cuts); c++ {
		if skip[c] {
			continue
		}
		x, y := cuts[c], cuts[c+1]
		nilMod, nNil, missU, nMissU := -1, 0, -1, 0
		for i := 0; i < nd; i++ {
			if covering(i, x, y) {
				if data[i] == nil {
					nilMod, nNil = i, nNil+1
				}
				continue
			}
			if !a.inSync(a.member(a.dataRole(s, i)), s) {
				missU, nMissU = i, nMissU+1
			}
		}
		if nNil != 1 || nMissU > 1 || (nMissU == 1 && e.partial[0] == nil) {
			continue
		}
		n := int(y - x)
		sh := make([][]byte, nd)
		for i := 0; i < nd; i++ {
			switch {
			case i == nilMod || i == missU:
			case covering(i, x, y):
				sh[i] = data[i][x-rlo : y-rlo]
			default:
				buf := blockdev.AlignedBuffer(n)
				if err := a.mread(a.member(a.dataRole(s, i)), buf, a.moff(s, x)); err != nil {
					if errors.Is(err, errGone) {
						sh = nil // a member went away meanwhile: left as it is
						break
					}
					return fixed, err
				}
				sh[i] = buf
			}
		}
		if sh == nil {
			continue
		}
		if missU >= 0 {
			yb := make([]byte, n)
			copy(yb, e.partial[0][x-rlo:y-rlo])
			for i := 0; i < nd; i++ {
				if i != missU && i != nilMod && !covering(i, x, y) {
					a.coder.mulXor(0, i, sh[i], yb)
				}
			}
			sh[missU] = yb
		}
		xb := blockdev.AlignedBuffer(n)
		if err := a.mread(pm, xb, a.moff(s, x)); err != nil {
			if errors.Is(err, errGone) {
				continue
			}
			return fixed, err
		}
		for i := 0; i < nd; i++ {
			if i != nilMod {
				a.coder.mulXor(0, i, sh[i], xb)
			}
		}
		sh[nilMod] = xb
		q := make([]byte, n)
		for i := 0; i < nd; i++ {
			a.coder.mulXor(1, i, sh[i], q)
		}
		if err := a.mwrite(qm, q, a.moff(s, x), false); err != nil && !errors.Is(err, errGone) {
			return fixed, err
		}
		a.log.Warn("raid log entry settled in part: a modified chunk's member is gone; Q rewritten to match P", "stripe", s, "rows", fmt.Sprintf("%d-%d", x, y))
		fixed[c] = true
	}
	return fixed, nil
}

// entryRangeValid reports whether h's byte range lies inside the stripe's
// data and agrees with its modified-chunk mask and row range.
func (a *Array) entryRangeValid(h *entHeader) bool {
	lo, hi := int64(h.DataLo), int64(h.DataHi)
	C := a.geo.ChunkSize
	if lo >= hi || hi > int64(a.geo.DataDisks)*C {
		return false
	}
	var mask uint64
	rlo, rhi := C, int64(0)
	for i := 0; i < a.geo.DataDisks; i++ {
		if c, ok := chunkCover(lo, hi, C, i); ok {
			mask |= 1 << i
			rlo, rhi = min(rlo, c.a), max(rhi, c.b)
		}
	}
	return mask == h.ModMask && rlo == int64(h.RowLo) && rhi == int64(h.RowHi)
}

// apply recomputes the parity of one entry's rows, those of rows (the
// ones no newer entry of the stripe covers, replay), from its partial and
// the current data of the modified chunks. The partial parity covers
// every byte of the rows that the write did not modify — also the
// unmodified rows of a partly written chunk — so each modified chunk
// contributes only the rows it covers. The rows are applied in segments
// with one set of covering chunks each: a segment whose modified chunk
// can be neither read nor taken from the entry is left as it is (only
// that chunk's in-flight rows lie there), the others are made consistent.
func (j *journal) apply(e *replayEntry, rows []rowSeg) error {
	a := j.a
	s := int64(e.h.Stripe)
	rlo, rhi := int64(e.h.RowLo), int64(e.h.RowHi)
	lo, hi := int64(e.h.DataLo), int64(e.h.DataHi)
	L := rhi - rlo
	nd, C := a.geo.DataDisks, a.geo.ChunkSize
	// A member away at assembly that is caught up by the stripes written
	// while it is away (member.since) must count this one when it holds
	// a parity chunk (not rewritten here) or a modified data chunk (the
	// entry cannot be applied without it): its chunk may not match the
	// others'. An unmodified data chunk is in the partial parity.
	for x := 0; x < nd+a.geo.ParityDisks; x++ {
		if x >= nd || e.h.ModMask&(1<<x) != 0 {
			noteMissedOn(a.member(a.shardRole(s, x)), s)
		}
	}
	cov := make([]cover, nd)
	cuts := []int64{rlo, rhi}
	data := make([][]byte, nd)
	for i := 0; i < nd; i++ {
		if e.h.ModMask&(1<<i) == 0 {
			continue
		}
		cov[i], _ = chunkCover(lo, hi, C, i)
		cuts = append(cuts, cov[i].a, cov[i].b)
		m := a.member(a.dataRole(s, i))
		if !a.inSync(m, s) {
			data[i] = e.missing[i] // nil when not logged
			continue
		}
		buf := blockdev.AlignedBuffer(int(L))
		if err := a.mread(m, buf, a.moff(s, rlo)); err != nil {
			if errors.Is(err, errGone) {
				continue
			}
			return err
		}
		data[i] = buf
	}
	for _, r := range rows {
		cuts = append(cuts, r.a, r.b)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	skip := make([]bool, len(cuts))
	for c := 0; c+1 < len(cuts); c++ {
		skip[c] = !inSegs(rows, cuts[c], cuts[c+1])
	}
	fixed, err := j.settleSegments(e, cuts, cov, data, skip)
	if err != nil {
		return err
	}
	for k := 0; k < a.geo.ParityDisks; k++ {
		pm := a.member(a.parityRole(s, k))
		if !a.inSync(pm, s) || (e.partial[k] == nil && !e.zero) {
			continue
		}
		acc := make([]byte, L)
		if !e.zero {
			copy(acc, e.partial[k])
		}
		runLo := int64(-1) // start of the run of applicable segments
		flush := func(end int64) error {
			if runLo < 0 {
				return nil
			}
			x := runLo
			runLo = -1
			if err := a.mwrite(pm, acc[x-rlo:end-rlo], a.moff(s, x), false); err != nil && !errors.Is(err, errGone) {
				return err
			}
			return nil
		}
		for c := 0; c+1 < len(cuts); c++ {
			x, y := cuts[c], cuts[c+1]
			if fixed[c] || skip[c] {
				if err := flush(x); err != nil {
					return err
				}
				continue
			}
			ok := true
			for i := 0; i < nd; i++ {
				if e.h.ModMask&(1<<i) == 0 || cov[i].a > x || cov[i].b < y {
					continue
				}
				if data[i] == nil {
					ok = false
					break
				}
				a.coder.mulXor(k, i, data[i][x-rlo:y-rlo], acc[x-rlo:y-rlo])
			}
			if !ok {
				a.log.Warn("raid log entry applied in part: a modified chunk's member is gone", "stripe", s, "parity", k, "rows", fmt.Sprintf("%d-%d", x, y))
				if err := flush(x); err != nil {
					return err
				}
				continue
			}
			if runLo < 0 {
				runLo = x
			}
		}
		if err := flush(rhi); err != nil {
			return err
		}
	}
	return nil
}
