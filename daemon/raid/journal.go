package raid

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"
)

// The partial parity log (PPL) closes the write hole. Before a write that
// does not replace a whole stripe (or any write while degraded), the
// engine durably writes to each present parity member of the stripe an
// entry holding:
//
//   - the partial parity: that parity computed over the data chunks the
//     write does NOT modify (their current content), for the row range;
//   - for every modified data chunk whose member is missing, its new data.
//
// After a crash, for every live entry, parity := partial ⊕ Σ coef·current
// data of the modified chunks (or the logged data for missing ones). That
// makes the parity agree with whatever mix of old and new blocks reached
// the modified chunks, so every chunk the write did not touch — including
// a missing member's chunk, which only exists as parity — reads back
// intact. Of the live entries (an entry is live until a flush of all
// members after its write completed: the log tail), each is applied on
// the rows that no newer live entry of its stripe covers; see replay.
type journal struct {
	a        *Array
	off      int64
	slots    int
	slotSize int64

	mu       sync.Mutex
	cond     *sync.Cond
	nextSeq  uint64
	tail     uint64              // entries below are retired
	written  uint64              // highest tail a replay reads, whatever members a crash loses (superblocks, or every present member's log: memTail)
	memTail  []uint64            // per role, the highest tail in an entry durably written to its log
	active   map[uint64]struct{} // entries whose stripe write is not complete
	slotSeq  [][]uint64          // per role, the seq in each slot (0 = free)
	cursor   []int
	lastSeq  map[int64]uint64 // stripe -> newest entry seq
	retiring bool
	// completed counts finished entries; completedAtRetire is its value
	// when the last retire flush started.
	completed, completedAtRetire uint64

	// lastSlots holds, per stripe, where its live entries written in
	// full lie, oldest first (supersede).
	lastSlots map[int64][]entSlots
	// spare holds emptied lists of lastSlots for reuse (no allocation
	// per stripe write in steady state).
	spare [][]entSlots

	// Write generations: gen advances at the start of every member
	// flush; wst records, per stripe (hashed), the generation in which
	// its last write completed and the bytes written since the last
	// flush (unflushed.go). A log entry whose partial parity covers
	// such bytes needs a flush first, since the partial assumes the
	// content it covers is durable.
	gen        atomic.Uint64
	flushedGen atomic.Uint64
	wst        [wstSlots]wstate
}

const (
	// entMagic names the entry format. T0PPLEN2 added DataLo/DataHi (the
	// byte range of the write inside the stripe's data), so that the
	// partial parity can cover the unmodified rows of partly written
	// chunks; entries of the first format (T0PPLENT) are not replayed.
	entMagic       = "T0PPLEN2"
	entZeroPartial = 1 << 0 // partial is all zeroes (whole stripe modified)
	entHasPartial  = 1 << 1
)

type entHeader struct {
	Magic      [8]byte
	UUID       [16]byte
	Seq        uint64
	Tail       uint64
	Stripe     uint64
	RowLo      uint32
	RowHi      uint32
	DataLo     uint32 // the write's byte range inside the stripe's data
	DataHi     uint32
	ModMask    uint64
	Flags      uint32
	Parity     uint32 // which parity this copy's partial is for
	NMissing   uint32
	Missing    [2]uint32
	PayloadLen uint32
	PayloadCRC uint32
	HeaderCRC  uint32
}

var entHeaderSize = binary.Size(entHeader{})

// logEntry is one PPL record as the write path builds it.
type logEntry struct {
	stripe   int64
	lo, hi   int64 // the write's byte range inside the stripe's data
	rlo, rhi int64
	mask     uint64
	zero     bool
	partial  [2][]byte // by parity index; nil = not logged
	missing  map[int][]byte
	seq      uint64
}

