package raid

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"
	"time"
)

// crashLosing writes upd at off in stripe s of a healthy, flushed array,
// then cuts power with only the member writes of the roles in landed
// kept, and assembles the array without the roles in lost (members lost
// with the crash: the owner and a member node at once). It returns the
// first block outside the write that no longer reads as before, and the
// first block of the write on a present member that is neither old nor
// new ("" each when there is none). A block of the write on a lost
// member may read as neither: its new content was in flight, and the
// log does not carry it.
func crashLosing(t *testing.T, level Level, n int, off int64, size int, landed uint, lost ...int) (string, string) {
	t.Helper()
	rng := rand.New(rand.NewSource(42))
	ms := newMems(n, 384<<10)
	a, err := Create(devs(ms), testCfg(level, nil))
	if err != nil {
		t.Fatal(err)
	}
	g := a.Geometry()
	model := randBuf(rng, int(8*g.StripeSize))
	mustWrite(t, a, 0, model)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	upd := randBuf(rng, size)
	mustWrite(t, a, off, upd)
	for r := 0; r < n; r++ {
		if landed&(1<<r) != 0 {
			ms[r].Flush()
		}
	}
	onLost := func(abs int64) bool {
		s, in := abs/g.StripeSize, abs%g.StripeSize
		for _, r := range lost {
			if a.dataRole(s, int(in/g.ChunkSize)) == r {
				return true
			}
		}
		return false
	}
	a.Abort()
	for r := 0; r < n; r++ {
		ms[r].Crash()
	}
	d := devs(ms)
	for _, r := range lost {
		d[r] = nil
	}
	b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: quietPolicy(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort() // in-flight blocks of a lost member may not match parity: no end check
	got := mustRead(t, b, 0, len(model))
	var outside, inside string
	for blk := int64(0); blk < int64(len(model)); blk += 512 {
		old := model[blk : blk+512]
		if blk >= off && blk < off+int64(size) {
			nw := upd[blk-off : blk-off+512]
			if inside == "" && !onLost(blk) && !bytes.Equal(got[blk:blk+512], old) && !bytes.Equal(got[blk:blk+512], nw) {
				inside = fmt.Sprintf("written block at byte %d (present member) is neither old nor new", blk)
			}
			continue
		}
		if outside == "" && !bytes.Equal(got[blk:blk+512], old) {
			outside = fmt.Sprintf("block at byte %d (stripe %d, chunk %d), outside the write, changed", blk, blk/g.StripeSize, blk%g.StripeSize/g.ChunkSize)
		}
	}
	return outside, inside
}

// A write that covers the end of one chunk and the start of the next, in
// flight when the owner crashes, with the first chunk's member lost at
// the same time: the untouched rows of that chunk must survive. Before
// the log's partial parity covered the unmodified rows of partly written
// chunks, the replay could not apply the entry without that chunk, and
// its untouched rows were rebuilt from torn parity.
func TestWriteHolePartlyWrittenChunkLostAtCrash(t *testing.T) {
	for _, tc := range []struct {
		level Level
		n     int
	}{{RAID5, 4}, {RAID5, 5}, {RAID6, 5}, {RAID6, 6}} {
		probe, _ := Create(devs(newMems(tc.n, 384<<10)), testCfg(tc.level, nil))
		g := probe.Geometry()
		const s = 5
		lost := probe.dataRole(s, 0)
		probe.Abort()
		off := s*g.StripeSize + g.ChunkSize/2 // second half of chunk 0, first half of chunk 1
		for landed := uint(0); landed < 1<<tc.n; landed++ {
			outside, inside := crashLosing(t, tc.level, tc.n, off, int(g.ChunkSize), landed, lost)
			if outside != "" || inside != "" {
				t.Fatalf("%s-%d, member writes landed %0*b, member %d lost: %s%s", tc.level, tc.n, tc.n, landed, lost, outside, inside)
			}
		}
	}
}

// RAID-6: a write to one chunk in flight when the owner crashes, losing
// that chunk's member and the member of an untouched chunk of the same
// stripe. P and Q may be torn against each other; the untouched chunk,
// rebuilt from both, must read as before. The replay takes it from the
// partial parity and rewrites Q to match P.
func TestRAID6WriteHoleTwoLostAtCrash(t *testing.T) {
	for _, n := range []int{5, 6} {
		probe, _ := Create(devs(newMems(n, 384<<10)), testCfg(RAID6, nil))
		g := probe.Geometry()
		const s = 5
		x, y := probe.dataRole(s, 0), probe.dataRole(s, 1)
		probe.Abort()
		off := s*g.StripeSize + 1024
		for landed := uint(0); landed < 1<<n; landed++ {
			outside, inside := crashLosing(t, RAID6, n, off, 2048, landed, x, y)
			if outside != "" || inside != "" {
				t.Fatalf("raid6-%d, member writes landed %0*b, members %d and %d lost: %s%s", n, n, landed, x, y, outside, inside)
			}
		}
	}
}

// A full-stripe write of an optimal array (not logged) is in flight when
// the owner crashes; only the member that is then away at the assembly
// got its chunk. The array serves that stripe rebuilt from the others
// (the old content). When the member comes back it must be caught up on
// the stripe, not served as in sync: a read must not change to the other
// value with no write in between.
func TestMemberAwayAtUncleanAssemblyCatchesUpInFlightStripes(t *testing.T) {
	for _, tc := range []struct {
		level Level
		n     int
	}{{RAID5, 4}, {RAID6, 5}} {
		rng := rand.New(rand.NewSource(9))
		ms := newMems(tc.n, 384<<10)
		a, err := Create(devs(ms), testCfg(tc.level, nil))
		if err != nil {
			t.Fatal(err)
		}
		g := a.Geometry()
		model := randBuf(rng, int(8*g.StripeSize))
		mustWrite(t, a, 0, model)
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		const s = 3
		away := a.dataRole(s, 0)
		mustWrite(t, a, s*g.StripeSize, randBuf(rng, int(g.StripeSize))) // full stripe, in flight
		ms[away].Flush()                                                 // only the away member's write landed
		a.Abort()
		for r := range ms {
			ms[r].Crash()
		}
		d := devs(ms)
		d[away] = nil
		b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: quietPolicy(nil)})
		if err != nil {
			t.Fatal(err)
		}
		served := mustRead(t, b, s*g.StripeSize, int(g.StripeSize))
		if err := b.ReAdd(away, ms[away]); err != nil {
			t.Fatal(err)
		}
		b.WaitIdle()
		checked(t, b)
		expectEqual(t, fmt.Sprintf("%s: stripe %d after the away member came back", tc.level, s), mustRead(t, b, s*g.StripeSize, int(g.StripeSize)), served)
	}
}

