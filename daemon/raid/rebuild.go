package raid

import (
	"fmt"
	"slices"
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
	slices.Sort(rw.locks)
	rw.locks = slices.Compact(rw.locks)
	for _, i := range rw.locks {
		a.locks[i].Lock()
	}
	defer func() {
		for _, i := range rw.locks {
			a.locks[i].Unlock()
		}
	}()
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