func newJournal(a *Array, off int64, slots int, slotSize int64) *journal {
	j := &journal{a: a, off: off, slots: slots, slotSize: slotSize, nextSeq: 1, tail: 1,
		active: map[uint64]struct{}{}, lastSeq: map[int64]uint64{}, lastSlots: map[int64][]entSlots{}}
	j.cond = sync.NewCond(&j.mu)
	j.gen.Store(1)
	j.slotSeq = make([][]uint64, a.geo.Members)
	for r := range j.slotSeq {
		j.slotSeq[r] = make([]uint64, slots)
	}
	j.cursor = make([]int, a.geo.Members)
	j.memTail = make([]uint64, a.geo.Members)
	return j
}

// logTailPersisted advances written to the lowest tail that every present
// member's log holds (j.mu held). A replay takes the highest tail of the
// entries it reads, from the members present after a crash; an entry
// reaches only its stripe's parity members, so a tail it carries may be
// on a member lost with the crash, and the replay then takes entries
// below it for live. needsMarker relies on written: a whole-stripe write
// is not logged when the stripe's entries lie below it, and a replay
// that applied such an entry would rebuild parity from the content the
// write replaced (TestUnloggedWriteAfterTailOnLostMemberOnly). Every
// member that holds a tail at least as high keeps it: its later entries
// carry higher tails. A member not present (failed, missing) is not
// counted: a replay does not read its log, and its log is emptied before
// it is taken back (forgetLog).
func (j *journal) logTailPersisted() {
	low := uint64(0)
	first := true
	for r := range j.memTail {
		if !present(j.a.member(r)) {
			continue
		}
		if first || j.memTail[r] < low {
			low, first = j.memTail[r], false
		}
	}
	if !first && low > j.written {
		j.written = low
	}
}

// forgetLog records that role r's log was emptied (ReAdd).
func (j *journal) forgetLog(r int) {
	j.mu.Lock()
	j.memTail[r] = 0
	j.mu.Unlock()
}

func (j *journal) slotOff(k int) int64 { return j.off + int64(k)*j.slotSize }

// persistTail is the tail to store in a superblock about to be written.
func (j *journal) persistTail() (tail, next uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.tail > j.written {
		j.written = j.tail
	}
	return j.tail, j.nextSeq
}

// needsMarker reports whether stripe s has an entry that a replay could
// still apply, so that an unlogged write to s would be undone by it.
func (j *journal) needsMarker(s int64) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	seq, ok := j.lastSeq[s]
	return ok && seq >= j.written
}

// retireCandidate is the tail that a flush starting now can establish.
func (j *journal) retireCandidate() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	c := j.nextSeq
	for s := range j.active {
		if s < c {
			c = s
		}
	}
	return c
}

// retire advances the tail after a successful flush of all members.
func (j *journal) retire(cand uint64) {
	j.mu.Lock()
	if cand > j.tail {
		j.tail = cand
		for s, q := range j.lastSeq {
			if q < j.written && q < j.tail {
				delete(j.lastSeq, s)
			}
		}
		for s, l := range j.lastSlots {
			k := 0
			for _, x := range l {
				if x.seq >= j.tail {
					l[k] = x
					k++
				}
			}
			j.setSlots(s, l[:k])
		}
	}
	j.cond.Broadcast()
	j.mu.Unlock()
}

