package raid

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"
)

// Two partial writes to different rows of one chunk of a healthy stripe,
// no flush between: W1 rows [0, 4 KiB), W2 rows [4 KiB, 8 KiB). W2's
// partial parity covers none of W1's bytes, so no flush precedes its
// entry, and both entries are live at the crash. The crash keeps the
// parity members' writes (W1's new parity over rows [0, 4 KiB)) and
// reverts the written chunk's (W1's data, never flushed: allowed), and
// loses the member of a chunk neither write touched (two on RAID-6).
// Replaying only the stripe's newest entry (W2, rows [4 KiB, 8 KiB))
// leaves rows [0, 4 KiB) with parity that no longer matches the data,
// and the lost chunks' rows, durable before and never written, are
// rebuilt wrong. Each row of the stripe must be made consistent by the
// newest live entry that covers it. With fill, seven more such writes to
// another stripe with the same parity members follow: W2 must not free
// W1's log slots (its rows are not W1's), or they are taken again before
// the crash and W1's entry is gone from every log.
func TestReplayOlderEntryOnRowsNoNewerEntryCovers(t *testing.T) {
	for _, tc := range []struct {
		level Level
		n     int
		lost  []int // data chunks whose members are lost with the crash
		fill  bool
	}{
		{RAID5, 4, []int{1}, false},
		{RAID5, 4, []int{2}, false},
		{RAID6, 6, []int{1}, false},
		{RAID6, 6, []int{1, 2}, false},
		{RAID5, 4, []int{1}, true},
		{RAID6, 6, []int{1, 2}, true},
	} {
		t.Run(fmt.Sprintf("%s-%d-lost%v-fill%v", tc.level, tc.n, tc.lost, tc.fill), func(t *testing.T) {
			rng := rand.New(rand.NewSource(7))
			cfg := testCfg(tc.level, nil)
			cfg.Policy.replay = &replayKnobs{serial: true}
			a, ms, model := flushedArray(t, rng, tc.n, cfg)
			g := a.Geometry()
			if g.ChunkSize != 8<<10 {
				t.Fatalf("chunk size %d, the test needs 8 KiB", g.ChunkSize)
			}
			const s = 2
			base := s * g.StripeSize
			// Rows [0, 4 KiB) of chunk 0, then rows [4 KiB, 8 KiB)
			// of the same chunk; no flush, no FUA.
			written := [][2]int64{{base, base + 8192}}
			for i := int64(0); i < 2; i++ {
				upd := randBuf(rng, 4096)
				mustWrite(t, a, base+i*4096, upd)
				copy(model[base+i*4096:], upd)
			}
			if tc.fill {
				// Seven 512-byte writes to rows of chunk 0 of
				// stripe s2 (same parity members as s), no two
				// on the same rows: with W1 and W2 they use up
				// the 8 log slots of each parity member.
				s2 := int64(s + tc.n)
				if s2 >= g.Stripes || cfg.LogSlots != 8 {
					t.Fatalf("geometry: %d stripes, %d log slots", g.Stripes, cfg.LogSlots)
				}
				b2 := s2 * g.StripeSize
				for k := int64(0); k < 7; k++ {
					mustWrite(t, a, b2+k*512, randBuf(rng, 512))
				}
				written = append(written, [2]int64{b2, b2 + 7*512})
			}
			a.Abort()
			// The parity members keep every write, chunk 0's
			// member none (its two writes were never flushed).
			for k := 0; k < g.ParityDisks; k++ {
				ms[a.parityRole(s, k)].Flush()
			}
			for r := range ms {
				ms[r].Crash()
			}
			d := devs(ms)
			for _, i := range tc.lost {
				d[a.dataRole(s, i)] = nil
			}
			b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: cfg.Policy})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Abort()
			got := mustRead(t, b, 0, len(model))
			for blk := int64(0); blk < int64(len(model)); blk += 512 {
				skip := false
				for _, w := range written {
					skip = skip || (blk >= w[0] && blk < w[1]) // written: old or new
				}
				if !skip && !bytes.Equal(got[blk:blk+512], model[blk:blk+512]) {
					st, c := blk/g.StripeSize, blk%g.StripeSize/g.ChunkSize
					t.Fatalf("block at byte %d (stripe %d chunk %d row %d), durable and never written since, changed after the crash", blk, st, c, blk%g.ChunkSize)
				}
			}
		})
	}
}

// A whole-stripe write to a stripe whose Q member is under a delta
// resync, in sync for that stripe: the stripe is healthy, and the write
// is not logged (no data chunk's member is rebuilding). The owner crashes
// before a flush, the member of a data chunk keeps its old content and
// is lost with the crash; the array, assembled without it, serves that
// chunk as P and the other data define it (the new content). When the
// member returns, the stripe must be caught up: it was in flight at the
// crash. The stripes in flight are added to what an absent member
// catches up after the stop of an optimal array only (missedInFlight);
// otherwise the replay marks them, as every write is logged while a
// member rebuilds — but a whole-stripe write was not when the rebuilding
// member held the stripe's parity, so the returned member served its
// stale chunk: a value already served went back.
func TestUnloggedWriteInFlightWhileRebuildingCaughtUpByAbsentMember(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	cfg := testCfg(RAID6, nil)
	cfg.Policy.replay = &replayKnobs{serial: true, stepped: true}
	a, ms, model := flushedArray(t, rng, 5, cfg)
	g := a.Geometry()
	const s = 4 // P on member 0, Q on member 1, data on 2, 3, 4
	if a.parityRole(s, 1) != 1 || a.dataRole(s, 1) != 3 {
		t.Fatalf("layout: stripe %d Q on %d, chunk 1 on %d", s, a.parityRole(s, 1), a.dataRole(s, 1))
	}
	// Member 1 fails and comes back: a delta resync with nothing to
	// catch up, its task not run yet (stepped), so it stays rebuilding
	// and is in sync for every stripe.
	if err := a.FailMember(1, "test"); err != nil {
		t.Fatal(err)
	}
	if err := a.ReAdd(1, ms[1]); err != nil {
		t.Fatal(err)
	}
	if st := a.Status().Members[1].State; st != "rebuilding" {
		t.Fatalf("member 1 is %q, want rebuilding", st)
	}
	base := s * g.StripeSize
	upd := randBuf(rng, int(g.StripeSize))
	mustWrite(t, a, base, upd)
	copy(model[base:], upd)
	a.Abort()
	lost := a.dataRole(s, 1)
	for r := range ms {
		if r != lost {
			ms[r].Flush() // the others keep the write
		}
		ms[r].Crash()
	}
	d := devs(ms)
	d[lost] = nil
	b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: cfg.Policy})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	served := mustRead(t, b, 0, len(model))
	expectEqual(t, "the array after the crash, without the member lost", served, model)
	if err := b.ReAdd(lost, ms[lost]); err != nil {
		t.Fatal(err)
	}
	got := mustRead(t, b, 0, len(model))
	for blk := int64(0); blk < int64(len(got)); blk += 512 {
		if !bytes.Equal(got[blk:blk+512], served[blk:blk+512]) {
			t.Fatalf("member %d taken back: block at byte %d (stripe %d chunk %d) reads other than the array served without it", lost, blk, blk/g.StripeSize, blk%g.StripeSize/g.ChunkSize)
		}
	}
}