// RAID-6: a full-stripe write of an optimal array (not logged) is in
// flight when the owner crashes and a member is lost with it; the
// survivors hold any mix of old and new chunks, P and Q each old or new.
// The array serves the stripe with the lost chunk as P defines it. When
// a second member is lost before the first returns, the stripe must
// still read as it was served: reconstructed from P and Q, they must
// agree. Before the resync settled such a stripe (settleStripe), P and Q
// stayed torn against each other and the second loss read garbage in
// chunks that held acknowledged data (TestModelCrashWithMemberLoss,
// raid6-5 seed 7102).
func TestRAID6TornFullStripeSettledAfterCrashWithLoss(t *testing.T) {
	for _, n := range []int{5} {
		probe, _ := Create(devs(newMems(n, 384<<10)), testCfg(RAID6, nil))
		const s = 3
		cases := []struct {
			what        string
			lost, later int
		}{
			{"data chunk 0 lost, data chunk 1 later", probe.dataRole(s, 0), probe.dataRole(s, 1)},
			{"P lost, data chunk 0 later", probe.parityRole(s, 0), probe.dataRole(s, 0)},
			{"Q lost, data chunk 0 later", probe.parityRole(s, 1), probe.dataRole(s, 0)},
		}
		probe.Abort()
		for _, c := range cases {
			for landed := uint(0); landed < 1<<n; landed++ {
				rng := rand.New(rand.NewSource(int64(landed)))
				ms := newMems(n, 384<<10)
				a, err := Create(devs(ms), testCfg(RAID6, nil))
				if err != nil {
					t.Fatal(err)
				}
				g := a.Geometry()
				mustWrite(t, a, 0, randBuf(rng, int(8*g.StripeSize)))
				if err := a.Flush(); err != nil {
					t.Fatal(err)
				}
				mustWrite(t, a, s*g.StripeSize, randBuf(rng, int(g.StripeSize))) // full stripe, in flight
				for r := 0; r < n; r++ {
					if landed&(1<<r) != 0 {
						ms[r].Flush()
					}
				}
				a.Abort()
				for r := range ms {
					ms[r].Crash()
				}
				d := devs(ms)
				d[c.lost] = nil
				b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: quietPolicy(nil)})
				if err != nil {
					t.Fatal(err)
				}
				served := mustRead(t, b, 0, int(8*g.StripeSize))
				b.WaitIdle()
				b.FailMember(c.later, "test: second loss")
				got := mustRead(t, b, 0, int(8*g.StripeSize))
				b.Abort()
				for blk := int64(0); blk < int64(len(got)); blk += 512 {
					if !bytes.Equal(got[blk:blk+512], served[blk:blk+512]) {
						t.Fatalf("raid6-%d, %s, member writes landed %0*b: block at byte %d (stripe %d, chunk %d) changed after the second loss",
							n, c.what, n, landed, blk, blk/g.StripeSize, blk%g.StripeSize/g.ChunkSize)
					}
				}
			}
		}
	}
}

