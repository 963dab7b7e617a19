package raid

import (
	"errors"
	"math/rand"
	"strings"
	"testing"

	"tier0/daemon/blockdev"
)

const memSize = 2 << 20

func TestGeometryAndLayout(t *testing.T) {
	for _, tc := range []struct {
		level   Level
		n, data int
	}{{RAID0, 3, 3}, {RAID1, 3, 1}, {RAID5, 4, 3}, {RAID6, 6, 4}} {
		ms := newMems(tc.n, memSize)
		a := mustCreate(t, devs(ms), testCfg(tc.level, nil))
		g := a.Geometry()
		if g.DataDisks != tc.data || g.StripeSize != int64(tc.data)*8192 || g.Capacity != g.StripeSize*g.Stripes || g.Capacity != a.Size() {
			t.Errorf("%s: geometry %+v", tc.level, g)
		}
		if g.DataOffset+g.Stripes*g.ChunkSize > memSize {
			t.Errorf("%s: data area ends past the member", tc.level)
		}
	}
	// md left-symmetric RAID-5 over 4 disks: stripe 0 parity on disk 3,
	// data 0,1,2 on disks 0,1,2; stripe 1 parity on 2, data on 3,0,1.
	ms := newMems(4, memSize)
	a := mustCreate(t, devs(ms), testCfg(RAID5, nil))
	got := [][]int{}
	for s := int64(0); s < 4; s++ {
		row := []int{a.parityRole(s, 0)}
		for i := 0; i < 3; i++ {
			row = append(row, a.dataRole(s, i))
		}
		got = append(got, row)
	}
	want := [][]int{{3, 0, 1, 2}, {2, 3, 0, 1}, {1, 2, 3, 0}, {0, 1, 2, 3}}
	for s := range want {
		for x := range want[s] {
			if got[s][x] != want[s][x] {
				t.Fatalf("raid5 layout stripe %d: got P,D0.. = %v, md left-symmetric is %v", s, got[s], want[s])
			}
		}
	}
	// RAID-6 over 5: stripe 0 P=4 Q=0 data 1,2,3.
	ms6 := newMems(5, memSize)
	a6 := mustCreate(t, devs(ms6), testCfg(RAID6, nil))
	if p, q, d0 := a6.parityRole(0, 0), a6.parityRole(0, 1), a6.dataRole(0, 0); p != 4 || q != 0 || d0 != 1 {
		t.Fatalf("raid6 stripe 0: P=%d Q=%d D0=%d, md has 4,0,1", p, q, d0)
	}
}

// TestMembersHoldMDParity: data written through the array lands on the
// members as md would lay it out, with md's P and Q.
func TestMembersHoldMDParity(t *testing.T) {
	ms := newMems(5, memSize)
	a := mustCreate(t, devs(ms), testCfg(RAID6, nil))
	g := a.Geometry()
	rng := rand.New(rand.NewSource(3))
	buf := randBuf(rng, int(g.StripeSize*2))
	mustWrite(t, a, g.StripeSize, buf) // stripes 1 and 2
	for s := int64(1); s <= 2; s++ {
		data := make([][]byte, g.DataDisks)
		for i := range data {
			data[i] = make([]byte, g.ChunkSize)
			ms[a.dataRole(s, i)].ReadAt(data[i], g.DataOffset+s*g.ChunkSize)
			expectEqual(t, "data chunk on member", data[i], buf[(s-1)*g.StripeSize+int64(i)*g.ChunkSize:][:g.ChunkSize])
		}
		p, q := plainPQ(data)
		gotP := make([]byte, g.ChunkSize)
		gotQ := make([]byte, g.ChunkSize)
		ms[a.parityRole(s, 0)].ReadAt(gotP, g.DataOffset+s*g.ChunkSize)
		ms[a.parityRole(s, 1)].ReadAt(gotQ, g.DataOffset+s*g.ChunkSize)
		expectEqual(t, "P on member", gotP, p)
		expectEqual(t, "Q on member", gotQ, q)
	}
}

