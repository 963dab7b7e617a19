package raid

import (
	"errors"
	"math/rand"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// hangDev is a member that stops answering without its connection
// failing (a partition, a hung node): while hung is set, its writes and
// flushes (and, with reads, its reads) block until release is closed;
// a blocked write lands on the device only when it is released, as a
// command held in a queue would.
type hangDev struct {
	blockdev.Device
	hung    atomic.Bool
	reads   bool
	release chan struct{}
	once    sync.Once
	blocked atomic.Int64 // requests that blocked
	ended   atomic.Int64 // blocked requests that ended
}

func newHangDev(d blockdev.Device) *hangDev {
	return &hangDev{Device: d, release: make(chan struct{})}
}

func (d *hangDev) hold() bool {
	if !d.hung.Load() {
		return false
	}
	d.blocked.Add(1)
	<-d.release
	return true
}

func (d *hangDev) WriteAt(p []byte, off int64) (int, error) {
	if d.hold() {
		defer d.ended.Add(1)
	}
	return d.Device.WriteAt(p, off)
}

func (d *hangDev) Flush() error {
	if d.hold() {
		defer d.ended.Add(1)
	}
	return d.Device.Flush()
}

func (d *hangDev) ReadAt(p []byte, off int64) (int, error) {
	if d.reads && d.hold() {
		defer d.ended.Add(1)
	}
	return d.Device.ReadAt(p, off)
}

// unhang releases the member and waits until every blocked request of
// it has ended (landed on the device).
func (d *hangDev) unhang(t *testing.T) {
	t.Helper()
	d.hung.Store(false)
	d.once.Do(func() { close(d.release) })
	for i := 0; d.ended.Load() < d.blocked.Load(); i++ {
		if i > 3000 {
			t.Fatalf("the released member's %d blocked requests did not all end within 30 s (%d did)", d.blocked.Load(), d.ended.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// hangInfo, when set, describes the array for within's failure.
var hangInfo func() string

// within runs f in a goroutine and fails the test when it has not
// returned after 30 s.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
		if hangInfo != nil {
			t.Logf("%s", hangInfo())
		}
		t.Fatalf("%s: still waiting on the hung member after 30 s (want it written around after Policy.SlowWrite, the member missing)", what)
		return nil
	}
}

// memCopies returns fresh memory devices holding what ms hold now.
func memCopies(ms []*blockdev.Mem) []blockdev.Device {
	out := make([]blockdev.Device, len(ms))
	for i, m := range ms {
		c := blockdev.NewMem(m.Size(), m.BlockSize())
		if _, err := c.WriteAt(m.Snapshot(), 0); err != nil {
			panic(err)
		}
		if err := c.Flush(); err != nil {
			panic(err)
		}
		out[i] = c
	}
	return out
}

// verifyEachDegraded assembles copies of ms with each member left out in
// turn and checks that every byte reads back as model.
func verifyEachDegraded(t *testing.T, ms []*blockdev.Mem, model []byte) {
	t.Helper()
	for r := range ms {
		ds := memCopies(ms)
		ds = append(ds[:r:r], ds[r+1:]...)
		b, _, err := Assemble(ds, AssembleOptions{Policy: quietPolicy(nil)})
		if err != nil {
			t.Fatalf("assemble without member %d: %v", r, err)
		}
		got := make([]byte, len(model))
		if _, err := b.ReadAt(got, 0); err != nil {
			t.Fatalf("read with member %d left out: %v", r, err)
		}
		b.Abort()
		expectEqual(t, "array read with member "+string(rune('0'+r))+" left out", got, model)
	}
}

// reAddAndVerify takes member role back (what names the re-add in a
// failure), waits for its resync, checks every stripe's parity, reads the
// array back against model, closes it and reads it with each member
// failed in turn.
func reAddAndVerify(t *testing.T, a *Array, ms []*blockdev.Mem, hd *hangDev, role int, what string, model []byte) {
	t.Helper()
	if err := a.ReAdd(role, hd); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	a.WaitIdle()
	if err := a.Check(); err != nil {
		t.Fatalf("parity check after the resync: %v", err)
	}
	expectEqual(t, "read after the resync", mustRead(t, a, 0, len(model)), model)
	a.Close()
	verifyEachDegraded(t, ms, model)
}

// slowWriteArray is a RAID-5 of 4 memory members, member hung wrapped
// in a hangDev, IOTimeout 1 h and SlowWrite 20 ms unless the test
// changes them, holding 8 stripes of flushed random data (returned).
func slowWriteArray(t *testing.T, ev *events, hung int, tune ...func(*Config)) (*Array, []*blockdev.Mem, *hangDev, []byte) {
	t.Helper()
	ms := newMems(4, 4<<20)
	hd := newHangDev(ms[hung])
	ds := devs(ms)
	ds[hung] = hd
	cfg := testCfg(RAID5, ev)
	cfg.IOTimeout = time.Hour
	cfg.SlowWrite = 20 * time.Millisecond
	for _, f := range tune {
		f(&cfg)
	}
	a, err := Create(ds, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !a.stopped.Load() {
			a.Close()
		}
	})
	t.Cleanup(func() { hd.unhang(t) }) // first: Close flushes the member
	model := randBuf(rand.New(rand.NewSource(15)), int(8*a.Geometry().StripeSize))
	mustWrite(t, a, 0, model)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	return a, ms, hd, model
}

// Issue 15: a member that stops answering without its connection failing
// must not stall writes until member_io_timeout. With Policy.SlowWrite a
// write to it that has not completed by the deadline is abandoned (its
// request keeps its buffer until it ends) and the member is made
// missing, as a timeout makes it; the write completes degraded. Taken
// back once it answers, the member holds every acknowledged write.
func TestSlowWriteMakesHungMemberMissing(t *testing.T) {
	ev := &events{}
	a, ms, hd, model := slowWriteArray(t, ev, 1)
	geo := a.Geometry()
	off := chunkOn(a, 1) + 4096 // a 4 KiB write of a data chunk on member 1
	hd.hung.Store(true)
	small := randBuf(rand.New(rand.NewSource(16)), 4096)
	if err := within(t, "4 KiB write of a chunk on the hung member 1", func() error {
		_, err := a.WriteAt(small, off)
		return err
	}); err != nil {
		t.Fatalf("4 KiB write with member 1 hung: %v", err)
	}
	copy(model[off:], small)
	if hd.blocked.Load() == 0 {
		t.Fatal("the hung member was never asked: the test did not exercise a hung write")
	}
	st := a.Status()
	if st.Members[1].State != "missing" || !strings.Contains(st.Members[1].Reason, "slow write") {
		t.Fatalf("member 1 after its write hung: %+v, want missing (slow write)", st.Members[1])
	}
	// A full-stripe write and a multi-stripe one, now degraded.
	full := randBuf(rand.New(rand.NewSource(17)), int(3*geo.StripeSize))
	if err := within(t, "full-stripe write with member 1 hung", func() error {
		_, err := a.WriteAt(full, 2*geo.StripeSize)
		return err
	}); err != nil {
		t.Fatalf("full-stripe write with member 1 hung: %v", err)
	}
	copy(model[2*geo.StripeSize:], full)
	expectEqual(t, "degraded read", mustRead(t, a, 0, len(model)), model)

	// The member answers again (its abandoned requests land now) and is
	// taken back through a resync.
	hd.unhang(t)
	// The abandoned write kept its own buffer until it ended: what
	// landed is the write's data, not a later user's of that buffer.
	landed := make([]byte, 4096)
	if _, err := hd.Device.ReadAt(landed, a.moff(off/geo.StripeSize, off%geo.ChunkSize)); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "the abandoned write as it landed on member 1", landed, small)
	if err := a.ReAdd(1, hd); err != nil {
		t.Fatalf("re-add of member 1 after it answered: %v", err)
	}
	a.WaitIdle()
	if st := a.Status(); st.State != "optimal" {
		t.Fatalf("state %q (%s) after the re-added member's resync, want optimal", st.State, st.Reason)
	}
	if err := a.Check(); err != nil {
		t.Fatalf("parity check after the resync: %v", err)
	}
	expectEqual(t, "read after the resync", mustRead(t, a, 0, len(model)), model)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	verifyEachDegraded(t, ms, model)
}

// A full-stripe write to an optimal array (one merged request per
// member) is written around the hung member in the same way.
func TestSlowWriteFullStripeBatchAroundHungMember(t *testing.T) {
	a, ms, hd, model := slowWriteArray(t, nil, 2)
	geo := a.Geometry()
	hd.hung.Store(true)
	full := randBuf(rand.New(rand.NewSource(18)), int(4*geo.StripeSize))
	if err := within(t, "full-stripe batch write with member 2 hung", func() error {
		_, err := a.WriteAt(full, 4*geo.StripeSize)
		return err
	}); err != nil {
		t.Fatalf("full-stripe batch write with member 2 hung: %v", err)
	}
	copy(model[4*geo.StripeSize:], full)
	if st := a.Status(); st.Members[2].State != "missing" {
		t.Fatalf("member 2 after its write hung: %+v, want missing", st.Members[2])
	}
	hd.unhang(t)
	reAddAndVerify(t, a, ms, hd, 2, "re-add of member 2", model)
}

// A member that hangs on reads too: a partial write's read-modify-write
// reads of it are written around as well.
func TestSlowWriteReadModifyWriteAroundHungMember(t *testing.T) {
	a, ms, hd, model := slowWriteArray(t, nil, 1)
	hd.reads = true
	hd.hung.Store(true)
	off := chunkOn(a, 1)
	small := randBuf(rand.New(rand.NewSource(19)), 4096)
	if err := within(t, "4 KiB write with member 1 hung on reads and writes", func() error {
		_, err := a.WriteAt(small, off)
		return err
	}); err != nil {
		t.Fatalf("4 KiB write with member 1 hung: %v", err)
	}
	copy(model[off:], small)
	if st := a.Status(); st.Members[1].State != "missing" {
		t.Fatalf("member 1 after it hung: %+v, want missing", st.Members[1])
	}
	expectEqual(t, "degraded read", mustRead(t, a, 0, len(model)), model)
	hd.unhang(t)
	if err := a.ReAdd(1, hd); err != nil {
		t.Fatalf("re-add of member 1: %v", err)
	}
	a.WaitIdle()
	if err := a.Check(); err != nil {
		t.Fatalf("parity check after the resync: %v", err)
	}
	a.Close()
	verifyEachDegraded(t, ms, model)
}

// With a member already missing, RAID-5 cannot lose a second one: a hung
// write is not written around, it waits for its member (up to
// IOTimeout), and the array does not fail.
func TestSlowWriteNotHedgedWhenDegraded(t *testing.T) {
	a, _, hd, model := slowWriteArray(t, nil, 1)
	if err := a.FailMember(3, "test: member 3 gone"); err != nil {
		t.Fatal(err)
	}
	hd.hung.Store(true)
	off := chunkOn(a, 1)
	small := randBuf(rand.New(rand.NewSource(20)), 4096)
	done := make(chan error, 1)
	go func() {
		_, err := a.WriteAt(small, off)
		done <- err
	}()
	for i := 0; hd.blocked.Load() == 0; i++ {
		if i > 3000 {
			t.Fatal("the write never reached the hung member 1")
		}
		time.Sleep(time.Millisecond)
	}
	// Well past the 20 ms deadline; a shorter wait could only let the
	// old code pass, not this one fail.
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the write returned (%v) while member 1 was hung with member 3 missing: it was written around the last redundancy", err)
	default:
	}
	hd.unhang(t)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write once member 1 answered: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the write still waits 30 s after member 1 answered")
	}
	copy(model[off:], small)
	st := a.Status()
	if st.State != "degraded" || st.Members[1].State != "active" {
		t.Fatalf("after the slow write with member 3 missing: state %q (%s), member 1 %+v; want degraded, member 1 active", st.State, st.Reason, st.Members[1])
	}
	expectEqual(t, "read", mustRead(t, a, 0, len(model)), model)
}

