package raid

import (
	"bytes"
	"errors"

	"tier0/daemon/blockdev"
)

// settleStripe makes a RAID-6 stripe with exactly one shard out of sync
// agree with itself (stripe lock held); the resync calls it for the dirty
// stripes it cannot resync in full.
//
// After a crash that also lost a member, a stripe whose healthy
// full-stripe write (not logged) was in flight holds, on the survivors, a
// mix of old and new chunks, with P and Q each old or new. Reads and the
// rebuild define the missing chunk by P and the other data; Q may
// disagree. Left so, the loss of a second member before the first is
// rebuilt reconstructs both from P and Q torn against each other —
// garbage in chunks that hold acknowledged data (a RAID-6 crash losing a
// member while another was resyncing, docs/RELIABILITY.md problem 6). So
// the present parities are recomputed from the data, the missing data
// chunk taken as P defines it: values that were already served stay.
func (a *Array) settleStripe(s int64) error {
	if a.geo.Level != RAID6 {
		return nil
	}
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	C := int(a.geo.ChunkSize)
	shards := make([][]byte, nd+np)
	reads := make([]mop, 0, nd+np)
	miss := -1
	for x := 0; x < nd+np; x++ {
		m := a.member(a.shardRole(s, x))
		if !a.inSync(m, s) {
			if miss >= 0 {
				return nil // two out of sync: nothing to settle against
			}
			miss = x
			continue
		}
		shards[x] = blockdev.AlignedBuffer(C)
		reads = append(reads, mop{m: m, buf: shards[x], off: a.moff(s, 0)})
	}
	if miss < 0 {
		return nil
	}
	if err := a.run(reads); err != nil {
		return err
	}
	if miss < nd {
		// The missing data chunk as reads see it: P ⊕ the other data.
		y := make([]byte, C)
		copy(y, shards[nd])
		for i := 0; i < nd; i++ {
			if i != miss {
				a.coder.mulXor(0, i, shards[i], y)
			}
		}
		shards[miss] = y
	}
	for k := 0; k < np; k++ {
		if nd+k == miss {
			continue
		}
		par := make([]byte, C)
		for i := 0; i < nd; i++ {
			a.coder.mulXor(k, i, shards[i], par)
		}
		if bytes.Equal(par, shards[nd+k]) {
			continue
		}
		if err := a.mwrite(a.member(a.parityRole(s, k)), par, a.moff(s, 0), false); err != nil && !errors.Is(err, errGone) {
			return err
		}
		if debugf != nil {
			debugf("settle: stripe %d shard %d missing, parity %d rewritten", s, miss, k)
		}
	}
	return nil
}
