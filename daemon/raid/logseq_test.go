package raid

import (
	"errors"
	"math/rand"
	"strings"
	"testing"

	"tier0/daemon/blockdev"
)

// A member away at one assembly holds log entries whose sequence numbers
// the array then issues again; taken back at the next assembly, its old
// entry must not be replayed as (or merged into) the new one. The
// simulation's seed 133638 (docs/RELIABILITY.md known problem 9): owner
// A's backend cut failed the array with no superblock written, A
// re-assembled it without D1, whose log held entries 20 and 21 of the
// first run, and logged its own entry 20 on E1; A died, B assembled all
// three and its replay merged D1's old entry 20 (another stripe's partial
// parity) into E1's: the parity it wrote made D1's resync put unit 8's
// block at unit 4.
//
// Here, RAID-5 over three members (stripe 0's parity on role 2, stripe
// 1's on role 1): the first run logs a write to stripe 1, then one to
// stripe 0 (seq n on role 2) and fails with every member unreachable; it
// is re-assembled without role 2 and logs a write to stripe 1 (seq n
// again, on role 1) and crashes; the third assembly takes role 2 back
// under a resync. The replay reads the members in role order (serial), so
// role 1's new entry comes first and role 2's old one last.
func TestStaleLogOfMemberTakenBackAtAssembly(t *testing.T) {
	sc := reusedLogSeq(t)
	c := mustAssemble(t, devs(sc.fs), AssembleOptions{UUID: sc.uuid, Epoch: 3, Policy: sc.pol})
	if st := c.Status(); st.Members[2].State != "rebuilding" {
		t.Fatalf("role 2 at the third assembly: %+v, want rebuilding (it was away)", st.Members[2])
	}
	c.WaitIdle()
	expectEqual(t, "data after the third assembly and role 2's resync", mustRead(t, c, 0, int(c.Size())), sc.model)
	// Role 2 really holds stripe 1's chunk again: read it without role 1.
	if err := c.FailMember(1, "test"); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "degraded read without role 1", mustRead(t, c, 0, int(c.Size())), sc.model)
}

// Two different writes logged under one sequence number on members the
// assembly takes as current (here role 2's old entry copied onto role 0,
// as a member that kept the log of an earlier run would hold it): the
// replay refuses rather than merge them into wrong parity.
func TestReplayRefusesOneSeqForTwoWrites(t *testing.T) {
	sc := reusedLogSeq(t)
	j := sc.jl
	n := j.slotOff(j.slots) - j.slotOff(0)
	log := make([]byte, n)
	if _, err := sc.ms[2].ReadAt(log, j.slotOff(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ms[0].WriteAt(log, j.slotOff(0)); err != nil {
		t.Fatal(err)
	}
	_, _, err := Assemble(devs(sc.fs), AssembleOptions{UUID: sc.uuid, Epoch: 3, Policy: sc.pol})
	if !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "one sequence number for two writes") {
		t.Fatalf("assembly with one log sequence number on two writes: %v, want ErrStale naming both", err)
	}
	t.Logf("refused: %v", err)
}

type reusedSeq struct {
	ms    []*blockdev.Mem
	fs    []*blockdev.Fault
	uuid  [16]byte
	pol   Policy
	model []byte
	jl    *journal // the first run's, for its log geometry
}

// reusedLogSeq runs the first two runs of TestStaleLogOfMemberTakenBackAtAssembly:
// afterwards role 2's log holds the first run's entry n for stripe 0, and
// role 1's the second run's entry n for stripe 1, live (a crash).
func reusedLogSeq(t *testing.T) reusedSeq {
	t.Helper()
	ms := newMems(3, 1<<20)
	fs := faults(ms)
	cfg := testCfg(RAID5, nil)
	cfg.Policy.replay = &replayKnobs{serial: true}
	cfg.Epoch = 1
	a, err := Create(devs(fs), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p0, p1 := a.parityRole(0, 0), a.parityRole(1, 0); p0 != 2 || p1 != 1 {
		t.Fatalf("parity of stripes 0 and 1 on roles %d and %d, the test needs 2 and 1", p0, p1)
	}
	rng := rand.New(rand.NewSource(133638))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	ss := a.Geometry().StripeSize
	// A 4 KiB write at the start of a stripe's first data chunk: a
	// logged partial-stripe write, rows 0-4096.
	write := func(a *Array, s int64) {
		b := randBuf(rng, 4096)
		mustWrite(t, a, s*ss, b)
		copy(model[s*ss:], b)
	}
	write(a, 1)
	write(a, 0) // logged on role 2 only
	seq := a.jl.nextSeq - 1
	// The owner's backend cut: no member answers, so the failure
	// reaches no superblock (the last ones say every member active and
	// hold a log sequence below seq).
	for _, f := range fs {
		f.AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrNoPath})
	}
	if _, err := a.ReadAt(make([]byte, 4096), chunkOn(a, 1)); err == nil {
		t.Fatal("a read with every member cut off succeeded")
	}
	a.Abort()
	for _, f := range fs {
		f.ClearRules()
	}

	// Re-assembled without role 2 (still cut off): its entry is unseen.
	d := devs(fs)
	d[2] = nil
	b, _, err := Assemble(d, AssembleOptions{UUID: a.UUID(), Epoch: 2, Policy: cfg.Policy})
	if err != nil {
		t.Fatalf("assembly without role 2: %v", err)
	}
	write(b, 1) // logged on role 1
	if got := b.jl.nextSeq - 1; got != seq {
		t.Fatalf("the second run logged its write as seq %d, the first run's last entry (on role 2) is %d: the test needs them equal", got, seq)
	}
	b.Abort() // a crash: the entry is live
	return reusedSeq{ms: ms, fs: fs, uuid: a.UUID(), pol: cfg.Policy, model: model, jl: a.jl}
}
