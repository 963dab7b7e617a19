package raid

// Regression tests of issue 12 (holes 3, 5 and 7, the RAID engine's part).

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// lateDev is a member whose armed reads complete late: the request is held
// for hold (past the array's member timeout), then fills the caller's
// buffer with 0xEE — what a late C2HData does to the buffer it was given.
type lateDev struct {
	blockdev.Device
	armed atomic.Bool
	at    int64 // the member offset whose read is late
	hold  time.Duration
	done  chan struct{}
	once  sync.Once
}

func (d *lateDev) ReadAt(p []byte, off int64) (int, error) {
	if off != d.at || !d.armed.CompareAndSwap(true, false) {
		return d.Device.ReadAt(p, off)
	}
	time.Sleep(d.hold)
	for i := range p {
		p[i] = 0xEE
	}
	d.once.Do(func() { close(d.done) })
	return len(p), nil
}

// A member request that outlives Policy.IOTimeout must not touch a buffer
// after the array gave it back: the member is failed at the deadline and
// the read completes from the others, but the late completion must land
// in memory that still belongs to the request — not in the caller's
// buffer, and not in a pooled buffer that another request uses by then.
func TestTimedOutMemberNeverTouchesReturnedBuffer(t *testing.T) {
	ev := &events{}
	ms := newMems(3, memSize)
	late := &lateDev{Device: ms[1], hold: 4 * time.Second, done: make(chan struct{})}
	d := devs(ms)
	d[1] = late
	cfg := testCfg(RAID5, ev)
	a := mustCreate(t, d, cfg)
	rng := rand.New(rand.NewSource(3))
	want := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, want)
	// Long enough that a loaded machine does not trip it on the healthy
	// members, well below the late member's hold.
	a.pol.IOTimeout = time.Second
	// Stripe 0's data chunk on member 1.
	var off int64 = -1
	for i := 0; i < a.geo.DataDisks; i++ {
		if a.dataRole(0, i) == 1 {
			off = int64(i) * a.geo.ChunkSize
		}
	}
	// Set before the churn starts: its reads of member 1 read it.
	late.at = a.moff(0, 0)
	// Other requests churn through the pooled buffers meanwhile.
	stop := make(chan struct{})
	var churn sync.WaitGroup
	var churnErr atomic.Value
	churn.Add(1)
	go func() {
		defer churn.Done()
		r := rand.New(rand.NewSource(4))
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := 1 + r.Int63n(a.geo.Stripes-1)
			b := make([]byte, a.geo.StripeSize)
			if _, err := a.ReadAt(b, s*a.geo.StripeSize); err != nil {
				churnErr.Store(err.Error())
				return
			}
			if string(b) != string(want[s*a.geo.StripeSize:(s+1)*a.geo.StripeSize]) {
				churnErr.Store("a concurrent read returned wrong data")
				return
			}
		}
	}()
	late.armed.Store(true)
	buf := make([]byte, a.geo.ChunkSize)
	if _, err := a.ReadAt(buf, off); err != nil {
		t.Fatalf("read with a late member: %v", err)
	}
	select {
	case <-late.done:
	case <-time.After(time.Minute):
		t.Fatal("the late member request was never issued")
	}
	close(stop)
	churn.Wait()
	expectEqual(t, "the caller's buffer after the late member request ended", buf, want[off:off+a.geo.ChunkSize])
	if e, ok := ev.last(MemberFailed); !ok || e.Member != 1 || !strings.Contains(e.Reason, "timeout") {
		t.Errorf("member-failed event %+v, want member 1 failed by its timeout", e)
	}
	if v := churnErr.Load(); v != nil {
		t.Errorf("concurrent reader: %v", v)
	}
	expectEqual(t, "whole array", mustRead(t, a, 0, int(a.Size())), want)
}

