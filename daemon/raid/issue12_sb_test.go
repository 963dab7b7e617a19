package raid

// Regression tests of issue 12 (holes 3, 5 and 7, the RAID engine's part): superblock, bitmap, checkpoint and scrub checks.

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// rewriteSB rewrites both superblock slots of dev after edit.
func rewriteSB(t *testing.T, dev blockdev.Device, edit func(*superblock)) {
	t.Helper()
	sb, err := readSB(dev)
	if err != nil {
		t.Fatal(err)
	}
	edit(sb)
	p := sb.marshal()
	for slot := int64(0); slot < 2; slot++ {
		if _, err := dev.WriteAt(p, slot*sbSlotSize); err != nil {
			t.Fatal(err)
		}
	}
}

// Hole 7: a superblock's BitmapBytes is checked against the geometry
// before anything is allocated from it.
func TestAssembleRefusesOutOfRangeBitmapBytes(t *testing.T) {
	for _, bad := range []uint64{1 << 50, 1<<64 - 1, 4096 * 1000} {
		ms := newMems(3, memSize)
		a, err := Create(devs(ms), testCfg(RAID5, nil))
		if err != nil {
			t.Fatal(err)
		}
		a.Abort()
		for _, m := range ms {
			rewriteSB(t, m, func(sb *superblock) { sb.BitmapBytes = bad })
		}
		_, _, err = Assemble(devs(ms), AssembleOptions{Policy: quietPolicy(nil)})
		if err == nil || !strings.Contains(err.Error(), "bitmap") {
			t.Fatalf("BitmapBytes %d: assemble: %v, want a refusal naming the bitmap", bad, err)
		}
	}
}

// Hole 7: a fencing error seen while flushing the survivors of a failed
// member stops the array before it writes any superblock (another node
// owns the members now).
func TestFencedFlushInFailWritesNoSuperblock(t *testing.T) {
	ms := newMems(4, memSize)
	fs := make([]*blockdev.Fault, 4)
	for i := range fs {
		fs[i] = blockdev.NewFault(ms[i])
	}
	a, err := Create(devs(fs), testCfg(RAID5, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Abort()
	before, err := readSB(ms[1])
	if err != nil {
		t.Fatal(err)
	}
	fs[2].AddRule(blockdev.Rule{Op: blockdev.OpFlush, Action: blockdev.Fail, Err: blockdev.ErrFenced})
	if err := a.FailMember(0, "operator"); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("FailMember with a fenced survivor: %v, want ErrFenced", err)
	}
	after, err := readSB(ms[1])
	if err != nil {
		t.Fatal(err)
	}
	if after.Events != before.Events {
		t.Fatalf("member 1's superblock went from event %d to %d after the array saw it was fenced", before.Events, after.Events)
	}
}

// Hole 7: errors of the bitmap sweep's writes reach Sweep's caller.
func TestSweepReportsBitmapWriteErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{{"fenced", blockdev.ErrFenced}, {"io", blockdev.ErrIO}} {
		t.Run(tc.name, func(t *testing.T) {
			ev := &events{}
			ms := newMems(4, memSize)
			fs := make([]*blockdev.Fault, 4)
			for i := range fs {
				fs[i] = blockdev.NewFault(ms[i])
			}
			a, err := Create(devs(fs), testCfg(RAID5, ev))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Abort()
			mustWrite(t, a, 0, make([]byte, 64<<10))
			if err := a.Sweep(); err != nil { // marks the regions seen
				t.Fatal(err)
			}
			fs[2].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: bitmapOffset, Len: int64(a.sbt.BitmapBytes), Action: blockdev.Fail, Err: tc.err})
			err = a.Sweep()
			if err == nil || !strings.Contains(err.Error(), tc.err.Error()) || (tc.err == blockdev.ErrFenced && !errors.Is(err, tc.err)) {
				t.Fatalf("Sweep with member 2's bitmap write failing (%v): %v", tc.err, err)
			}
			if tc.err == blockdev.ErrIO {
				if e, ok := ev.last(MemberFailed); !ok || e.Member != 2 {
					t.Fatalf("member-failed event %+v, want member 2", e)
				}
			}
		})
	}
}

// Hole 5 on RAID-1: a mirror under delta resync serves its clean regions
// when the other mirror fails, and a write to a region that no mirror
// holds is refused, never acknowledged into nowhere.
func TestRAID1ResyncingMirrorServesCleanRegions(t *testing.T) {
	ev := &events{}
	ms := newMems(2, 4<<20)
	a := mustCreate(t, devs(ms), testCfg(RAID1, ev))
	rng := rand.New(rand.NewSource(13))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	a.Flush()
	a.Sweep()
	a.Sweep()
	if err := a.FailMember(1, "transient loss"); err != nil {
		t.Fatal(err)
	}
	rs := a.bm.regionStripes
	region := rs * a.geo.ChunkSize
	w := randBuf(rng, int(a.geo.ChunkSize))
	mustWrite(t, a, region, w)
	copy(model[region:], w)
	f1 := blockdev.NewFault(ms[1])
	f1.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: a.geo.DataOffset + region, Len: a.geo.ChunkSize, Action: blockdev.Delay, Delay: time.Hour})
	t.Cleanup(f1.ClearRules)
	if err := a.ReAdd(1, f1); err != nil {
		t.Fatal(err)
	}
	if err := a.FailMember(0, "second fault during the resync"); err != nil {
		t.Fatalf("failing mirror 0 while mirror 1 resyncs: %v", err)
	}
	if st := a.Status(); st.State != "degraded" || st.Reason == "" {
		t.Fatalf("status %q (%q), want degraded", st.State, st.Reason)
	}
	expectEqual(t, "clean region 0", mustRead(t, a, 0, int(region)), model[:region])
	expectEqual(t, "clean regions 2..", mustRead(t, a, 2*region, int(a.Size()-2*region)), model[2*region:])
	b := make([]byte, a.geo.ChunkSize)
	off := region + a.geo.ChunkSize // a dirty chunk the held rebuild has not reached
	if _, err := a.ReadAt(b, off); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("read of a dirty chunk no mirror holds: %v, want ErrUnavailable", err)
	}
	if _, err := a.WriteAt(b, off); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write of a dirty chunk no mirror holds: %v, want ErrUnavailable", err)
	}
}

