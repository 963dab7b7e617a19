package raid

import (
	"bytes"
	"math/rand"
	"testing"

	"tier0/daemon/blockdev"
)

// A member that fails under a batch of whole stripes written inline (fast
// members: memory, page cache) must not cost the other members their
// writes. Before, the inline path of runGrouped ran every member's
// requests in one loop that stopped at the first error, so the members
// after the failed one (by role) kept their old chunks and parity; the
// write was acknowledged, and a read returned old data from them and
// garbage where the failed member's chunk was rebuilt from them (found by
// TestModelCrashWithMemberLoss: raid5-5 seed 9601, a hand-off after such a
// write, "matches none of its 2 possible values").
func TestMemberFailingUnderInlineFullStripeBatchKeepsOthersWrites(t *testing.T) {
	for _, level := range []Level{RAID5, RAID6} {
		t.Run(level.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(11))
			ms := newMems(5, 384<<10)
			fs := make([]*blockdev.Fault, len(ms))
			for i := range ms {
				fs[i] = blockdev.NewFault(ms[i])
			}
			a := mustCreate(t, devs(fs), testCfg(level, nil))
			g := a.Geometry()
			mustWrite(t, a, 0, randBuf(rng, int(8*g.StripeSize)))
			// Every member counts as fast: the batch runs inline.
			for r := range fs {
				a.member(r).lat.Store(0)
			}
			fs[1].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail})
			upd := randBuf(rng, int(4*g.StripeSize))
			off := 2 * g.StripeSize
			mustWrite(t, a, off, upd)
			if st := a.Status().Members[1].State; st != "failed" {
				t.Fatalf("member 1 is %q after failing under the write, want failed", st)
			}
			got := mustRead(t, a, off, len(upd))
			for i := 0; i < len(upd); i += 512 {
				if !bytes.Equal(got[i:i+512], upd[i:i+512]) {
					b := off + int64(i)
					t.Fatalf("array byte %d (stripe %d, chunk %d on member %d) does not read as the acknowledged write", b, b/g.StripeSize, b%g.StripeSize/g.ChunkSize, a.dataRole(b/g.StripeSize, int(b%g.StripeSize/g.ChunkSize)))
				}
			}
		})
	}
}
