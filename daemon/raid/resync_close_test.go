package raid

import (
	"fmt"
	"math/rand"
	"testing"

	"tier0/daemon/blockdev"
)

// keepOpen is a member whose Close leaves the device open: a clean
// hand-off where the drives stay up and keep what was written.
type keepOpen struct{ blockdev.Device }

func (keepOpen) Close() error { return nil }

// steppedPolicy is quietPolicy with the replayable scheduling knobs: the
// background worker runs only the steps a test grants (bg.step).
func steppedPolicy() Policy {
	p := quietPolicy(nil)
	p.replay = &replayKnobs{serial: true, stepped: true}
	return p
}

// A resync stopped by Close before it reached a stripe whose parity a
// crash had torn must not let Close clear that stripe's write-intent bit
// and record the array clean: the next owner would never resync it, and
// a read degraded later would rebuild the stripe's data from the stale
// parity (raid6-5 seed 8402 of TestModelCrashWithMemberLoss: a hand-off
// during the resync after a crash).
func TestCloseDuringResyncKeepsWriteIntentBits(t *testing.T) {
	for _, level := range []Level{RAID5, RAID6} {
		t.Run(level.String(), func(t *testing.T) {
			rng := rand.New(rand.NewSource(7))
			ms := newMems(5, 768<<10)
			cfg := testCfg(level, nil)
			cfg.Policy = steppedPolicy()
			a := mustCreate(t, devs(ms), cfg)
			g := a.Geometry()
			last := g.Stripes - 1
			if last/a.bm.regionStripes == 0 {
				t.Fatalf("stripe %d is in bitmap region 0: the test needs it in a later region (smaller BitmapRegion)", last)
			}
			// Stripe 0 (region 0, resynced first) and the last stripe,
			// flushed; their write-intent bits stay set until a sweep.
			mustWrite(t, a, 0, randBuf(rng, 4096))
			want := randBuf(rng, int(g.StripeSize))
			mustWrite(t, a, last*g.StripeSize, want)
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			a.Abort()
			// The crash tore the last stripe: its parity lost the write.
			pr := a.parityRole(last, 0)
			if _, err := ms[pr].WriteAt(randBuf(rng, int(g.ChunkSize)), a.moff(last, 0)); err != nil {
				t.Fatal(err)
			}
			// A clean hand-off: Close, and every member keeps what Close
			// wrote (the drives stay up).
			ko := make([]blockdev.Device, len(ms))
			for i, m := range ms {
				ko[i] = keepOpen{m}
			}
			b, _, err := Assemble(ko, AssembleOptions{Policy: steppedPolicy()})
			if err != nil {
				t.Fatal(err)
			}
			b.bg.step(2) // the resync's start and stripe 0 only
			if st := b.Status().Task; st != "resync" {
				t.Fatalf("after two background steps the task is %q, want the resync under way", st)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				if err := m.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			c := mustAssemble(t, ko, AssembleOptions{Policy: quietPolicy(nil)})
			c.WaitIdle()
			if err := c.Check(); err != nil {
				t.Errorf("after a resync stopped by Close and a new assembly: %v", err)
			}
			dr := c.dataRole(last, 0)
			c.FailMember(dr, "test: lost after the hand-off")
			got := mustRead(t, c, last*g.StripeSize, int(g.StripeSize))
			expectEqual(t, "the last stripe read with the member of its chunk 0 failed", got, want)
		})
	}
}

// A superblock written while a member rebuilds (here: another member's
// ReAdd) must record the member's recovery position as of its last
// checkpoint, not how far the rebuild wrote: those writes are not
// flushed, and after a crash the stripes between would be served from
// the member as in sync while a crash dropped what the rebuild wrote
// there (raid6-6 seed 8203 of TestModelCrashWithMemberLoss: a block of
// the rebuilt member read as neither its old nor its new value).
func TestSuperblockDuringRebuildRecordsCheckpointedRecovery(t *testing.T) {
	rng := rand.New(rand.NewSource(8))
	ms := newMems(6, 768<<10)
	cfg := testCfg(RAID6, nil)
	cfg.Policy = steppedPolicy()
	a := mustCreate(t, devs(ms), cfg)
	g := a.Geometry()
	mustWrite(t, a, 0, randBuf(rng, int(a.Size())))
	a.FailMember(1, "test")
	a.FailMember(4, "test")
	want := randBuf(rng, int(8*g.StripeSize))
	mustWrite(t, a, 0, want)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := a.ReAdd(1, ms[1]); err != nil {
		t.Fatal(err)
	}
	a.bg.step(2) // the rebuild's start and its first run of stripes
	rec := a.member(1).recovery.Load()
	if rec == 0 {
		t.Fatalf("member 1's rebuild did not advance in two steps (task %q)", a.Status().Task)
	}
	if err := a.ReAdd(4, ms[4]); err != nil { // writes the superblocks
		t.Fatal(err)
	}
	a.Abort()
	for _, m := range ms {
		m.Crash() // the rebuild's writes were not flushed
	}
	b := mustAssemble(t, devs(ms), AssembleOptions{Policy: quietPolicy(nil)})
	b.WaitIdle()
	got := mustRead(t, b, 0, len(want))
	expectEqual(t, fmt.Sprintf("stripes 0-7 after a crash of member 1's rebuild (at stripe %d, not checkpointed)", rec), got, want)
	if err := b.Check(); err != nil {
		t.Error(err)
	}
}