// Hole 7: a rebuild checkpoint whose superblock write fails ends the
// rebuild with an error the daemon sees (task-failed), not a log line.
func TestRebuildCheckpointErrorEndsRebuild(t *testing.T) {
	ev := &events{}
	ms := newMems(4, memSize)
	fs := make([]*blockdev.Fault, 4)
	for i := range fs {
		fs[i] = blockdev.NewFault(ms[i])
	}
	cfg := testCfg(RAID5, ev)
	cfg.ProgressEvery = time.Nanosecond // a checkpoint after every stripe
	a, err := Create(devs(fs), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Abort()
	mustWrite(t, a, 0, make([]byte, a.Size()))
	a.FailMember(1, "replaced")
	// The Replace's own superblock write passes; the first checkpoint's
	// is refused: another node fenced the members.
	fs[0].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: 0, Len: 2 * sbSlotSize, After: 1, Action: blockdev.Fail, Err: blockdev.ErrFenced})
	if err := a.Replace(1, blockdev.NewMem(memSize, 512)); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	e, ok := ev.last(TaskFailed)
	if !ok || e.Member != 1 || !strings.Contains(e.Reason, "checkpoint") || !strings.Contains(e.Reason, "fenced") {
		t.Fatalf("task-failed event %+v, want the rebuild of member 1 ended by its checkpoint being fenced", e)
	}
	if st := a.Status(); st.State != "fenced" {
		t.Fatalf("status %q, want fenced", st.State)
	}
}

// Scrub findings are in Status for the daemon to report.
func TestScrubFindingsInStatus(t *testing.T) {
	ev := &events{}
	ms := newMems(5, memSize)
	fs := make([]*blockdev.Fault, 5)
	for i := range fs {
		fs[i] = blockdev.NewFault(ms[i])
	}
	a := mustCreate(t, devs(fs), testCfg(RAID6, ev))
	model := randBuf(rand.New(rand.NewSource(2)), int(a.Size()))
	mustWrite(t, a, 0, model)
	if st := a.Status().Scrub; !st.Started.IsZero() || st.Running {
		t.Fatalf("scrub status before any scrub: %+v", st)
	}
	// A latent bad block: one data chunk of stripe 5 changes under us.
	s := int64(5)
	junk := randBuf(rand.New(rand.NewSource(3)), 4096)
	if _, err := ms[a.dataRole(s, 1)].WriteAt(junk, a.moff(s, 0)); err != nil {
		t.Fatal(err)
	}
	if err := a.StartScrub(true); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	st := a.Status().Scrub
	if st.Running || !st.Repair || st.Started.IsZero() || st.Finished.IsZero() || st.Stripes != a.geo.Stripes ||
		st.Mismatches != 1 || st.Repaired != 1 || st.Unreadable != 0 || st.Err != "" {
		t.Fatalf("scrub status %+v, want a finished repairing run over %d stripes with 1 mismatch repaired", st, a.geo.Stripes)
	}
	expectEqual(t, "after scrub repair", mustRead(t, a, 0, int(a.Size())), model)
	// A member that fails under the scrub: the stripe is unreadable and
	// the run stops early, saying why.
	fs[2].AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Fail})
	if err := a.StartScrub(false); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	st = a.Status().Scrub
	if st.Running || st.Repair || st.Unreadable != 1 || st.Err == "" || !st.Finished.IsZero() || st.Stripes != 1 {
		t.Fatalf("scrub status %+v, want a run stopped at its first stripe, 1 unreadable, with the reason", st)
	}
	if e, ok := ev.last(TaskFailed); !ok || !strings.Contains(e.Reason, "scrub") {
		t.Fatalf("task-failed event %+v, want the scrub", e)
	}
}

// checkLayout accepts every layout Create makes (the range check on
// BitmapBytes must not refuse a real superblock).
func TestLayoutsPassTheSuperblockRangeCheck(t *testing.T) {
	rng := rand.New(rand.NewSource(9))
	for i := 0; i < 3000; i++ {
		level := []Level{RAID0, RAID1, RAID5, RAID6}[rng.Intn(4)]
		n := 4 + rng.Intn(8)
		chunk := int64(4096) << rng.Intn(6)
		size := (int64(1)<<(20+rng.Intn(24)) + rng.Int63n(1<<30)) / 512 * 512
		region := chunk << rng.Intn(12)
		slots := rng.Intn(70)
		_, sb, err := layout(level, n, chunk, 512, size, region, slots)
		if err != nil {
			continue
		}
		if why := sb.checkLayout(); why != "" {
			t.Fatalf("layout(%v, %d members, chunk %d, size %d, region %d, %d slots): refused: %s", level, n, chunk, size, region, slots, why)
		}
	}
}