// begin durably writes e to the present parity roles of its stripe and
// registers it as active. It returns the roles written (possibly none).
func (j *journal) begin(e *logEntry, roles []int) error {
	if len(roles) > 2 {
		panic(fmt.Sprintf("raid: log entry for %d parity roles, at most 2", len(roles)))
	}
	j.mu.Lock()
	// Take one slot on every role at once (all or nothing, no deadlock).
	var pickedBuf [2]int
	picked := pickedBuf[:len(roles)]
	for {
		ok := true
		for x, r := range roles {
			picked[x] = -1
			for k := 0; k < j.slots; k++ {
				idx := (j.cursor[r] + k) % j.slots
				if q := j.slotSeq[r][idx]; q == 0 || q < j.tail {
					picked[x] = idx
					break
				}
			}
			if picked[x] < 0 {
				ok = false
				break
			}
		}
		if ok {
			break
		}
		if !j.retiring && j.completed > j.completedAtRetire {
			// Free slots by flushing every member (outside the lock):
			// entries completed before the flush become dead. Without
			// a completion since the last retire a flush frees nothing.
			j.retiring = true
			j.completedAtRetire = j.completed
			j.mu.Unlock()
			err := j.a.flushMembers()
			j.mu.Lock()
			j.retiring = false
			j.cond.Broadcast()
			if err != nil {
				j.mu.Unlock()
				return err
			}
			continue
		}
		j.cond.Wait()
	}
	// The sequence number is taken only now: an entry waiting for a slot
	// must not hold the tail back (that would keep every slot busy).
	e.seq = j.nextSeq
	j.nextSeq++
	j.active[e.seq] = struct{}{}
	j.lastSeq[e.stripe] = e.seq
	for x, r := range roles {
		j.slotSeq[r][picked[x]] = e.seq
		j.cursor[r] = (picked[x] + 1) % j.slots
	}
	tail := j.tail
	j.mu.Unlock()

	// One FUA write per role, in parallel (a.run), each of its own
	// encoding (the partial differs between P and Q).
	var ops [2]mop
	var refs [2]*[]byte
	for x, r := range roles {
		k := 0
		if r == j.a.parityRole(e.stripe, 1) && j.a.geo.Level == RAID6 {
			k = 1
		}
		refs[x] = j.encode(e, k, tail)
		ops[x] = mop{m: j.a.member(r), buf: *refs[x], off: j.slotOff(picked[x]), write: true, fua: true}
	}
	err := j.a.run(ops[:len(roles)])
	for x := range roles {
		putBufRef(refs[x])
	}
	if err != nil && !errors.Is(err, errGone) {
		j.end(e)
		return err
	}
	j.mu.Lock()
	if err == nil {
		for _, r := range roles {
			j.memTail[r] = max(j.memTail[r], tail)
		}
		j.logTailPersisted()
	}
	if err == nil && len(roles) == j.a.geo.ParityDisks {
		cur := entSlots{seq: e.seq, n: len(roles), rlo: e.rlo, rhi: e.rhi}
		for x, r := range roles {
			cur.role[x], cur.idx[x] = r, picked[x]
		}
		j.supersede(e.stripe, cur)
	}
	j.mu.Unlock()
	return nil
}

// entSlots is where one entry lies: its slot on each parity role, and
// its rows.
type entSlots struct {
	seq       uint64
	n         int
	role, idx [2]int
	rlo, rhi  int64
}

// supersede frees the slots of stripe s's older entries written in full
// whose rows cur's rows include, now that cur, the newer entry, is
// durable on every parity role of s (j.mu held). The replay applies an
// entry only on the rows no newer entry of its stripe covers (replay),
// and every log that can hold the older entry (a parity role of s) holds
// cur too, so no replay can apply the older one again: its slots are
// dead although the tail is below it. An older entry with rows outside
// cur's stays live: a replay may need it there (its write completed and
// not flushed, torn by a crash). Without this, a stripe rewritten many
// times within one flush interval (sequential 4 KiB writes) fills a ring
// with dead entries and costs a flush of every member to recycle it.
func (j *journal) supersede(s int64, cur entSlots) {
	l, ok := j.lastSlots[s]
	if !ok && len(j.spare) > 0 {
		l = j.spare[len(j.spare)-1]
		j.spare = j.spare[:len(j.spare)-1]
	}
	k := 0
	for _, prev := range l {
		if prev.rlo >= cur.rlo && prev.rhi <= cur.rhi {
			j.free(prev)
			continue
		}
		l[k] = prev
		k++
	}
	j.lastSlots[s] = append(l[:k], cur)
}

// setSlots stores l as stripe s's list, or drops the stripe's list when l
// is empty, keeping its array for reuse (j.mu held).
func (j *journal) setSlots(s int64, l []entSlots) {
	if len(l) > 0 {
		j.lastSlots[s] = l
		return
	}
	delete(j.lastSlots, s)
	if cap(l) > 0 && len(j.spare) < 1024 {
		j.spare = append(j.spare, l)
	}
}