func TestRoundTripAllLevels(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	for _, tc := range []struct {
		level Level
		n     int
	}{{RAID0, 3}, {RAID1, 2}, {RAID5, 3}, {RAID5, 5}, {RAID6, 4}, {RAID6, 6}} {
		t.Run(tc.level.String(), func(t *testing.T) {
			ms := newMems(tc.n, memSize)
			a := mustCreate(t, devs(ms), testCfg(tc.level, nil))
			model := make([]byte, a.Size())
			for i := 0; i < 60; i++ {
				n := (1 + rng.Intn(64)) * 512
				off := int64(rng.Intn(int(a.Size())-n)) / 512 * 512
				b := randBuf(rng, n)
				mustWrite(t, a, off, b)
				copy(model[off:], b)
			}
			expectEqual(t, "whole array", mustRead(t, a, 0, int(a.Size())), model)
		})
	}
}

func TestMisalignedAndOutOfRange(t *testing.T) {
	ms := newMems(3, memSize)
	a := mustCreate(t, devs(ms), testCfg(RAID5, nil))
	if _, err := a.WriteAt(make([]byte, 100), 0); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Errorf("100-byte write: %v, want ErrMisaligned", err)
	}
	if _, err := a.ReadAt(make([]byte, 512), a.Size()); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Errorf("read past end: %v, want ErrOutOfRange", err)
	}
}

func TestDegradedReadWriteAndTooManyFailed(t *testing.T) {
	for _, tc := range []struct {
		level Level
		n     int
	}{{RAID1, 3}, {RAID5, 4}, {RAID6, 5}} {
		t.Run(tc.level.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(5))
			ev := &events{}
			ms := newMems(tc.n, memSize)
			fs := make([]*blockdev.Fault, tc.n)
			for i := range fs {
				fs[i] = blockdev.NewFault(ms[i])
			}
			a := mustCreate(t, devs(fs), testCfg(tc.level, ev))
			model := randBuf(rng, int(a.Size()))
			mustWrite(t, a, 0, model)
			red := tc.level.redundancy(tc.n)
			for lost := 0; lost < red; lost++ {
				// The member dies: every request fails.
				fs[lost].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail})
				expectEqual(t, "read after member loss", mustRead(t, a, 0, int(a.Size())), model)
				for i := 0; i < 30; i++ {
					n := (1 + rng.Intn(40)) * 512
					off := int64(rng.Intn(int(a.Size())-n)) / 512 * 512
					b := randBuf(rng, n)
					mustWrite(t, a, off, b)
					copy(model[off:], b)
				}
				expectEqual(t, "degraded read", mustRead(t, a, 0, int(a.Size())), model)
			}
			if ev.count(MemberFailed) != red || ev.count(Degraded) != red {
				t.Errorf("events: %d member-failed, %d degraded; want %d each", ev.count(MemberFailed), ev.count(Degraded), red)
			}
			if st := a.Status(); st.State != "degraded" {
				t.Errorf("status %q, want degraded", st.State)
			}
			// One more loss is beyond redundancy: refuse, never wrong data.
			fs[red].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail})
			b := make([]byte, a.Size())
			_, err := a.ReadAt(b, 0)
			if err == nil {
				_, err = a.WriteAt(b[:4096], 0)
			}
			if !errors.Is(err, ErrTooManyFailed) {
				t.Fatalf("after %d losses: %v, want ErrTooManyFailed", red+1, err)
			}
			if _, err := a.ReadAt(b[:512], 0); !errors.Is(err, ErrTooManyFailed) {
				t.Fatalf("array keeps serving after too many failures: %v", err)
			}
			if ev.count(ArrayFailed) != 1 {
				t.Errorf("%d array-failed events, want 1", ev.count(ArrayFailed))
			}
		})
	}
}

func TestRAID6AnyTwoLosses(t *testing.T) {
	rng := rand.New(rand.NewSource(6))
	n := 5
	for x := 0; x < n; x++ {
		for y := x + 1; y < n; y++ {
			ms := newMems(n, 768<<10)
			a := mustCreate(t, devs(ms), testCfg(RAID6, nil))
			model := randBuf(rng, int(a.Size()))
			mustWrite(t, a, 0, model)
			a.FailMember(x, "test")
			a.FailMember(y, "test")
			expectEqual(t, "read with two members lost", mustRead(t, a, 0, int(a.Size())), model)
			// Partial writes while doubly degraded, then read back.
			for i := 0; i < 10; i++ {
				n := (1 + rng.Intn(20)) * 512
				off := int64(rng.Intn(int(a.Size())-n)) / 512 * 512
				b := randBuf(rng, n)
				mustWrite(t, a, off, b)
				copy(model[off:], b)
			}
			expectEqual(t, "doubly degraded read after writes", mustRead(t, a, 0, int(a.Size())), model)
		}
	}
}

