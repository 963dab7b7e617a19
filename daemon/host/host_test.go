package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

const testNQN = "nqn.2026-11.io.tier0.test:fake"

func testOpts() Options {
	return Options{SubNQN: testNQN, IOQueues: 2, QueueDepth: 16, KATO: 2 * time.Second, ReconnectDelay: 20 * time.Millisecond}
}

func dialNS(t *testing.T, f *fakeTarget, o Options) (*Controller, *Namespace) {
	t.Helper()
	c, err := Dial(context.Background(), f.addr(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	return c, ns
}

func pat(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func roundTrip(t *testing.T, dev blockdev.Device, off int64, n int, seed uint64) {
	t.Helper()
	w := pat(seed, n)
	if _, err := dev.WriteAt(w, off); err != nil {
		t.Fatalf("write %d at %d: %v", n, off, err)
	}
	r := make([]byte, n)
	if _, err := dev.ReadAt(r, off); err != nil {
		t.Fatalf("read %d at %d: %v", n, off, err)
	}
	if !bytes.Equal(w, r) {
		t.Fatalf("%d bytes at %d read back different", n, off)
	}
}

// TestIOSizes covers every data path: in-capsule writes, R2T writes answered
// by several H2CData PDUs and several R2Ts, reads in several C2HData PDUs
// (with and without the SUCCESS flag), splitting at MDTS, with digests off
// and on.
func TestIOSizes(t *testing.T) {
	for _, dg := range []bool{false, true} {
		t.Run(fmt.Sprintf("digests=%v", dg), func(t *testing.T) {
			f := newFakeTarget(t, testNQN, 16<<20)
			o := testOpts()
			o.HeaderDigest, o.DataDigest = dg, dg
			_, ns := dialNS(t, f, o)
			if ns.Size() != 16<<20 || ns.BlockSize() != 512 {
				t.Fatalf("size %d block %d", ns.Size(), ns.BlockSize())
			}
			for i, n := range []int{512, 4096, 8192, 200 << 10, 1 << 20, 3<<20 + 512} {
				roundTrip(t, ns, int64(i)*(2<<20), n, uint64(i))
			}
			// the bytes landed where they should on the target
			w := pat(99, 4096)
			ns.WriteAt(w, 4096)
			f.dataMu.Lock()
			got := append([]byte(nil), f.data[4096:8192]...)
			f.dataMu.Unlock()
			if !bytes.Equal(got, w) {
				t.Fatal("target memory differs from what was written")
			}
			if err := ns.WriteZeroes(4096, 4096); err != nil {
				t.Fatal(err)
			}
			r := make([]byte, 4096)
			ns.ReadAt(r, 4096)
			if !bytes.Equal(r, make([]byte, 4096)) {
				t.Fatal("not zero after WriteZeroes")
			}
			if err := ns.Flush(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRangeErrors(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	_, ns := dialNS(t, f, testOpts())
	if _, err := ns.ReadAt(make([]byte, 100), 0); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Errorf("misaligned: %v", err)
	}
	if _, err := ns.WriteAt(make([]byte, 1024), 1<<20-512); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Errorf("past the end: %v", err)
	}
	ns.Close()
	if _, err := ns.ReadAt(make([]byte, 512), 0); !errors.Is(err, blockdev.ErrClosed) {
		t.Errorf("after close: %v", err)
	}
}

func TestDialWrongNQN(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	o := testOpts()
	o.SubNQN = "nqn.2026-11.io.tier0.test:other"
	_, err := Dial(context.Background(), f.addr(), o)
	var se *StatusError
	if !errors.As(err, &se) || se.Status.Code() != nvme.StatusConnectInvalidParam {
		t.Fatalf("connect to the wrong NQN: %v, want a connect status error", err)
	}
}

// TestManyInFlight runs more concurrent I/Os than the queues hold.
func TestManyInFlight(t *testing.T) {
	f := newFakeTarget(t, testNQN, 4<<20)
	_, ns := dialNS(t, f, testOpts())
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			off := int64(i) * 8192
			w := pat(uint64(i), 8192)
			if _, err := ns.WriteAt(w, off); err != nil {
				errs <- err
				return
			}
			r := make([]byte, 8192)
			if _, err := ns.ReadAt(r, off); err != nil {
				errs <- err
			} else if !bytes.Equal(r, w) {
				errs <- fmt.Errorf("block %d differs", i)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestKeepAlive(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	o := testOpts()
	o.KATO = 200 * time.Millisecond
	dialNS(t, f, o)
	time.Sleep(600 * time.Millisecond)
	if n := f.kas.Load(); n < 3 {
		t.Fatalf("%d keep alives in 600 ms at KATO 200 ms, want >= 3", n)
	}
}

// TestReconnect: the target drops every connection; an I/O issued then is
// held until the host reconnected and then succeeds.
func TestReconnect(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	c, ns := dialNS(t, f, testOpts())
	roundTrip(t, ns, 0, 4096, 1)
	f.refuse.Store(true)
	f.dropAll()
	deadline := time.Now().Add(5 * time.Second)
	for c.Connected() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	done := make(chan error, 1)
	go func() { _, err := ns.ReadAt(make([]byte, 4096), 0); done <- err }()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("I/O returned (%v) while the controller was unreachable; want it held", err)
	default:
	}
	f.refuse.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("I/O not completed after the target came back")
	}
	if c.Reconnects() != 1 {
		t.Errorf("Reconnects = %d, want 1", c.Reconnects())
	}
	roundTrip(t, ns, 0, 4096, 2)
}

// TestCtrlLossTimeout: when the controller stays away, held I/O fails with
// ErrIO after CtrlLossTimeout.
func TestCtrlLossTimeout(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	o := testOpts()
	o.CtrlLossTimeout = 300 * time.Millisecond
	c, ns := dialNS(t, f, o)
	f.refuse.Store(true)
	f.dropAll()
	for c.Connected() {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	_, err := ns.ReadAt(make([]byte, 512), 0)
	if !errors.Is(err, blockdev.ErrIO) {
		t.Fatalf("I/O with the controller gone: %v, want ErrIO", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("failed after %v, want about 300 ms", d)
	}
}

// TestIOTimeout: a command the controller never completes fails with
// ErrTimeout and the association is rebuilt.
func TestIOTimeout(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	o := testOpts()
	o.IOTimeout = time.Second
	c, ns := dialNS(t, f, o)
	f.stall.Store(true)
	_, err := ns.WriteAt(make([]byte, 512), 0)
	if !errors.Is(err, blockdev.ErrTimeout) {
		t.Fatalf("stalled write: %v, want ErrTimeout", err)
	}
	f.stall.Store(false)
	roundTrip(t, ns, 0, 512, 3)
	if c.Reconnects() < 1 {
		t.Errorf("Reconnects = %d after a timeout, want >= 1", c.Reconnects())
	}
}

// TestFenced: a reservation conflict is ErrFenced.
func TestFenced(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	o1 := testOpts()
	o1.HostID = [16]byte{1}
	o2 := testOpts()
	o2.HostID = [16]byte{2}
	_, ns1 := dialNS(t, f, o1)
	_, ns2 := dialNS(t, f, o2)
	if err := ns1.Register(nvme.ResvRegister, 0, 1, false); err != nil {
		t.Fatal(err)
	}
	if err := ns1.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, 1, 0); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, ns1, 0, 512, 1)
	if err := ns2.Register(nvme.ResvRegister, 0, 2, false); err != nil {
		t.Fatal(err)
	}
	if err := ns2.Acquire(nvme.ResvPreemptAndAbort, nvme.ResvWriteExclusive, 2, 1); err != nil {
		t.Fatal(err)
	}
	_, err := ns1.WriteAt(make([]byte, 512), 0)
	if !errors.Is(err, blockdev.ErrFenced) || errors.Is(err, blockdev.ErrIO) || IsPathError(err) {
		t.Fatalf("write by the preempted host: %v; want ErrFenced, not ErrIO, not a path error", err)
	}
	roundTrip(t, ns2, 0, 512, 2)
	if _, err := ns1.ReadAt(make([]byte, 512), 0); err != nil {
		t.Errorf("read by a registrant under Write Exclusive: %v", err)
	}
}

// TestMultipathANA: I/O follows the ANA states of two controllers, holds
// while none is usable, fails with ErrNoPath after the hold timeout, and a
// reservation conflict is not retried on the other path.
func TestMultipathANA(t *testing.T) {
	f1 := newFakeTarget(t, testNQN, 1<<20)
	f2 := newFakeTarget(t, testNQN, 1<<20)
	// the fakes keep separate memory: data checks read what they wrote
	// through the same path state
	o := testOpts()
	mp, err := NewMultipath([]PathSpec{{Addr: f1.addr(), Options: o}, {Addr: f2.addr(), Options: o}}, MPOptions{HoldTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	wait := func(i int, s nvme.ANAState) {
		t.Helper()
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if mp.Paths()[i].ANA == s {
				return
			}
		}
		t.Fatalf("path %d did not reach %v: %+v", i, s, mp.Paths())
	}
	wait(0, nvme.ANAOptimized)
	wait(1, nvme.ANAOptimized)
	buf := make([]byte, 4096)
	for i := 0; i < 20; i++ {
		if _, err := mp.WriteAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	p := mp.Paths()
	if p[0].IOs == 0 || p[1].IOs == 0 {
		t.Errorf("two optimized paths: I/Os %d and %d, want both used", p[0].IOs, p[1].IOs)
	}
	f1.setANA(nvme.ANAInaccessible)
	wait(0, nvme.ANAInaccessible)
	before := mp.Paths()[0].IOs
	for i := 0; i < 20; i++ {
		if _, err := mp.WriteAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d := mp.Paths()[0].IOs - before; d != 0 {
		t.Errorf("inaccessible path got %d I/Os", d)
	}
	// the target turned inaccessible without an AEN the host saw yet: the
	// path error makes the host retry on the other path
	f2.mu.Lock()
	f2.ana = nvme.ANAInaccessible
	f2.mu.Unlock()
	f1.setANA(nvme.ANAOptimized)
	wait(0, nvme.ANAOptimized)
	for i := 0; i < 10; i++ {
		if _, err := mp.WriteAt(buf, 0); err != nil {
			t.Fatalf("write with a stale path state: %v", err)
		}
	}
	f2.setANA(nvme.ANAInaccessible)
	// none usable: held, then resumed
	f1.setANA(nvme.ANAInaccessible)
	wait(0, nvme.ANAInaccessible)
	wait(1, nvme.ANAInaccessible)
	done := make(chan error, 1)
	go func() { _, err := mp.WriteAt(buf, 0); done <- err }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("I/O returned (%v) with no usable path; want it held", err)
	default:
	}
	f2.setANA(nvme.ANANonOptimized)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("held I/O did not resume when a path became non-optimized")
	}
	f2.setANA(nvme.ANAInaccessible)
	wait(1, nvme.ANAInaccessible)
	start := time.Now()
	if _, err := mp.WriteAt(buf, 0); !errors.Is(err, blockdev.ErrNoPath) {
		t.Fatalf("no usable path past the hold timeout: %v, want ErrNoPath", err)
	}
	if d := time.Since(start); d < 2900*time.Millisecond {
		t.Errorf("ErrNoPath after %v, before the 3 s hold timeout", d)
	}

	// fenced on path 1: not retried on path 2
	f1.setANA(nvme.ANAOptimized)
	f2.setANA(nvme.ANAOptimized)
	wait(0, nvme.ANAOptimized)
	wait(1, nvme.ANAOptimized)
	for _, f := range []*fakeTarget{f1, f2} {
		f.mu.Lock()
		f.rtype, f.holder = nvme.ResvWriteExclusive, [16]byte{9}
		f.mu.Unlock()
	}
	c1, c2 := f1.cmds.Load(), f2.cmds.Load()
	if _, err := mp.WriteAt(buf, 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("fenced write: %v, want ErrFenced", err)
	}
	if n := f1.cmds.Load() - c1 + f2.cmds.Load() - c2; n != 1 {
		t.Errorf("a fenced write reached the targets %d times, want exactly once (never retried on another path)", n)
	}
}

// TestMultipathPathLoss: a path whose connection drops is skipped at once
// (no wait for its reconnect) and used again after it reconnects.
func TestMultipathPathLoss(t *testing.T) {
	f1 := newFakeTarget(t, testNQN, 1<<20)
	f2 := newFakeTarget(t, testNQN, 1<<20)
	o := testOpts()
	mp, err := NewMultipath([]PathSpec{{Addr: f1.addr(), Options: o}, {Addr: f2.addr(), Options: o}}, MPOptions{HoldTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && !(mp.Paths()[0].Usable && mp.Paths()[1].Usable); {
		time.Sleep(5 * time.Millisecond)
	}
	f1.refuse.Store(true)
	f1.dropAll()
	// The path is lost before the writes: a write in flight at the loss
	// would rightly wait for the path to quiesce (KATO) before another
	// path (TestMultipathWriteWaitsQuiesceBeforeOtherPath).
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && mp.Paths()[0].Connected; {
		time.Sleep(2 * time.Millisecond)
	}
	buf := make([]byte, 512)
	start := time.Now()
	for i := 0; i < 50; i++ {
		if _, err := mp.WriteAt(buf, 0); err != nil {
			t.Fatalf("write with one path lost: %v", err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("50 writes took %v with one path down; the dead path was waited for", d)
	}
	f1.refuse.Store(false)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && !mp.Paths()[0].Usable; {
		time.Sleep(10 * time.Millisecond)
	}
	if !mp.Paths()[0].Usable {
		t.Fatalf("path 1 not usable again after its target came back: %+v", mp.Paths())
	}
}

func TestStatusMapping(t *testing.T) {
	for _, c := range []struct {
		st                       nvme.Status
		fenced, io, rng, pathErr bool
	}{
		{nvme.StatusReservationConflict | nvme.StatusDNR, true, false, false, false},
		{nvme.StatusPreemptAbort, true, false, false, false},
		{nvme.StatusLBARange | nvme.StatusDNR, false, true, true, false},
		{nvme.StatusANAInaccessible, false, true, false, true},
		{nvme.StatusANATransition, false, true, false, true},
		{nvme.StatusInternal, false, true, false, false},
		{nvme.StatusWriteFault, false, true, false, false},
	} {
		err := fmt.Errorf("wrapped: %w", &StatusError{Op: "write", Status: c.st})
		if errors.Is(err, blockdev.ErrFenced) != c.fenced || errors.Is(err, blockdev.ErrIO) != c.io ||
			errors.Is(err, blockdev.ErrOutOfRange) != c.rng || IsPathError(err) != c.pathErr {
			t.Errorf("status %#x: fenced %v io %v range %v path %v; want %v %v %v %v", uint16(c.st),
				errors.Is(err, blockdev.ErrFenced), errors.Is(err, blockdev.ErrIO), errors.Is(err, blockdev.ErrOutOfRange), IsPathError(err),
				c.fenced, c.io, c.rng, c.pathErr)
		}
	}
	if !IsPathError(fmt.Errorf("x: %w", errConnLost)) {
		t.Error("a lost connection is not a path error")
	}
}

// TestMultipathReservation: reservation commands go through a usable path.
func TestMultipathReservation(t *testing.T) {
	f1 := newFakeTarget(t, testNQN, 1<<20)
	f2 := newFakeTarget(t, testNQN, 1<<20)
	f2.setANA(nvme.ANAInaccessible)
	o := testOpts()
	o.HostID = [16]byte{7}
	mp, err := NewMultipath([]PathSpec{{Addr: f2.addr(), Options: o}, {Addr: f1.addr(), Options: o}}, MPOptions{HoldTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	if err := mp.Register(nvme.ResvRegister, 0, 5, false); err != nil {
		t.Fatal(err)
	}
	if err := mp.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, 5, 0); err != nil {
		t.Fatal(err)
	}
	f1.mu.Lock()
	holder, key := f1.holder, f1.regs[[16]byte{7}]
	f1.mu.Unlock()
	if holder != ([16]byte{7}) || key != 5 {
		t.Fatalf("optimized path's target: holder %x key %d, want host 7 with key 5", holder, key)
	}
	if err := mp.Acquire(nvme.ResvAcquire, nvme.ResvWriteExclusive, 6, 0); !errors.Is(err, blockdev.ErrFenced) {
		t.Fatalf("acquire with a wrong key: %v, want ErrFenced", err)
	}
}

// TestBatchAcrossReconnect: the connection drops in the middle of a request
// split into many pieces; the lost pieces are redone after the reconnect
// and the whole range reads back right.
func TestBatchAcrossReconnect(t *testing.T) {
	f := newFakeTarget(t, testNQN, 8<<20)
	c, ns := dialNS(t, f, testOpts())
	f.dropAt.Store(f.cmds.Load() + 10) // 3 MiB = 24 pieces of 128 KiB
	w := pat(5, 3<<20)
	if _, err := ns.WriteAt(w, 1<<20); err != nil {
		t.Fatalf("write across a dropped connection: %v", err)
	}
	if c.Reconnects() < 1 {
		t.Fatalf("Reconnects = %d: the connection was not dropped mid-request", c.Reconnects())
	}
	r := make([]byte, len(w))
	if _, err := ns.ReadAt(r, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r, w) {
		t.Fatal("range differs after a write that spanned a reconnect")
	}
}

// TestAdminLargeTransferTCP: an admin command over NVMe/TCP may move more
// than an RDMA queue's 64 KiB admin buffers (a discovery log of many
// entries, a large log page): the host refuses large admin transfers only
// on a transport with a data limit of its own.
func TestAdminLargeTransferTCP(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	c, _ := dialNS(t, f, testOpts())
	buf := make([]byte, 128<<10)
	if err := c.GetLogPage(context.Background(), nvme.LogANA, 0, 0, 0, buf); err != nil {
		t.Fatalf("get log page of %d bytes over NVMe/TCP: %v", len(buf), err)
	}
}