// resyncScenario: RAID-5 3+1 over memory, member 1 under delta resync of
// two dirty regions (its rebuild held on the first dirty stripe), then
// member 3 fails.
type resyncScenario struct {
	a          *Array
	ev         *events
	ms         []*blockdev.Mem
	f1         *blockdev.Fault
	model      []byte
	dirtyRegs  []int64
	regionSize int64 // array bytes per region
}

func newResyncScenario(t *testing.T) *resyncScenario {
	ev := &events{}
	ms := newMems(4, 4<<20)
	a := mustCreate(t, devs(ms), testCfg(RAID5, ev))
	rng := rand.New(rand.NewSource(12))
	sc := &resyncScenario{a: a, ev: ev, ms: ms, model: randBuf(rng, int(a.Size()))}
	mustWrite(t, a, 0, sc.model)
	a.Flush()
	a.Sweep()
	a.Sweep()
	if c := a.bm.count(); c != 0 {
		t.Fatalf("%d dirty regions after two sweeps", c)
	}
	if err := a.FailMember(1, "transient loss"); err != nil {
		t.Fatal(err)
	}
	rs := a.bm.regionStripes
	sc.regionSize = rs * a.geo.StripeSize
	nreg := a.geo.Stripes / rs
	sc.dirtyRegs = []int64{1, nreg - 2}
	for _, r := range sc.dirtyRegs {
		b := randBuf(rng, int(a.geo.StripeSize))
		off := r * sc.regionSize
		mustWrite(t, a, off, b)
		copy(sc.model[off:], b)
	}
	sc.f1 = blockdev.NewFault(ms[1])
	// Hold the rebuild on the first dirty region.
	sc.f1.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: a.moff(sc.dirtyRegs[0]*rs, 0), Len: rs * a.geo.ChunkSize, Action: blockdev.Delay, Delay: time.Hour})
	t.Cleanup(sc.f1.ClearRules)
	if err := a.ReAdd(1, sc.f1); err != nil {
		t.Fatal(err)
	}
	if err := a.FailMember(3, "second fault during the resync"); err != nil && !errors.Is(err, ErrTooManyFailed) {
		t.Fatal(err)
	}
	return sc
}

