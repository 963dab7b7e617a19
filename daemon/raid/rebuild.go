package raid

import (
	"errors"
	"fmt"

	"tier0/daemon/blockdev"
)

// rebuildBatch is the stripes a rebuild reconstructs as one step: one
// merged read per source member and one merged write to the rebuilt
// member (16 × 64 KiB chunks = 1 MiB per member), so that the rebuild
// runs at the members' sequential bandwidth instead of one chunk-sized
// request per member at a time.
const rebuildBatch = 16

// rebuildDepth is the steps of one rebuild run (its stripes locked
// together). The steps overlap: the rebuilt member writes step i while
// the sources read step i+1, so every member has a large request in
// flight instead of the sources idling during the write and the new
// member during the reads. Buffers: two steps' worth.
const rebuildDepth = 4

// rebuildPart is one step of a run: its stripes' shards (w per stripe),
// the reads that fill them and the scratch they live in.
type rebuildPart struct {
	s, n  int64
	srcs  [][]byte
	reads []mop
	sc    scratch
}

func (st *rebuildPart) reset() {
	st.sc.release()
	clear(st.srcs)
	clear(st.reads)
	st.srcs, st.reads = st.srcs[:0], st.reads[:0]
	st.s, st.n = 0, 0
}

// rebuildRun rebuilds role m's chunks of stripes [s0, s1) of a RAID-5/6
// array, all of which need it, under their stripe locks, and advances
// the recovery position to the end of what it rebuilt. It reports how
// many stripes it rebuilt: fewer than asked (and no error) when a stripe
// lacks sources, which the caller then rebuilds alone (rebuildStripe
// reports why). On an error nothing is accounted (the caller redoes the
// stripes from s0).
func (a *Array) rebuildRun(m *member, s0, s1 int64) (int64, error) {
	rw := getReadWork()
	defer rw.release()
	for s := s0; s < s1; s++ {
		rw.locks = append(rw.locks, int(uint64(s)%stripeLocks))
	}
	a.lockStripes(rw)
	defer a.unlockStripes(rw)
	w := a.geo.DataDisks + a.geo.ParityDisks
	if cap(rw.req) < w {
		rw.req = make([]bool, w)
	}
	req := rw.req[:w]
	total, short := int64(0), false
	// plan sets up step k for the stripes from s0+total (at most
	// rebuildBatch of them), reusing the buffers of step k-2.
	plan := func(k int) *rebuildPart {
		st := &rw.rb[k%2]
		st.reset()
		st.s = s0 + total
		e := min(s1, st.s+rebuildBatch)
		if short || st.s >= e {
			return nil
		}
		for s := st.s; s < e; s++ {
			if !a.planRebuildStripe(st, m, s, w) {
				short = true
				break
			}
			st.n++
		}
		total += st.n
		if st.n == 0 {
			return nil
		}
		return st
	}
	st := plan(0)
	if st == nil {
		return 0, nil
	}
	rw.ops = append(rw.ops[:0], st.reads...)
	if err := a.runGrouped(rw.ops); err != nil {
		return 0, err
	}
	for k := 0; st != nil; k++ {
		rw.ops = rw.ops[:0]
		for j := int64(0); j < st.n; j++ {
			sh := st.srcs[j*int64(w) : (j+1)*int64(w)]
			t := -1
			for x := range req {
				req[x] = a.shardRole(st.s+j, x) == m.role
				if req[x] {
					t = x
				}
			}
			if err := a.coder.enc.ReconstructSome(sh, req); err != nil {
				return 0, fmt.Errorf("stripe %d: %v: %w", st.s+j, err, ErrTooManyFailed)
			}
			rw.ops = append(rw.ops, mop{m: m, buf: sh[t], off: a.moff(st.s+j, 0), write: true})
		}
		// This step's writes with the next step's reads.
		next := plan(k + 1)
		if next != nil {
			rw.ops = append(rw.ops, next.reads...)
		}
		if err := a.runGrouped(rw.ops); err != nil {
			return 0, err
		}
		st = next
	}
	m.recovery.Store(s0 + total)
	return total, nil
}

// planRebuildStripe adds stripe s's shards and source reads to st; false
// when the stripe lacks sources (nothing added).
func (a *Array) planRebuildStripe(st *rebuildPart, m *member, s int64, w int) bool {
	C := a.geo.ChunkSize
	nd := a.geo.DataDisks
	base, rbase := len(st.srcs), len(st.reads)
	have := 0
	for x := 0; x < w; x++ {
		r := a.shardRole(s, x)
		switch src := a.member(r); {
		case r == m.role:
			// Reconstruct fills a buffer of length 0 without allocating.
			st.srcs = append(st.srcs, st.sc.get(C)[:0])
		case a.inSync(src, s) && have < nd:
			b := st.sc.get(C)
			st.srcs = append(st.srcs, b)
			st.reads = append(st.reads, mop{m: src, buf: b, off: a.moff(s, 0)})
			have++
		default:
			st.srcs = append(st.srcs, nil)
		}
	}
	if have < nd {
		clear(st.srcs[base:])
		clear(st.reads[rbase:])
		st.srcs, st.reads = st.srcs[:base], st.reads[:rbase]
		return false
	}
	return true
}