// free frees the slots of an entry unless they were taken again (j.mu
// held).
func (j *journal) free(prev entSlots) {
	for x := 0; x < prev.n; x++ {
		if j.slotSeq[prev.role[x]][prev.idx[x]] == prev.seq {
			j.slotSeq[prev.role[x]][prev.idx[x]] = 0
		}
	}
	j.cond.Broadcast()
}

// stripeDurable frees the slots of stripe s's entries written in full:
// every completed write of s is durable on every member it reached
// (flushForPartial; stripe lock held, so none of s is in flight), and
// rows whose parity and data are durable and agree need no replay.
func (j *journal) stripeDurable(s int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	l := j.lastSlots[s]
	for _, prev := range l {
		j.free(prev)
	}
	j.setSlots(s, l[:0])
}

// end marks e's stripe write complete.
func (j *journal) end(e *logEntry) {
	j.mu.Lock()
	delete(j.active, e.seq)
	j.completed++
	j.cond.Broadcast()
	j.mu.Unlock()
}

// encode returns the entry's copy for parity k in a pooled buffer.
func (j *journal) encode(e *logEntry, k int, tail uint64) *[]byte {
	L := e.rhi - e.rlo
	h := entHeader{UUID: j.a.uuid, Seq: e.seq, Tail: tail, Stripe: uint64(e.stripe), RowLo: uint32(e.rlo), RowHi: uint32(e.rhi),
		DataLo: uint32(e.lo), DataHi: uint32(e.hi), ModMask: e.mask, Parity: uint32(k)}
	copy(h.Magic[:], entMagic)
	var payload int64
	if e.zero {
		h.Flags |= entZeroPartial
	} else if e.partial[k] != nil {
		h.Flags |= entHasPartial
		payload += L
	}
	var idxBuf [2]int
	idx := idxBuf[:0]
	for i := range e.missing {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for x, i := range idx {
		h.Missing[x] = uint32(i)
	}
	h.NMissing = uint32(len(idx))
	payload += int64(len(idx)) * L
	ref := getBufRef(metaBlock + payload)
	buf := *ref
	clear(buf[:metaBlock])
	p := buf[metaBlock:]
	if h.Flags&entHasPartial != 0 {
		copy(p, e.partial[k])
		p = p[L:]
	}
	for _, i := range idx {
		copy(p, e.missing[i])
		p = p[L:]
	}
	h.PayloadLen = uint32(payload)
	h.PayloadCRC = crc32.Checksum(buf[metaBlock:], castagnoli)
	h.put(buf)
	h.HeaderCRC = crc32.Checksum(buf[:entHeaderSize-4], castagnoli)
	binary.LittleEndian.PutUint32(buf[entHeaderSize-4:], h.HeaderCRC)
	return ref
}

// put writes h to b in its on-disk form, the little-endian encoding of
// the struct's fields in order (as binary.Encode does, without its
// allocations; TestEntHeaderPutMatchesBinary).
func (h *entHeader) put(b []byte) {
	le := binary.LittleEndian
	_ = b[entHeaderSize-1]
	copy(b[0:8], h.Magic[:])
	copy(b[8:24], h.UUID[:])
	le.PutUint64(b[24:], h.Seq)
	le.PutUint64(b[32:], h.Tail)
	le.PutUint64(b[40:], h.Stripe)
	le.PutUint32(b[48:], h.RowLo)
	le.PutUint32(b[52:], h.RowHi)
	le.PutUint32(b[56:], h.DataLo)
	le.PutUint32(b[60:], h.DataHi)
	le.PutUint64(b[64:], h.ModMask)
	le.PutUint32(b[72:], h.Flags)
	le.PutUint32(b[76:], h.Parity)
	le.PutUint32(b[80:], h.NMissing)
	le.PutUint32(b[84:], h.Missing[0])
	le.PutUint32(b[88:], h.Missing[1])
	le.PutUint32(b[92:], h.PayloadLen)
	le.PutUint32(b[96:], h.PayloadCRC)
	le.PutUint32(b[100:], h.HeaderCRC)
}

// debugf, when set (tests), traces log replay.