// Hole 5 (a): a member under delta resync is present outside its dirty
// regions: with another member failed, the clean regions stay readable
// and writable.
func TestResyncingMemberServesCleanRegions(t *testing.T) {
	sc := newResyncScenario(t)
	a := sc.a
	dirty := func(off int64) bool {
		for _, r := range sc.dirtyRegs {
			if off/sc.regionSize == r {
				return true
			}
		}
		return false
	}
	for off := int64(0); off < a.Size(); off += sc.regionSize {
		if dirty(off) {
			continue
		}
		b := make([]byte, min(sc.regionSize, a.Size()-off))
		if _, err := a.ReadAt(b, off); err != nil {
			t.Fatalf("read of clean region at %d with member 1 resyncing and member 3 failed: %v", off, err)
		}
		expectEqual(t, "clean region", b, sc.model[off:off+int64(len(b))])
	}
	// Writes to clean regions are acknowledged and read back.
	off := sc.regionSize * 3
	w := randBuf(rand.New(rand.NewSource(1)), 3*4096)
	mustWrite(t, a, off, w)
	copy(sc.model[off:], w)
	expectEqual(t, "written clean region", mustRead(t, a, off, len(w)), w)
	st := a.Status()
	if st.State != "degraded" || st.Unavailable == 0 || !strings.Contains(st.Reason, "stripes lack data") {
		t.Fatalf("status %q (%q), %d stripes unavailable; want degraded with unavailable stripes (one member failed, one resyncing)", st.State, st.Reason, st.Unavailable)
	}
	if e, ok := sc.ev.last(StripesUnavailable); !ok || e.Count != st.Unavailable || e.Member != 3 {
		t.Errorf("stripes-unavailable event %+v, want member 3 and %d stripes", e, st.Unavailable)
	}
	if sc.ev.count(ArrayFailed) != 0 {
		t.Errorf("array-failed event for an array that lost one member")
	}
	// A dirty stripe not yet resynced lacks member 1's chunk and
	// member 3's: its I/O fails, precisely. (The last one: the rebuild
	// may be holding the first one's lock, its write held.)
	lost := int64(-1)
	for s := a.geo.Stripes - 1; s >= 0; s-- {
		if a.stripeLost(s) {
			lost = s
			break
		}
	}
	if lost < 0 {
		t.Fatal("no stripe lacks data")
	}
	b := make([]byte, a.geo.StripeSize)
	_, err := a.ReadAt(b, lost*a.geo.StripeSize)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, blockdev.ErrIO) || errors.Is(err, ErrTooManyFailed) {
		t.Fatalf("read of lost stripe %d: %v; want ErrUnavailable and blockdev.ErrIO, not ErrTooManyFailed", lost, err)
	}
	for _, want := range []string{fmt.Sprintf("stripe %d", lost), "member 1 (delta resync", "member 3 (failed: second fault"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := a.WriteAt(b, lost*a.geo.StripeSize); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write of lost stripe %d: %v, want ErrUnavailable", lost, err)
	}
	// Member 3 returns: it missed only what was written while it was
	// away, so member 1's resync can go on and no data is lost.
	sc.f1.ClearRules()
	if err := a.ReAdd(3, sc.ms[3]); err != nil {
		t.Fatalf("re-add of member 3: %v", err)
	}
	a.WaitIdle()
	if st := a.Status(); st.State != "optimal" || st.Unavailable != 0 {
		t.Fatalf("after member 3 returned: %q (%q), %d unavailable", st.State, st.Reason, st.Unavailable)
	}
	expectEqual(t, "every acknowledged write after both members are back", mustRead(t, a, 0, int(a.Size())), sc.model)
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
	// The members carry the data: lose member 0.
	a.FailMember(0, "after recovery")
	expectEqual(t, "degraded after recovery", mustRead(t, a, 0, int(a.Size())), sc.model)
}

