package raid

import (
	"bytes"
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// A partial write to stripe s (entry E1 on s's parity members), a flush
// (E1 dead in memory: the tail passes it), a partial write to stripe x
// whose parity members are others (its entry carries the new tail, on
// x's parity members only), then a whole-stripe write to s, flushed. The
// engine took the tail as persisted once x's entry was written, so s's
// whole-stripe write logged no marker. A crash that loses x's parity
// members leaves no log holding that tail: the replay takes E1 for live
// and rebuilds s's parity from E1's partial, which holds the content the
// whole-stripe write replaced; s's chunks on the lost members, flushed,
// are rebuilt wrong. The tail counts as persisted once every present
// member's log (or the superblocks) holds it.
func TestUnloggedWriteAfterTailOnLostMemberOnly(t *testing.T) {
	for _, tc := range []struct {
		level Level
		n     int
	}{{RAID5, 4}, {RAID6, 6}} {
		t.Run(fmt.Sprintf("%s-%d", tc.level, tc.n), func(t *testing.T) {
			rng := rand.New(rand.NewSource(3))
			cfg := testCfg(tc.level, nil)
			cfg.Policy.replay = &replayKnobs{serial: true}
			a, ms, model := flushedArray(t, rng, tc.n, cfg)
			g := a.Geometry()
			par := func(st int64) []int {
				var rs []int
				for k := 0; k < g.ParityDisks; k++ {
					rs = append(rs, a.parityRole(st, k))
				}
				return rs
			}
			const s = 1
			x := int64(-1)
			for c := int64(0); c < 8 && x < 0; c++ {
				disjoint := true
				for _, r := range par(c) {
					disjoint = disjoint && !slices.Contains(par(s), r)
				}
				if disjoint {
					x = c
				}
			}
			lost := par(x)
			ci := -1 // a chunk of s whose member survives
			for i := 0; i < g.DataDisks && ci < 0; i++ {
				if !slices.Contains(lost, a.dataRole(s, i)) {
					ci = i
				}
			}
			if x < 0 || ci < 0 {
				t.Fatalf("layout: no stripe x (%d) or chunk (%d)", x, ci)
			}
			write := func(off int64, n int) {
				p := randBuf(rng, n)
				mustWrite(t, a, off, p)
				copy(model[off:], p)
			}
			write(s*g.StripeSize+int64(ci)*g.ChunkSize, 4096) // E1
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			write(x*g.StripeSize, 4096) // carries the new tail, on x's parity members
			write(s*g.StripeSize, int(g.StripeSize))
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			a.Abort()
			for r := range ms {
				ms[r].Crash()
			}
			d := devs(ms)
			for _, r := range lost {
				d[r] = nil
			}
			b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: cfg.Policy})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Abort()
			got := mustRead(t, b, 0, len(model))
			for blk := int64(0); blk < int64(len(got)); blk += 512 {
				if !bytes.Equal(got[blk:blk+512], model[blk:blk+512]) {
					t.Fatalf("members %v lost with the crash: block at byte %d (stripe %d chunk %d), written and flushed, changed", lost, blk, blk/g.StripeSize, blk%g.StripeSize/g.ChunkSize)
				}
			}
		})
	}
}
