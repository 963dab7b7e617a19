package host

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
	"tier0/daemon/nvme"
)

// quiesceClock is a fake clock for the command quiesce wait: Now stands
// still, After reports the duration asked for and fires only when the test
// says so.
type quiesceClock struct {
	clock.Clock // the rest: the wall clock
	now         time.Time
	asked       chan time.Duration
	fire        chan time.Time
}

func newQuiesceClock() *quiesceClock {
	return &quiesceClock{Clock: clock.Real, now: time.Unix(1e9, 0), asked: make(chan time.Duration, 16), fire: make(chan time.Time)}
}

func (q *quiesceClock) Now() time.Time { return q.now }

func (q *quiesceClock) After(d time.Duration) <-chan time.Time {
	q.asked <- d
	return q.fire
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// TestWriteResubmittedOnlyAfterQuiesce is the host half of issue 12 hole
// 2 (TP4129): a write outstanding when its association is lost may still
// execute on the controller, so it is resubmitted on the new association
// only after the old one is known quiesced: KATO + the controller's CQT
// after the loss, or KATO alone when the controller reports no CQT.
func TestWriteResubmittedOnlyAfterQuiesce(t *testing.T) {
	for _, tc := range []struct {
		name string
		cqt  uint16
		want time.Duration
	}{
		{"cqt", 1500, 2*time.Second + 1500*time.Millisecond},
		{"no cqt", 0, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeTarget(t, testNQN, 1<<20)
			f.cqt = tc.cqt
			f.stalled = make(chan uint8, 4)
			clk := newQuiesceClock()
			o := testOpts() // KATO 2 s
			o.Clock = clk
			c, ns := dialNS(t, f, o)
			f.stall.Store(true)
			w := pat(9, 4096)
			done := make(chan error, 1)
			go func() { _, err := ns.WriteAt(w, 8192); done <- err }()
			select {
			case op := <-f.stalled:
				if op != nvme.CmdWrite {
					t.Fatalf("stalled opcode %#x, want a write", op)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the write never reached the target")
			}
			// the association is lost with the write outstanding
			f.stall.Store(false)
			f.dropAll()
			select {
			case d := <-clk.asked:
				if d != tc.want {
					t.Fatalf("quiesce wait %v, want %v (KATO %v + CQT %d ms)", d, tc.want, o.KATO, tc.cqt)
				}
			case err := <-done:
				t.Fatalf("the outstanding write was resubmitted and completed (err %v) without waiting for the lost association to quiesce", err)
			case <-time.After(10 * time.Second):
				t.Fatal("no quiesce wait and no completion")
			}
			waitFor(t, "reconnect", func() bool { return c.Connected() && c.Reconnects() >= 1 })
			if n := f.handled.Load(); n != 0 {
				t.Fatalf("the target executed %d writes before the quiesce time had passed", n)
			}
			select {
			case err := <-done:
				t.Fatalf("write returned (%v) before the quiesce time had passed", err)
			default:
			}
			clk.fire <- clk.now
			if err := <-done; err != nil {
				t.Fatalf("write after the quiesce wait: %v", err)
			}
			r := make([]byte, len(w))
			if _, err := ns.ReadAt(r, 8192); err != nil || !bytes.Equal(r, w) {
				t.Fatalf("read back after the resubmitted write: equal %v, err %v", bytes.Equal(r, w), err)
			}
		})
	}
}

// TestMultipathWriteWaitsQuiesceBeforeOtherPath: a write outstanding on a
// path that is lost is retried on another path only after the lost path's
// association is known quiesced.
func TestMultipathWriteWaitsQuiesceBeforeOtherPath(t *testing.T) {
	f1 := newFakeTarget(t, testNQN, 1<<20)
	f2 := newFakeTarget(t, testNQN, 1<<20)
	f1.cqt = 700
	f1.stalled = make(chan uint8, 4)
	f2.setANA(nvme.ANANonOptimized) // the write goes to f1 first
	clk := newQuiesceClock()
	o1 := testOpts()
	o1.Clock = clk
	mp, err := NewMultipath([]PathSpec{{Addr: f1.addr(), Options: o1}, {Addr: f2.addr(), Options: testOpts()}}, MPOptions{HoldTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	waitFor(t, "both paths usable", func() bool { p := mp.Paths(); return p[0].ANA == nvme.ANAOptimized && p[1].Usable })
	f1.stall.Store(true)
	w := pat(11, 4096)
	done := make(chan error, 1)
	go func() { _, err := mp.WriteAt(w, 0); done <- err }()
	select {
	case <-f1.stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never reached path 1")
	}
	f1.refuse.Store(true)
	f1.stall.Store(false)
	f1.dropAll()
	want := o1.KATO + 700*time.Millisecond
	select {
	case d := <-clk.asked:
		if d != want {
			t.Fatalf("quiesce wait %v, want %v", d, want)
		}
	case err := <-done:
		t.Fatalf("the write was retried on path 2 and completed (err %v) before path 1's association was quiesced", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no quiesce wait and no completion")
	}
	if n := f2.handled.Load(); n != 0 {
		t.Fatalf("path 2 executed %d writes before path 1 was quiesced", n)
	}
	// reads are not held: they cannot overwrite anything
	if _, err := mp.ReadAt(make([]byte, 512), 0); err != nil {
		t.Fatalf("read while a write waits for quiesce: %v", err)
	}
	clk.fire <- clk.now
	if err := <-done; err != nil {
		t.Fatalf("write after the quiesce wait: %v", err)
	}
	f2.dataMu.Lock()
	got := bytes.Clone(f2.data[:len(w)])
	f2.dataMu.Unlock()
	if !bytes.Equal(got, w) {
		t.Fatal("path 2 does not hold the retried write")
	}
}

// TestReadTimeoutLeavesBufferAlone is the host half of issue 12 hole 3: a
// read that fails on the I/O timeout returns only once the transport can
// no longer write into the caller's buffer, so C2HData the controller sends
// late never lands in a buffer the caller has reused.
func TestReadTimeoutLeavesBufferAlone(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	copy(f.data, bytes.Repeat([]byte{0xD0}, 4096))
	f.lateRead = make(chan struct{})
	f.lateSent = make(chan error, 1)
	o := testOpts()
	o.IOTimeout = 200 * time.Millisecond
	o.IOQueues = 1 // the read's queue is the one checked below
	c, ns := dialNS(t, f, o)
	c.mu.Lock()
	old := c.cur
	c.mu.Unlock()
	buf := make([]byte, 4096)
	_, err := ns.ReadAt(buf, 0)
	if !errors.Is(err, blockdev.ErrTimeout) {
		t.Fatalf("read with its data held past the I/O timeout: %v, want ErrTimeout", err)
	}
	// the transport is done with the buffer: the reader of the queue that
	// carried the read has exited
	for _, q := range old.io {
		select {
		case <-q.(*queue).readerDone:
		default:
			t.Fatalf("ReadAt returned while queue %d's reader was still running", q.QID())
		}
	}
	// the caller reuses its buffer at once
	sentinel := bytes.Repeat([]byte{0x5E}, len(buf))
	copy(buf, sentinel)
	close(f.lateRead)
	if err := <-f.lateSent; err == nil {
		t.Log("the late C2HData reached the host's socket")
	}
	if !bytes.Equal(buf, sentinel) {
		t.Fatalf("the caller's buffer changed after ReadAt returned (first byte %#x): the late C2HData was written into it", buf[0])
	}
}

// TestFailFastWriteFailsAtOnce: under Options.FailFast (a RAID array's
// members) a write outstanding when its association is lost fails at once
// with a path error instead of waiting for the quiesce and a reconnect,
// I/O while the controller is down fails at once too, and the next
// association is installed only after the lost one is quiesced, so that
// nothing the caller writes later can be overtaken by the abandoned write.
func TestFailFastWriteFailsAtOnce(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	f.stalled = make(chan uint8, 4)
	clk := newQuiesceClock()
	o := testOpts() // KATO 2 s
	o.Clock = clk
	o.FailFast = true
	o.CtrlLossTimeout = time.Hour
	o.ReconnectDelay = 300 * time.Millisecond // the write gives up before the reconnect begins
	c, ns := dialNS(t, f, o)
	f.stall.Store(true)
	done := make(chan error, 1)
	go func() { _, err := ns.WriteAt(pat(9, 4096), 8192); done <- err }()
	select {
	case <-f.stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never reached the target")
	}
	f.stall.Store(false)
	f.dropAll()
	select {
	case err := <-done:
		if !IsPathError(err) {
			t.Fatalf("write lost with its connection: %v, want a path error", err)
		}
	case d := <-clk.asked:
		t.Fatalf("the lost write waited for the quiesce (%v) instead of failing at once", d)
	case <-time.After(10 * time.Second):
		t.Fatal("the lost write neither failed nor waited for the quiesce")
	}
	// the reconnect waits for the lost association's quiesce
	select {
	case d := <-clk.asked:
		if d != o.KATO {
			t.Fatalf("reconnect waits %v, want the quiesce time %v (KATO, no CQT)", d, o.KATO)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the controller reconnects without waiting for the lost association's quiesce")
	}
	if c.Connected() {
		t.Fatal("connected again before the lost association was quiesced")
	}
	errc := make(chan error, 1)
	go func() { _, err := ns.WriteAt(pat(10, 4096), 0); errc <- err }()
	select {
	case err := <-errc:
		if !IsPathError(err) {
			t.Fatalf("write while the controller is down: %v, want a path error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write while the controller is down waits for the reconnect")
	}
	if n := f.handled.Load(); n != 0 {
		t.Fatalf("the target executed %d writes", n)
	}
	clk.fire <- clk.now
	waitFor(t, "reconnect", func() bool { return c.Connected() && c.Reconnects() >= 1 })
	roundTrip(t, ns, 0, 4096, 11)
}
