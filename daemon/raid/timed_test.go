package raid

import (
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// lateMergedDev is a member whose first merged read (longer than one
// chunk) once armed completes late: it is held for hold, then fills the
// buffer it was given with 0xEE, as a late C2HData would.
type lateMergedDev struct {
	blockdev.Device
	chunk int
	armed atomic.Bool
	hold  time.Duration
	done  chan struct{}
	once  sync.Once
}

func (d *lateMergedDev) ReadAt(p []byte, off int64) (int, error) {
	if len(p) <= d.chunk || !d.armed.CompareAndSwap(true, false) {
		return d.Device.ReadAt(p, off)
	}
	time.Sleep(d.hold)
	for i := range p {
		p[i] = 0xEE
	}
	d.once.Do(func() { close(d.done) })
	return len(p), nil
}

// A merged member read with an IOTimeout runs on the timed request's own
// buffer, which is scattered to the caller's chunks only after it
// returned: abandoned at the deadline, its late completion lands in that
// buffer, never in the caller's (the late-buffer rule, memberio.go), and
// the read completes from the other members.
func TestLateMergedReadNeverTouchesCallerBuffer(t *testing.T) {
	ev := &events{}
	ms := newMems(3, memSize)
	cfg := testCfg(RAID5, ev)
	// Drives, so that a member's contiguous chunks are merged.
	d := make([]blockdev.Device, len(ms))
	for i, m := range ms {
		d[i] = &countingDev{Device: m, drive: true}
	}
	late := &lateMergedDev{Device: d[1], chunk: int(cfg.ChunkSize), hold: 3 * time.Second, done: make(chan struct{})}
	d[1] = late
	a := mustCreate(t, d, cfg)
	want := randBuf(rand.New(rand.NewSource(5)), int(a.Size()))
	mustWrite(t, a, 0, want)
	// Long enough that a loaded machine does not trip it on the healthy
	// members, well below the late member's hold.
	a.pol.IOTimeout = time.Second
	n := 8 * a.geo.StripeSize
	buf := make([]byte, n)
	late.armed.Store(true)
	if _, err := a.ReadAt(buf, 0); err != nil {
		t.Fatalf("read of 8 stripes with a late member: %v", err)
	}
	select {
	case <-late.done:
	case <-time.After(time.Minute):
		t.Fatal("no merged read of member 1 was issued (the member's chunks were not merged)")
	}
	expectEqual(t, "the caller's buffer after the late merged read ended", buf, want[:n])
	if e, ok := ev.last(MemberFailed); !ok || e.Member != 1 || !strings.Contains(e.Reason, "timeout") {
		t.Errorf("member-failed event %+v, want member 1 failed by its timeout", e)
	}
	expectEqual(t, "whole array", mustRead(t, a, 0, int(a.Size())), want)
}

// A batch of timed requests (runTimed: an IOTimeout and no SlowWrite)
// retries a failed request as callBuf does, Policy.Retries times: a
// batch of reads of every member, each failing once, completes with the
// members' data and fails no member.
func TestTimedBatchRetries(t *testing.T) {
	ev := &events{}
	ms := newMems(3, memSize)
	fs := make([]*blockdev.Fault, len(ms))
	d := make([]blockdev.Device, len(ms))
	for i, m := range ms {
		fs[i] = blockdev.NewFault(m)
		d[i] = fs[i]
	}
	cfg := testCfg(RAID5, ev)
	cfg.Retries = 1
	cfg.Policy.IOTimeout = 5 * time.Second
	a := mustCreate(t, d, cfg)
	want := randBuf(rand.New(rand.NewSource(9)), int(a.Size()))
	mustWrite(t, a, 0, want)
	g := a.Geometry()
	off := a.moff(0, 0)
	ops := make([]mop, len(ms))
	for r := range ops {
		ops[r] = mop{m: a.member(r), buf: make([]byte, g.ChunkSize), off: off}
		fs[r].AddRule(blockdev.Rule{Op: blockdev.OpRead, Off: off, Len: g.ChunkSize, Action: blockdev.Fail, Count: 1})
	}
	if !a.timedBatchOK(ops) {
		t.Fatal("a batch of 3 reads with an IOTimeout does not take runTimed")
	}
	if err := a.run(ops); err != nil {
		t.Fatalf("a batch of reads, each failing once, with Retries 1: %v", err)
	}
	for r, o := range ops {
		if f := fs[r].Fired(); f != 1 {
			t.Errorf("member %d: its fault fired %d times, want 1", r, f)
		}
		exp := make([]byte, g.ChunkSize)
		if _, err := ms[r].ReadAt(exp, off); err != nil {
			t.Fatal(err)
		}
		expectEqual(t, fmt.Sprintf("member %d's chunk read by the batch", r), o.buf, exp)
	}
	if n := ev.count(MemberFailed); n != 0 {
		t.Fatalf("%d members failed for one transient read error each with Retries 1, want none", n)
	}
}
