package raid

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"
)

// TestSeqWrite4KMemberFlushes counts member flushes (Mem.Flushes, not
// time) for sequential 4 KiB writes on a healthy array with 64 KiB chunks:
// the pattern that rewrites a stripe within one flush interval. The log
// entry of a write whose partial parity covers bytes written since the
// last flush needs those bytes durable first; flushing every member for
// it cost 41.5 flushes of all 4 members per 1000 writes on RAID-5 (166
// member flushes) and 46.9 of all 6 on RAID-6 (281). Flushing the members
// that hold the stripe's unflushed writes (its written chunks' and its
// parities', unflushed.go) halves that.
func TestSeqWrite4KMemberFlushes(t *testing.T) {
	for _, tc := range []struct {
		level Level
		n     int
		bound float64 // member flushes per 1000 writes
	}{{RAID5, 4, 100}, {RAID6, 6, 170}} {
		t.Run(fmt.Sprintf("%s-%d", tc.level, tc.n), func(t *testing.T) {
			ms := newMems(tc.n, 24<<20)
			a, err := Create(devs(ms), Config{Level: tc.level, ChunkSize: 64 << 10, AssumeClean: true, Policy: quietPolicy(nil)})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			before := 0
			for _, m := range ms {
				before += m.Flushes()
			}
			const writes = 2000
			buf := randBuf(rand.New(rand.NewSource(1)), 4096)
			for i := int64(0); i < writes; i++ {
				mustWrite(t, a, i*4096, buf)
			}
			after := 0
			for _, m := range ms {
				after += m.Flushes()
			}
			per := float64(after-before) * 1000 / writes
			t.Logf("%s-%d: %d member flushes for %d sequential 4 KiB writes: %.1f per 1000", tc.level, tc.n, after-before, writes, per)
			if per > tc.bound {
				t.Fatalf("%s-%d: %.1f member flushes per 1000 sequential 4 KiB writes, expected at most %.0f: the engine flushes members that hold none of the bytes the partial parity covers (unflushed.go)", tc.level, tc.n, per, tc.bound)
			}
		})
	}
}

// TestTargetedFlushMembers: on a healthy stripe, the flush before an
// entry whose partial covers unflushed bytes reaches the members of the
// stripe's written chunks and its parity, not the others; when the
// stripe's hashed slot also holds another stripe's writes it flushes
// every member (only that covers both).
func TestTargetedFlushMembers(t *testing.T) {
	for _, mixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("mixed=%v", mixed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(7))
			a, ms, _ := flushedArray(t, rng, 4, testCfg(RAID5, nil))
			defer a.Abort()
			g := a.Geometry()
			const s = 3
			base := s * g.StripeSize
			mustWrite(t, a, base, randBuf(rng, 4096)) // chunk 0, rows [0, 4 KiB)
			if mixed {
				// A write of the stripe sharing s's slot (past the
				// array's end here: only the slot's record matters).
				a.jl.wrote(s+wstSlots, g.ChunkSize, g.ChunkSize+4096, false)
			}
			before := make([]int, len(ms))
			for r, m := range ms {
				before[r] = m.Flushes()
			}
			// Chunk 1, same rows: the partial covers chunk 0's new bytes.
			mustWrite(t, a, base+g.ChunkSize, randBuf(rng, 4096))
			want := map[int]bool{a.dataRole(s, 0): true, a.parityRole(s, 0): true}
			for r, m := range ms {
				got := m.Flushes() - before[r]
				exp := 0
				if want[r] || mixed {
					exp = 1
				}
				if got != exp {
					t.Errorf("member %d (data roles of stripe %d: %d %d %d, parity %d): flushed %d times by the second write, expected %d",
						r, s, a.dataRole(s, 0), a.dataRole(s, 1), a.dataRole(s, 2), a.parityRole(s, 0), got, exp)
				}
			}
		})
	}
}

// TestSeqWritesTargetedFlushCrashWithLoss: sequential 4 KiB writes over a
// stripe (chunks 0 and 1 whole, then the first rows of chunk 2), each
// chunk change flushing only the written chunks' members and the parity;
// a crash leaving any mix of the unflushed blocks and losing chunk 2's
// member must rebuild chunk 2's unwritten rows as they were. They are
// rebuilt from parity rows that only the first writes' entries covered,
// whose slots the targeted flush frees: without the parity in the
// targeted flush, a parity block that reverted at the crash rebuilt them
// wrong.
func TestSeqWritesTargetedFlushCrashWithLoss(t *testing.T) {
	for seed := int64(0); seed < 8; seed++ {
		rng := rand.New(rand.NewSource(seed))
		a, ms, model := flushedArray(t, rng, 4, testCfg(RAID5, nil))
		g := a.Geometry()
		const s = 3
		base := s * g.StripeSize
		end := base + 2*g.ChunkSize + 4096
		for off := base; off < end; off += 4096 {
			mustWrite(t, a, off, randBuf(rng, 4096))
		}
		lost := a.dataRole(s, 2)
		a.Abort()
		for r := range ms {
			ms[r].CrashRandom(rng)
		}
		d := devs(ms)
		d[lost] = nil
		b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: quietPolicy(nil)})
		if err != nil {
			t.Fatal(err)
		}
		got := mustRead(t, b, 0, len(model))
		b.Abort()
		for blk := int64(0); blk < int64(len(model)); blk += 512 {
			if blk >= base && blk < end {
				continue // written: old or new (or anything on the lost member)
			}
			if !bytes.Equal(got[blk:blk+512], model[blk:blk+512]) {
				t.Fatalf("seed %d: durable block at byte %d (stripe %d, chunk %d, row %d; member %d lost) changed",
					seed, blk, blk/g.StripeSize, blk%g.StripeSize/g.ChunkSize, blk%g.ChunkSize, lost)
			}
		}
	}
}