// A write abandoned at a deadline (a timeout, or SlowWrite) that lands
// on its member after the member was taken back and resynced would put
// old data under newer acknowledged writes. A re-add must wait until the
// member's abandoned requests have ended, and refuse while they run.
//
// This is the timeout path (IOTimeout, no SlowWrite); SlowWrite abandons
// requests the same way.
func TestLateWriteNeverLandsAfterReAdd(t *testing.T) {
	a, ms, hd, model := slowWriteArray(t, nil, 1, func(c *Config) {
		c.IOTimeout = 100 * time.Millisecond
		c.SlowWrite = 0
	})
	off := chunkOn(a, 1)
	old := randBuf(rand.New(rand.NewSource(21)), 4096)
	hd.hung.Store(true)
	if err := within(t, "write with member 1 hung (IOTimeout 100 ms)", func() error {
		_, err := a.WriteAt(old, off)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A newer write of the same bytes, acknowledged degraded.
	newer := randBuf(rand.New(rand.NewSource(22)), 4096)
	mustWrite(t, a, off, newer)
	copy(model[off:], newer)
	// Member 1 looks reachable again (its old requests still queued).
	hd.hung.Store(false)
	err := a.ReAdd(1, hd)
	if err == nil {
		a.WaitIdle()
	}
	// Its old write lands now.
	hd.unhang(t)
	if err == nil {
		got := make([]byte, 4096)
		if _, rerr := hd.Device.ReadAt(got, a.moff(off/a.geo.StripeSize, off%a.geo.ChunkSize)); rerr == nil && string(got) == string(old) {
			t.Fatalf("re-add of member 1 with an abandoned write in flight was accepted, and the late write landed after the resync: member 1 holds the old data under a newer acknowledged write")
		}
		t.Fatalf("re-add of member 1 with an abandoned write in flight was accepted: its late completion may land after the resync")
	}
	if !errors.Is(err, ErrInFlight) {
		t.Fatalf("re-add with requests in flight: %v, want ErrInFlight", err)
	}
	reAddAndVerify(t, a, ms, hd, 1, "re-add once the member's requests ended", model)
}

// Once a slow request has made its member missing, the requests that
// writes planned before still send it are not sent (each would wait its
// own slow deadline on the hung member): a partial write of a stripe
// whose parity is on the hung member (its log entry goes there first,
// then its parity) waits one deadline, not two.
func TestSlowWriteOneDeadlinePerMember(t *testing.T) {
	a, _, hd, model := slowWriteArray(t, nil, 1)
	s := int64(0)
	for a.parityRole(s, 0) != 1 {
		s++
	}
	off := s * a.geo.StripeSize
	small := randBuf(rand.New(rand.NewSource(23)), 4096)
	hd.hung.Store(true)
	if err := within(t, "write of a stripe whose parity is on the hung member 1", func() error {
		_, err := a.WriteAt(small, off)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], small)
	if st := a.Status(); st.Members[1].State != "missing" {
		t.Fatalf("member 1 after its write hung: %+v, want missing", st.Members[1])
	}
	if n := hd.blocked.Load(); n != 1 {
		t.Errorf("%d requests sent to the hung member 1, want 1: requests sent to it after it was made missing each waited a slow deadline", n)
	}
	expectEqual(t, "degraded read", mustRead(t, a, 0, len(model)), model)
}