// A member lost with a crash keeps the log entries it held; the array
// assembled without it reuses their sequence numbers (they are above
// anything the others hold), and ReAdd wipes the member's log before it
// takes part again. The wipe must be durable before the member does: a
// crash right after the ReAdd otherwise brings the old entries back, and
// the replay merges an old entry of one stripe with a new one of the same
// sequence number on another member (TestModelCrashWithMemberLoss,
// raid5-4 seed 8300: a block of a degraded full-stripe write read as
// neither old nor new, rebuilt from parity computed with another
// stripe's partial).
func TestReAddLogWipeDurableBeforeCrash(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	a, ms, model := flushedArray(t, rng, 4, testCfg(RAID5, nil))
	g := a.Geometry()
	const s = 2
	x := a.parityRole(s, 0)
	t2 := int64(-1) // a stripe with a data chunk on x
	ci := 0
	for st := int64(3); st < 8 && t2 < 0; st++ {
		for i := 0; i < g.DataDisks; i++ {
			if a.dataRole(st, i) == x {
				t2, ci = st, i
			}
		}
	}
	landAll := func() {
		for r := range ms {
			ms[r].Flush()
		}
	}
	// A partial write to stripe s: its log entry lies on x alone.
	upd := randBuf(rng, 1024)
	mustWrite(t, a, s*g.StripeSize+512, upd)
	copy(model[s*g.StripeSize+512:], upd)
	landAll()
	a.Abort()
	for r := range ms {
		ms[r].Crash()
	}
	d := devs(ms)
	d[x] = nil
	// A slow rebuild without checkpoints: nothing flushes x between
	// its re-add and the crash unless the re-add does.
	pol := quietPolicy(nil)
	pol.RebuildRate, pol.ProgressEvery = 0.01, time.Hour
	b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	// A degraded write to x's chunk of stripe t2, logged on t2's parity
	// member (with x's new data), then x comes back.
	upd = randBuf(rng, 1024)
	off := t2*g.StripeSize + int64(ci)*g.ChunkSize + 1024
	mustWrite(t, b, off, upd)
	copy(model[off:], upd)
	landAll()
	if err := b.ReAdd(x, ms[x]); err != nil {
		t.Fatal(err)
	}
	b.Abort()
	for r := range ms {
		ms[r].Crash()
	}
	hb := make([]byte, metaBlock)
	for k := 0; k < b.jl.slots; k++ {
		if _, err := ms[x].ReadAt(hb, b.jl.slotOff(k)); err != nil {
			t.Fatal(err)
		}
		if string(hb[:len(entMagic)]) == entMagic {
			t.Errorf("member %d, re-added and then crashed, still holds a log entry from before its re-add in slot %d", x, k)
		}
	}
	c, _, err := Assemble(devs(ms), AssembleOptions{Epoch: 2, Policy: quietPolicy(nil)})
	if err != nil {
		t.Fatal(err)
	}
	c.WaitIdle()
	checked(t, c)
	expectEqual(t, "the array after the crash that followed the re-add", mustRead(t, c, 0, len(model)), model)
}

// Two partial writes to one healthy stripe within a flush interval, to
// different chunks: the second entry's partial parity holds the first
// write's new content, which is not durable. A crash reverts it and loses
// the member of a chunk neither write touched; the replay (parity :=
// partial ⊕ the modified chunk) then rebuilds that chunk's rows from a
// content its neighbour no longer holds. Its rows were durable: they
// must read back unchanged (the engine flushes before logging an entry
// whose partial covers unflushed bytes).
func TestHealthyStripeRewrittenWithinFlushIntervalLostAtCrash(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	a, ms, model := flushedArray(t, rng, 4, testCfg(RAID5, nil))
	g := a.Geometry()
	const s = 3
	base := s * g.StripeSize
	// Rows [0, 4 KiB) of chunk 0, then of chunk 1, no flush between.
	for i := int64(0); i < 2; i++ {
		upd := randBuf(rng, 4096)
		mustWrite(t, a, base+i*g.ChunkSize, upd)
		copy(model[base+i*g.ChunkSize:], upd)
	}
	lost := a.dataRole(s, 2) // untouched by both writes
	a.Abort()
	for r := range ms {
		ms[r].Crash() // only what was flushed (or written with FUA) survives
	}
	d := devs(ms)
	d[lost] = nil
	b, _, err := Assemble(d, AssembleOptions{Epoch: 1, Policy: quietPolicy(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	got := mustRead(t, b, 0, len(model))
	c2 := base + 2*g.ChunkSize
	for blk := c2; blk < c2+g.ChunkSize; blk += 512 {
		if !bytes.Equal(got[blk:blk+512], model[blk:blk+512]) {
			t.Fatalf("stripe %d chunk 2 (member %d, lost with the crash, written by neither write): durable block at byte %d changed", s, lost, blk)
		}
	}
	// The written blocks read old or new; every other block as before.
	for blk := int64(0); blk < int64(len(model)); blk += 512 {
		if blk >= base && blk < base+g.ChunkSize+4096 {
			continue
		}
		if !bytes.Equal(got[blk:blk+512], model[blk:blk+512]) {
			t.Fatalf("durable block at byte %d (stripe %d) changed", blk, blk/g.StripeSize)
		}
	}
}
