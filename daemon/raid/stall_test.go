package raid

import (
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

func TestStallWatcher(t *testing.T) {
	w := newStallWatcher(50*time.Millisecond, 500*time.Millisecond)
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	for _, at := range []int64{0, 50, 100, 150} {
		w.observe(ms(at))
	}
	if w.stalledAt(ms(10), ms(160)) {
		t.Error("regular ticks read as a stall")
	}
	if !w.stalledAt(ms(10), ms(900)) {
		t.Error("a tick 750 ms overdue (the watcher has not run since the process resumed) is not a stall")
	}
	w.observe(ms(2150)) // 2 s without a tick: the process was stopped
	if !w.stalledAt(ms(1000), ms(2160)) {
		t.Error("a request that began before a 2 s stall does not see it")
	}
	if w.stalledAt(ms(2200), ms(2210)) {
		t.Error("a request that began after the stall sees it")
	}
}

// fakeStalls reports a stall of the process to every deadline.
type fakeStalls struct{ asked atomic.Int32 }

func (f *fakeStalls) now() int64              { return 0 }
func (f *fakeStalls) stalledSince(int64) bool { f.asked.Add(1); return true }

// TestMemberDeadlineDuringProcessStall: a member request whose deadline
// passed while the process itself was stopped (SIGSTOP of the owner, found
// by the nemesis: on SIGCONT the owner failed two healthy members at once
// and its array stayed offline) is given one more I/O timeout; a member
// that answers within it is not failed. A member that stays hung still
// fails.
func TestMemberDeadlineDuringProcessStall(t *testing.T) {
	fs := &fakeStalls{}
	old := stalls
	stalls = fs
	t.Cleanup(func() { stalls = old })
	ev := &events{}
	ms := newMems(3, memSize)
	f := blockdev.NewFault(ms[2])
	d := devs(ms)
	d[2] = f
	cfg := testCfg(RAID5, ev)
	cfg.IOTimeout = time.Second
	a := mustCreate(t, d, cfg)
	want := make([]byte, a.Size())
	mustWrite(t, a, 0, want)

	// Slower than one timeout, faster than two: a member that answers
	// late only because the process was stopped.
	f.AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Delay, Delay: 1400 * time.Millisecond})
	expectEqual(t, "read through a process stall", mustRead(t, a, 0, 64<<10), want[:64<<10])
	f.ClearRules()
	if n := ev.count(MemberFailed); n != 0 {
		e, _ := ev.last(MemberFailed)
		t.Fatalf("%d member-failed events (last %+v) for a member whose deadline fell in a stall of the process", n, e)
	}
	if fs.asked.Load() == 0 {
		t.Fatal("the deadline never asked whether the process had stalled")
	}
	// A member that stays hung fails at the extended deadline.
	f.AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Delay, Delay: time.Minute})
	t.Cleanup(f.ClearRules)
	expectEqual(t, "read with a hung member", mustRead(t, a, 0, 64<<10), want[:64<<10])
	if e, ok := ev.last(MemberFailed); !ok || e.Member != 2 {
		t.Fatalf("member-failed event %+v, %v: want member 2 failed at the extended deadline", e, ok)
	}
}