func TestFencedMemberStopsArrayWithoutFailingIt(t *testing.T) {
	ev := &events{}
	ms := newMems(4, memSize)
	f := blockdev.NewFault(ms[1])
	d := devs(ms)
	d[1] = f
	a := mustCreate(t, d, testCfg(RAID5, ev))
	f.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Action: blockdev.Fail, Err: blockdev.ErrFenced})
	_, err := a.WriteAt(make([]byte, a.Geometry().StripeSize), 0)
	if !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("write to a fenced member: %v, want ErrFenced", err)
	}
	if ev.count(MemberFailed) != 0 {
		t.Fatal("a fenced member was marked failed")
	}
	if _, err := a.ReadAt(make([]byte, 512), 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("read after fencing: %v, want ErrFenced", err)
	}
	if a.Status().State != "fenced" || ev.count(Fenced) != 1 {
		t.Fatalf("state %q, %d fenced events", a.Status().State, ev.count(Fenced))
	}
}

func TestRetriesThenFails(t *testing.T) {
	ev := &events{}
	ms := newMems(3, memSize)
	f := blockdev.NewFault(ms[0])
	d := devs(ms)
	d[0] = f
	cfg := testCfg(RAID5, ev)
	cfg.Retries = 2
	a := mustCreate(t, d, cfg)
	// Two transient errors are absorbed by the retries.
	f.AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Fail, Count: 2})
	mustRead(t, a, 0, 4096)
	if ev.count(MemberFailed) != 0 {
		t.Fatal("member failed despite retries")
	}
	f.AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Fail})
	mustRead(t, a, 0, 4096)
	if ev.count(MemberFailed) != 1 {
		t.Fatal("persistent errors did not fail the member")
	}
}

func TestAssembleRejectsMismatchedAndStale(t *testing.T) {
	ms := newMems(4, memSize)
	cfg := testCfg(RAID5, nil)
	a, err := Create(devs(ms), cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := randBuf(rand.New(rand.NewSource(7)), int(a.Size()))
	mustWrite(t, a, 0, model)
	uuid := a.UUID()
	// Member 2 goes away; writes continue; it is marked failed.
	a.FailMember(2, "pulled")
	mustWrite(t, a, 0, model[:8192])
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		m.Crash()
	}
	// A member of another array.
	other := newMems(3, memSize)
	b, err := Create(devs(other), testCfg(RAID5, nil))
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	other[0].Crash()
	devices := []blockdev.Device{ms[3], other[0], ms[0], ms[2], ms[1]}
	a2, rej, err := Assemble(devices, AssembleOptions{UUID: uuid, Policy: quietPolicy(nil)})
	if err != nil {
		t.Fatal(err)
	}
	checked(t, a2)
	reasons := map[int]Rejection{}
	for _, r := range rej {
		reasons[r.Slot] = r
	}
	if r, ok := reasons[1]; !ok || !errors.Is(r.Err, ErrMismatch) || !strings.Contains(r.Reason, "belongs to array") {
		t.Errorf("foreign member: %+v, want ErrMismatch naming the other array", r)
	}
	if r, ok := reasons[3]; !ok || !errors.Is(r.Err, ErrStale) {
		t.Errorf("stale member: %+v, want ErrStale", r)
	}
	if st := a2.Status(); st.State != "degraded" || st.Members[2].State != "failed" {
		t.Errorf("assembled state %q members %+v", st.State, st.Members)
	}
	expectEqual(t, "assembled degraded", mustRead(t, a2, 0, int(a2.Size())), model)

	// Geometry mismatch: same UUID, other chunk size.
	ms3 := newMems(4, memSize)
	cfg3 := testCfg(RAID5, nil)
	cfg3.UUID = uuid
	cfg3.ChunkSize = 16 << 10
	c3, _ := Create(devs(ms3), cfg3)
	c3.Close()
	ms3[0].Crash()
	sbRef, _ := readSB(ms[0])
	sbOther, _ := readSB(ms3[0])
	if why := sameGeometry(sbRef, sbOther); !strings.Contains(why, "chunk") {
		t.Errorf("geometry difference reported as %q", why)
	}
}