// shardRole is the role holding shard x of stripe s: data chunk x below
// DataDisks, then P and Q.
func (a *Array) shardRole(s int64, x int) int {
	if x < a.geo.DataDisks {
		return a.dataRole(s, x)
	}
	return a.parityRole(s, x-a.geo.DataDisks)
}

// resync makes the parity (or mirrors) of every dirty bitmap region agree
// with the data, then clears those bits.
func (a *Array) resync() error {
	defer a.resyncing.Store(false)
	dirty := a.bm.snapshot()
	if debugf != nil {
		debugf("resync: dirty %v state %s", dirty, a.describe())
	}
	var n int64
	for _, d := range dirty {
		if d {
			n++
		}
	}
	rs := a.bm.regionStripes
	p := a.newProgress(ResyncProgress, "resync", -1, n*rs*a.geo.ChunkSize)
	a.emit(Event{Kind: ResyncStarted, Member: -1, Total: p.total})
	for r, d := range dirty {
		if !d {
			continue
		}
		for s := int64(r) * rs; s < min(int64(r+1)*rs, a.geo.Stripes); s++ {
			if a.bg.pass() {
				return ErrStopped
			}
			if err := a.usable(); err != nil {
				return err
			}
			// Stripes with a member out of sync are left to the
			// rebuild (their writes went through the log); a RAID-6
			// one with a single shard out of sync is settled, since
			// an unlogged write in flight at a crash that lost the
			// member may have left P and Q torn (settleStripe).
			a.lockStripe(s)
			var err error
			if a.geo.Level == RAID1 || a.allInSync(s) {
				_, _, err = a.syncStripe(s, true, false)
			} else {
				err = a.settleStripe(s)
				a.resyncSkipped.Store(true)
			}
			a.unlockStripe(s)
			if err != nil && !errors.Is(err, errGone) {
				return err
			}
			p.step(a.geo.ChunkSize)
		}
	}
	if err := a.flushMembers(); err != nil {
		return err
	}
	if err := a.bm.sweep(true); err != nil {
		return err
	}
	e := p.event()
	e.Kind = ResyncDone
	a.emit(e)
	return nil
}

func (a *Array) allInSync(s int64) bool {
	for r := range a.members {
		if !a.inSync(a.member(r), s) {
			return false
		}
	}
	return true
}

