package raid

import (
	"fmt"
	"slices"
)

// rebuildBatch is the most stripes a rebuild reconstructs as one batch:
// one merged read per source member and one merged write to the rebuilt
// member (16 × 64 KiB chunks = 1 MiB per member), so that the rebuild
// runs at the members' sequential bandwidth instead of one chunk-sized
// request per member at a time.
const rebuildBatch = 16

// rebuildRun rebuilds role m's chunks of stripes [s0, s1) of a RAID-5/6
// array, all of which need it, under their stripe locks, and advances
// the recovery position to s1. It reports how many stripes it rebuilt:
// fewer than asked (and no error) when a stripe lacks sources, which the
// caller then rebuilds alone (rebuildStripe reports why).
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
	C := a.geo.ChunkSize
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	w := nd + np
	// rw.srcs holds w shards per stripe; the target's is a pooled buffer
	// of length 0 that Reconstruct fills without allocating.
	n := s1 - s0
	for s := s0; s < s1; s++ {
		have := 0
		base := len(rw.srcs)
		for x := 0; x < w; x++ {
			r := a.shardRole(s, x)
			switch src := a.member(r); {
			case r == m.role:
				rw.srcs = append(rw.srcs, rw.sc.get(C)[:0])
			case a.inSync(src, s) && have < nd:
				b := rw.sc.get(C)
				rw.srcs = append(rw.srcs, b)
				rw.ops = append(rw.ops, mop{m: src, buf: b, off: a.moff(s, 0)})
				have++
			default:
				rw.srcs = append(rw.srcs, nil)
			}
		}
		if have < nd {
			rw.srcs = rw.srcs[:base]
			n = s - s0
			break
		}
	}
	if n == 0 {
		return 0, nil
	}
	if err := a.runGrouped(rw.ops); err != nil {
		return 0, err
	}
	rw.ops = rw.ops[:0]
	for k := int64(0); k < n; k++ {
		sh := rw.srcs[k*int64(w) : (k+1)*int64(w)]
		if cap(rw.req) < w {
			rw.req = make([]bool, w)
		}
		req := rw.req[:w]
		t := -1
		for x := range req {
			req[x] = a.shardRole(s0+k, x) == m.role
			if req[x] {
				t = x
			}
		}
		if err := a.coder.enc.ReconstructSome(sh, req); err != nil {
			return 0, fmt.Errorf("stripe %d: %v: %w", s0+k, err, ErrTooManyFailed)
		}
		rw.ops = append(rw.ops, mop{m: m, buf: sh[t], off: a.moff(s0+k, 0), write: true})
	}
	if err := a.runGrouped(rw.ops); err != nil {
		return 0, err
	}
	m.recovery.Store(s0 + n)
	return n, nil
}

// shardRole is the role holding shard x of stripe s: data chunk x below
// DataDisks, then P and Q.
func (a *Array) shardRole(s int64, x int) int {
	if x < a.geo.DataDisks {
		return a.dataRole(s, x)
	}
	return a.parityRole(s, x-a.geo.DataDisks)
}
