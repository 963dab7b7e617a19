package raid

import (
	"errors"
)

// Full-stripe writes: the whole stripes in the middle of a write go out in
// batches of up to fullBatch stripes under their stripe locks, with no
// read and no log entry. A batch runs in one of two ways:
//
//   - Members that answer within inlineBelow and whose requests are not
//     merged (memory, the page cache: memoryMembers), with no IOTimeout:
//     stripe by stripe, each stripe's parity computed right before its
//     chunks are written, so that the member copies read the data from
//     the cache that the parity computation has just filled (computing
//     every stripe's parity first left the data to be read from memory
//     twice). Runs of stripes of up to inlineBytes go to parallel
//     workers, unless the array is busy (runStripes).
//   - Otherwise: every stripe's parity first, then one merged request per
//     member (runGrouped), since a drive or a fabric costs far more per
//     request than per byte.

// fullBatch is the most whole stripes written as one batch.
const fullBatch = 16

// writeFullBatch writes consecutive whole stripes of a healthy array with
// one request per member. It reports false (having written nothing) when
// a stripe is not healthy or needs a log marker; the caller then writes
// them one by one. It uses rw's ops, locks, srcs and scratch (rw.spans
// holds sps, which it leaves alone).
func (a *Array) writeFullBatch(rw *readWork, sps []span, fua bool) (bool, error) {
	rw.locks = rw.locks[:0]
	for _, sp := range sps {
		rw.locks = append(rw.locks, int(uint64(sp.s)%stripeLocks))
	}
	a.lockStripes(rw)
	defer func() {
		a.unlockStripes(rw)
		clear(rw.ops)
		clear(rw.srcs)
		rw.ops, rw.srcs = rw.ops[:0], rw.srcs[:0]
		rw.sc.release()
	}()
	if err := a.usable(); err != nil {
		return false, err
	}
	// Only an optimal array: a rebuilding member's writes must be logged
	// (see logFragile), which the per-stripe path does.
	if a.degraded() {
		return false, nil
	}
	for _, sp := range sps {
		if a.logOn && a.jl.needsMarker(sp.s) {
			return false, nil
		}
	}
	C := a.geo.ChunkSize
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	rw.ops = rw.ops[:0]
	for _, sp := range sps {
		for i := 0; i < nd; i++ {
			rw.ops = append(rw.ops, mop{m: a.member(a.dataRole(sp.s, i)), buf: sp.buf[int64(i)*C : int64(i+1)*C], off: a.moff(sp.s, 0), write: true, fua: fua})
		}
		for k := 0; k < np; k++ {
			rw.ops = append(rw.ops, mop{m: a.member(a.parityRole(sp.s, k)), buf: rw.sc.get(C), off: a.moff(sp.s, 0), write: true, fua: fua})
		}
	}
	var err error
	if a.pol.IOTimeout == 0 && (a.serial() || memoryMembers(rw.ops)) {
		err = a.runStripes(rw, int64(nd+np)*C)
	} else {
		w := nd + np
		for x := 0; x < len(rw.ops); x += w {
			rw.srcs = stripeShards(rw.srcs[:0], rw.ops[x:x+w])
			a.coder.encodeShards(rw.srcs)
		}
		// Member order within each member's list follows the stripes, so
		// runGrouped merges them into one request per member.
		err = a.runGrouped(rw.ops)
	}
	for _, sp := range sps {
		a.jl.wrote(sp.s, 0, int64(nd)*C, fua)
	}
	if err != nil {
		for r := range a.members {
			if m := a.member(r); m != nil && m.since != nil && uint8(m.state.Load()) == roleFailed {
				for _, sp := range sps {
					m.since.set(sp.s)
				}
			}
		}
	}
	if errors.Is(err, errGone) {
		err = a.flushMembers()
	}
	if err != nil && !errors.Is(err, errGone) {
		return true, err
	}
	return true, a.usable()
}

// memoryMembers reports whether every request of ops goes to a member
// that answers within inlineBelow on average and whose requests are not
// merged (runMerged): memory, the page cache.
func memoryMembers(ops []mop) bool {
	for _, o := range ops {
		if o.m.lat.Load() >= int64(inlineBelow) || merges(o.m) {
			return false
		}
	}
	return true
}

// stripeShards appends to dst the buffers of one stripe's requests (the
// data chunks by index, then the parity chunks), as the coder takes them.
func stripeShards(dst [][]byte, ops []mop) [][]byte {
	for _, o := range ops {
		dst = append(dst, o.buf)
	}
	return dst
}

// runStripes runs the stripes of rw.ops (stripe bytes each, parity
// included) through writeStripes: the first run of up to inlineBytes on
// the caller's goroutine, the others on parked workers; all on the
// caller's with the serial knob or when the array is busy (see inline).
// Errors as runGrouped reports them.
func (a *Array) runStripes(rw *readWork, stripe int64) error {
	w := a.geo.DataDisks + a.geo.ParityDisks
	per := w * int(max(1, inlineBytes/stripe)) // requests per run
	if a.serial() || a.busy() {
		per = len(rw.ops)
	}
	runs := (len(rw.ops) + per - 1) / per
	for range runs * w {
		rw.srcs = append(rw.srcs, nil)
	}
	if runs == 1 {
		return a.writeStripes(rw.ops, rw.srcs)
	}
	b := getBatch(runs)
	b.wg.Add(runs - 1)
	for g := 1; g < runs; g++ {
		startOp(opJob{a: a, ops: rw.ops[g*per : min((g+1)*per, len(rw.ops))], sh: rw.srcs[g*w : (g+1)*w], b: b, i: g})
	}
	b.errs[0] = a.writeStripes(rw.ops[:per], rw.srcs[:w])
	return b.finish()
}

// writeStripes writes the whole stripes of ops (blocks of one request per
// member: the data chunks by index, then the parity chunks, which it
// computes) one stripe after another, sh being the coder's shard list
// (one entry per member). A member that fails ends only its own requests,
// as in runGroupsInline; the error is a fencing or stop error if one
// occurred, else errGone when a member failed, else nil.
func (a *Array) writeStripes(ops []mop, sh [][]byte) error {
	w := len(sh)
	var failed uint64 // by role
	var r batchResult
	for x := 0; x < len(ops); x += w {
		blk := ops[x : x+w]
		a.coder.encodeShards(stripeShards(sh[:0], blk))
		for _, o := range blk {
			if failed&(1<<o.m.role) != 0 {
				continue
			}
			err := a.do(o)
			if err == nil {
				continue
			}
			failed |= 1 << o.m.role
			r.add(err)
		}
	}
	clear(sh)
	return r.err()
}