// rebuild recomputes role's chunks from the others (every stripe, or the
// dirty regions of a delta resync), then makes the member active.
func (a *Array) rebuild(role int) error {
	m := a.member(role)
	if m == nil || uint8(m.state.Load()) == roleActive {
		return nil
	}
	if uint8(m.state.Load()) != roleRebuilding {
		// Lost after its rebuild was queued: say so (a caller waits for
		// RebuildDone or TaskFailed).
		a.mu.Lock()
		why := m.reason
		a.mu.Unlock()
		return fmt.Errorf("member %d was lost before its rebuild started (%s): %w", role, why, ErrDegraded)
	}
	rs := a.bm.regionStripes
	var total int64
	for s := m.recovery.Load(); s < a.geo.Stripes; s++ {
		if m.needs(s, rs) {
			total += a.geo.ChunkSize
		}
	}
	p := a.newProgress(RebuildProgress, fmt.Sprintf("rebuild member %d", role), role, total)
	a.emit(Event{Kind: RebuildStarted, Member: role, Total: total, Reason: map[bool]string{true: "full", false: "delta"}[m.full]})
	for s := m.recovery.Load(); s < a.geo.Stripes; s++ {
		if a.bg.pass() {
			return ErrStopped
		}
		if err := a.usable(); err != nil {
			return err
		}
		if uint8(m.state.Load()) != roleRebuilding {
			if a.member(role) != m {
				return errSuperseded // a newer device holds the role; its own rebuild reports
			}
			return fmt.Errorf("member %d failed during its rebuild: %w", role, ErrDegraded)
		}
		if !m.needs(s, rs) {
			m.recovery.Store(s + 1)
			continue
		}
		if debugf != nil {
			debugf("rebuild member %d stripe %d (full %v)", role, s, m.full)
		}
		if a.geo.Level == RAID5 || a.geo.Level == RAID6 {
			// Consecutive stripes that need it, as one batch.
			e := s + 1
			for e < min(s+rebuildBatch*rebuildDepth, a.geo.Stripes) && m.needs(e, rs) {
				e++
			}
			n, err := a.rebuildRun(m, s, e)
			if err != nil && !errors.Is(err, errGone) {
				return err
			}
			if err == nil && n > 0 {
				if err := a.rebuildStep(p, m, s+n-1, n); err != nil {
					return err
				}
				s += n - 1
				continue
			}
			// A member failed under the batch, or the first stripe
			// lacks sources: stripe s alone, with the retries and the
			// error of rebuildStripe.
		}
		var err error
		for attempt := 0; attempt <= a.geo.Members; attempt++ {
			a.lockStripe(s)
			err = a.rebuildStripe(m, s)
			if err == nil {
				m.recovery.Store(s + 1)
			}
			a.unlockStripe(s)
			if !errors.Is(err, errGone) || uint8(m.state.Load()) != roleRebuilding {
				break
			}
		}
		if err != nil {
			return err
		}
		if err := a.rebuildStep(p, m, s, 1); err != nil {
			return err
		}
	}
	if err := a.flushMembers(); err != nil {
		return err
	}
	if uint8(m.state.Load()) != roleRebuilding {
		if a.member(role) != m {
			return errSuperseded
		}
		return fmt.Errorf("member %d failed at the end of its rebuild: %w", role, ErrDegraded)
	}
	// full and dirty stay as they are: a reader that saw the rebuilding
	// state a moment ago may still look at them.
	a.mu.Lock()
	m.state.Store(uint32(roleActive))
	a.mu.Unlock()
	if err := a.writeSuperblocks(); err != nil {
		return err
	}
	e := p.event()
	e.Kind = RebuildDone
	a.emit(e)
	a.log.Info("raid rebuild done", "uuid", fmtUUID(a.uuid), "member", role)
	if !a.degraded() {
		if a.resyncSkipped.Swap(false) {
			a.resyncing.Store(true)
			a.bg.enqueue(task{kind: taskResync})
		}
		a.emit(Event{Kind: Optimal, Member: -1})
	}
	return nil
}

// rebuildStep accounts n rebuilt stripes, the last s, and checkpoints
// when a progress event was due: what is below recovery is durable, on
// this member and on the others it was computed from. A member whose
// flush or superblock write fails is failed there; an error that stops
// the array ends the rebuild.
func (a *Array) rebuildStep(p *progress, m *member, s, n int64) error {
	if !p.step(n * a.geo.ChunkSize) {
		return nil
	}
	role, pos := m.role, m.recovery.Load()
	if err := a.flushMembers(); err != nil {
		return fmt.Errorf("member %d rebuild checkpoint at stripe %d: flush: %w", role, s, err)
	}
	// What the rebuild wrote below pos is durable now: the superblocks
	// may say so (TestSuperblockDuringRebuildRecordsCheckpointedRecovery).
	m.durable.Store(pos)
	if err := a.writeSuperblocks(); err != nil {
		return fmt.Errorf("member %d rebuild checkpoint at stripe %d: superblock: %w", role, s, err)
	}
	return nil
}

// rebuildStripe writes role m's chunk of stripe s (stripe lock held).
func (a *Array) rebuildStripe(m *member, s int64) error {
	C := a.geo.ChunkSize
	if a.geo.Level == RAID1 {
		for r := range a.members {
			src := a.member(r)
			if src == m || !a.inSync(src, s) {
				continue
			}
			buf := blockdev.AlignedBuffer(int(C))
			if err := a.mread(src, buf, a.moff(s, 0)); err != nil {
				return err
			}
			return a.mwrite(m, buf, a.moff(s, 0), false)
		}
		return fmt.Errorf("member %d rebuild stopped: %w", m.role, a.unavailable(s))
	}
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	shards := make([][]byte, nd+np)
	var reads []mop
	target := -1
	for x := 0; x < nd+np; x++ {
		var r int
		if x < nd {
			r = a.dataRole(s, x)
		} else {
			r = a.parityRole(s, x-nd)
		}
		if r == m.role {
			target = x
			continue
		}
		if src := a.member(r); a.inSync(src, s) {
			shards[x] = blockdev.AlignedBuffer(int(C))
			reads = append(reads, mop{m: src, buf: shards[x], off: a.moff(s, 0)})
		}
	}
	if len(reads) < nd {
		// Waits for a member to return (ReAdd restarts this rebuild).
		return fmt.Errorf("member %d rebuild stopped: %w", m.role, a.unavailable(s))
	}
	if err := a.run(reads); err != nil {
		return err
	}
	if err := a.coder.enc.Reconstruct(shards); err != nil {
		return fmt.Errorf("stripe %d: %v: %w", s, err, ErrTooManyFailed)
	}
	return a.mwrite(m, shards[target], a.moff(s, 0), false)
}