func TestAssembleEpochAndTooFew(t *testing.T) {
	ms := newMems(3, memSize)
	cfg := testCfg(RAID5, nil)
	cfg.Epoch = 7
	a, err := Create(devs(ms), cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	for _, m := range ms {
		m.Crash()
	}
	if _, _, err := Assemble(devs(ms), AssembleOptions{Epoch: 6, Policy: quietPolicy(nil)}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("assemble with older epoch: %v, want ErrStaleEpoch", err)
	}
	if _, _, err := Assemble([]blockdev.Device{ms[0], nil, nil}, AssembleOptions{Epoch: 8, Policy: quietPolicy(nil)}); !errors.Is(err, ErrTooManyFailed) {
		t.Fatalf("assemble with 1 of 3: %v, want ErrTooManyFailed", err)
	}
	a2 := mustAssemble(t, devs(ms), AssembleOptions{Epoch: 8, Policy: quietPolicy(nil)})
	if a2.Status().Epoch != 8 {
		t.Fatalf("epoch %d stored, want 8", a2.Status().Epoch)
	}
	sb, _ := readSB(ms[1])
	if sb.Epoch != 8 {
		t.Fatalf("member superblock epoch %d, want 8", sb.Epoch)
	}
}

func TestReplaceRebuildsAndReAddIsDelta(t *testing.T) {
	for _, level := range []Level{RAID1, RAID5, RAID6} {
		t.Run(level.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(8))
			ev := &events{}
			n := map[Level]int{RAID1: 2, RAID5: 4, RAID6: 5}[level]
			ms := newMems(n, 4<<20)
			a := mustCreate(t, devs(ms), testCfg(level, ev))
			model := randBuf(rng, int(a.Size()))
			mustWrite(t, a, 0, model)
			a.Flush()
			a.Sweep() // the first sweep sees the regions recently written
			a.Sweep() // the second clears them
			if c := a.bm.count(); c != 0 {
				t.Fatalf("%d dirty regions after sweep", c)
			}
			// Transient loss of member 1; one region is written.
			a.FailMember(1, "transient")
			off := a.Size() / 2 / 4096 * 4096
			b := randBuf(rng, 4096)
			mustWrite(t, a, off, b)
			copy(model[off:], b)
			if err := a.ReAdd(1, ms[1]); err != nil {
				t.Fatal(err)
			}
			a.WaitIdle()
			e, ok := ev.last(RebuildDone)
			if !ok {
				t.Fatal("no rebuild-done event")
			}
			regionBytes := a.bm.regionStripes * a.geo.ChunkSize
			if e.Done > 2*regionBytes || e.Done == 0 {
				t.Fatalf("delta resync copied %d bytes; one region is %d", e.Done, regionBytes)
			}
			if st := a.Status(); st.State != "optimal" {
				t.Fatalf("after re-add: %q", st.State)
			}
			// Lose another member for real: the re-added one must now
			// carry the data.
			a.FailMember(0, "dead")
			expectEqual(t, "after delta resync", mustRead(t, a, 0, int(a.Size())), model)
			// Replace with a blank drive: full rebuild.
			blank := blockdev.NewMem(4<<20, 512)
			if err := a.Replace(0, blank); err != nil {
				t.Fatal(err)
			}
			a.WaitIdle()
			e, _ = ev.last(RebuildDone)
			if e.Done != a.geo.Stripes*a.geo.ChunkSize {
				t.Fatalf("full rebuild covered %d of %d bytes", e.Done, a.geo.Stripes*a.geo.ChunkSize)
			}
			if ev.count(RebuildStarted) != 2 {
				t.Fatalf("%d rebuild-started events", ev.count(RebuildStarted))
			}
			for r := 1; r < n && level != RAID1; r++ {
				a.FailMember(r, "after rebuild")
				break
			}
			expectEqual(t, "after full rebuild", mustRead(t, a, 0, int(a.Size())), model)
		})
	}
}