// Hole 5 (b, c): an array that really lost two members of a RAID-5 fails;
// once the members return, a re-Assemble takes back the member that failed
// with the array (its data is current) and the stale one comes back by
// ReAdd: every acknowledged write is there.
func TestDoubleFaultFailsThenReassembles(t *testing.T) {
	ev := &events{}
	ms := newMems(4, 4<<20)
	fs := make([]*blockdev.Fault, 4)
	for i := range fs {
		fs[i] = blockdev.NewFault(ms[i])
	}
	cfg := testCfg(RAID5, ev)
	cfg.Epoch = 7
	a, err := Create(devs(fs), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(21))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	a.Flush()
	a.Sweep()
	a.Sweep()
	// Member 1 dies; writes go on degraded and are acknowledged.
	fs[1].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail})
	for i := 0; i < 40; i++ {
		n := (1 + rng.Intn(24)) * 512
		off := int64(rng.Intn(int(a.Size())-n)) / 512 * 512
		b := randBuf(rng, n)
		mustWrite(t, a, off, b)
		copy(model[off:], b)
	}
	// Member 3 dies too: beyond RAID-5's redundancy.
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail})
	b := make([]byte, a.Size())
	if _, err := a.ReadAt(b, 0); !errors.Is(err, ErrTooManyFailed) || !errors.Is(err, blockdev.ErrIO) {
		t.Fatalf("read after losing members 1 and 3: %v, want ErrTooManyFailed and blockdev.ErrIO", err)
	}
	st := a.Status()
	if st.State != "failed" {
		t.Fatalf("status %q, want failed", st.State)
	}
	if ev.count(ArrayFailed) != 1 {
		t.Fatalf("%d array-failed events, want 1", ev.count(ArrayFailed))
	}
	e, _ := ev.last(ArrayFailed)
	_, err = a.ReadAt(b[:512], 0)
	for what, text := range map[string]string{"status reason": st.Reason, "array-failed event": e.Reason, "read error": err.Error()} {
		for _, want := range []string{"members 1 (", "and 3 (", "2 of 4", "raid5 tolerates 1", "injected fault"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s %q does not say %q", what, text, want)
			}
		}
	}
	if !st.Members[3].WithArray || st.Members[1].WithArray {
		t.Errorf("members %+v: want member 3 (and not 1) failed with the array", st.Members)
	}
	if err := a.ReAdd(3, fs[3]); !errors.Is(err, ErrTooManyFailed) || !strings.Contains(err.Error(), "re-assemble") {
		t.Errorf("ReAdd on a failed array: %v, want a refusal that says to re-assemble", err)
	}
	// The members come back (a frozen node thawed, a cable replugged).
	fs[1].ClearRules()
	fs[3].ClearRules()
	a.Abort()
	b2, rej, err := Assemble(devs(fs), AssembleOptions{UUID: a.UUID(), Epoch: 8, Policy: quietPolicy(ev)})
	if err != nil {
		t.Fatalf("re-assemble after both members returned: %v", err)
	}
	checked(t, b2)
	if len(rej) != 1 || rej[0].Role != 1 || !errors.Is(rej[0].Err, ErrStale) {
		t.Fatalf("rejections %+v, want only role 1 as stale", rej)
	}
	if err := b2.ReAdd(1, fs[1]); err != nil {
		t.Fatalf("re-add of the stale member: %v", err)
	}
	b2.WaitIdle()
	if st := b2.Status(); st.State != "optimal" {
		t.Fatalf("after re-assemble and re-add: %q", st.State)
	}
	expectEqual(t, "every acknowledged write after the double fault", mustRead(t, b2, 0, int(b2.Size())), model)
	// The re-added member carries the data: lose another one.
	b2.FailMember(0, "after recovery")
	expectEqual(t, "degraded after recovery", mustRead(t, b2, 0, int(b2.Size())), model)
}

// With a member under resync present, a write whose stripe loses a second
// chunk mid-update must not be acknowledged (the data would live nowhere).
func TestWriteLosingStripeMidUpdateIsNotAcknowledged(t *testing.T) {
	ev := &events{}
	ms := newMems(4, 4<<20)
	fs := make([]*blockdev.Fault, 4)
	for i := range fs {
		fs[i] = blockdev.NewFault(ms[i])
	}
	a := mustCreate(t, devs(fs), testCfg(RAID5, ev))
	rng := rand.New(rand.NewSource(31))
	mustWrite(t, a, 0, randBuf(rng, int(a.Size())))
	if err := a.FailMember(1, "transient loss"); err != nil {
		t.Fatal(err)
	}
	s0, s := int64(2), int64(40)
	for _, x := range []int64{s0, s} {
		mustWrite(t, a, x*a.geo.StripeSize, randBuf(rng, int(a.geo.StripeSize)))
	}
	// Member 1 comes back; its rebuild is held on stripe s0, so stripe s
	// is not yet resynced.
	fs[1].ClearRules()
	fs[1].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: a.moff(s0, 0), Len: a.geo.ChunkSize, Action: blockdev.Delay, Delay: time.Hour})
	t.Cleanup(fs[1].ClearRules)
	if err := a.ReAdd(1, fs[1]); err != nil {
		t.Fatal(err)
	}
	// Member 3 fails the data write of the next update of stripe s.
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: a.moff(s, 0), Len: a.geo.ChunkSize, Action: blockdev.Fail})
	_, err := a.WriteAt(randBuf(rng, int(a.geo.StripeSize)), s*a.geo.StripeSize)
	if err == nil {
		t.Fatal("a write to a stripe that lost member 3's chunk while member 1 is not yet resynced there was acknowledged")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write: %v, want ErrUnavailable", err)
	}
	if st := a.Status(); st.State != "degraded" {
		t.Fatalf("status %q, want degraded", st.State)
	}
}