func TestReAddAfterBitmapClearedIsFull(t *testing.T) {
	ev := &events{}
	ms := newMems(3, memSize)
	a := mustCreate(t, devs(ms), testCfg(RAID5, ev))
	a.FailMember(2, "gone")
	blank := blockdev.NewMem(memSize, 512)
	a.Replace(2, blank)
	a.WaitIdle()
	mustWrite(t, a, 0, make([]byte, 8192))
	a.Sweep()
	a.Sweep() // bits cleared: the old member 2 can no longer be caught up by delta
	a.FailMember(2, "again")
	if err := a.ReAdd(2, ms[2]); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	e, _ := ev.last(RebuildStarted)
	if e.Reason != "full" {
		t.Fatalf("re-add of a member older than the last bitmap clear: %q rebuild, want full", e.Reason)
	}
}

func TestRebuildProgressThrottled(t *testing.T) {
	ev := &events{}
	ms := newMems(4, 4<<20)
	cfg := testCfg(RAID5, ev)
	cfg.RebuildRate = 8 // MiB/s: ~1.3 MiB per member takes ~0.16 s
	cfg.ProgressEvery = 20e6
	a := mustCreate(t, devs(ms), cfg)
	a.FailMember(3, "x")
	if err := a.Replace(3, blockdev.NewMem(4<<20, 512)); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	e, ok := ev.last(RebuildDone)
	if !ok {
		t.Fatal("no rebuild-done")
	}
	if e.Rate > 8.5*(1<<20) {
		t.Fatalf("rebuild ran at %.1f MiB/s, limit 8", e.Rate/(1<<20))
	}
	if ev.count(RebuildProgress) < 2 {
		t.Fatalf("%d progress events", ev.count(RebuildProgress))
	}
	p, _ := ev.last(RebuildProgress)
	if p.Total != a.geo.Stripes*a.geo.ChunkSize || p.Done <= 0 || p.Done > p.Total {
		t.Fatalf("progress event %+v", p)
	}
}

func TestScrubRepairsSingleCorruptChunkRAID6(t *testing.T) {
	ev := &events{}
	ms := newMems(6, memSize)
	a := mustCreate(t, devs(ms), testCfg(RAID6, ev))
	g := a.Geometry()
	rng := rand.New(rand.NewSource(9))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	// Silent corruption: a data chunk of stripe 3, the Q of stripe 5,
	// the P of stripe 7.
	bad := []byte{0xde, 0xad, 0xbe, 0xef}
	ms[a.dataRole(3, 2)].WriteAt(append(bad, make([]byte, 508)...), g.DataOffset+3*g.ChunkSize+1024)
	ms[a.parityRole(5, 1)].WriteAt(make([]byte, 512), g.DataOffset+5*g.ChunkSize)
	ms[a.parityRole(7, 0)].WriteAt(make([]byte, 512), g.DataOffset+7*g.ChunkSize+4096)
	if err := a.Check(); !errors.Is(err, ErrInconsistent) {
		t.Fatalf("check after corruption: %v", err)
	}
	if err := a.StartScrub(true); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	if ev.count(ScrubMismatch) != 3 {
		t.Fatalf("%d mismatches found, want 3", ev.count(ScrubMismatch))
	}
	d, _ := ev.last(ScrubDone)
	if d.Count != 3 {
		t.Fatalf("scrub-done count %d", d.Count)
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "data after scrub repair", mustRead(t, a, 0, int(a.Size())), model)
}

func TestInitialSyncWithoutAssumeClean(t *testing.T) {
	ms := newMems(4, memSize)
	for i, m := range ms {
		m.WriteAt(randBuf(rand.New(rand.NewSource(int64(i))), memSize), 0) // garbage
	}
	ev := &events{}
	cfg := testCfg(RAID6, ev)
	cfg.AssumeClean = false
	a := mustCreate(t, devs(ms), cfg)
	a.WaitIdle()
	if ev.count(ResyncDone) != 1 {
		t.Fatal("no initial resync")
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestPlanMatchesCreate(t *testing.T) {
	for _, level := range []Level{RAID0, RAID1, RAID5, RAID6} {
		ms := newMems(5, memSize)
		cfg := testCfg(level, nil)
		g, err := Plan(cfg, 5, memSize, 512)
		if err != nil {
			t.Fatal(err)
		}
		a := mustCreate(t, devs(ms), cfg)
		if g != a.Geometry() {
			t.Fatalf("%s: Plan %+v, Create %+v", level, g, a.Geometry())
		}
	}
	if _, err := Plan(Config{Level: RAID5}, 2, memSize, 512); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("raid5 over 2 members: %v", err)
	}
}
