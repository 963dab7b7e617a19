package host

import (
	"errors"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
)

// nextAt waits until the fake clock's earliest pending deadline is at,
// that is until the controller under test has armed that timer.
func nextAt(t *testing.T, clk *clock.Fake, what string, at time.Time) {
	t.Helper()
	waitFor(t, what, func() bool { d, ok := clk.Next(); return ok && d.Equal(at) })
}

// TestReconnectBackoffOnClock: the keep-alive ticker, the reconnect
// backoff (ReconnectDelay, doubled after a failed attempt up to 5 s) and
// the controller-loss wait run on Options.Clock. With a fake clock a lost
// controller reconnects only when the fake time reaches each delay; on the
// wall clock nothing would ever be armed on the fake, and an hour's delay
// would not pass within the test.
func TestReconnectBackoffOnClock(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	clk := clock.NewFake(time.Unix(1e9, 0))
	o := testOpts() // KATO 2 s: a keep-alive every 1 s
	o.Clock = clk
	o.ReconnectDelay = time.Hour
	o.CtrlLossTimeout = 3 * time.Hour
	c, _ := dialNS(t, f, o)

	nextAt(t, clk, "keep-alive ticker armed on the fake clock", clk.Now().Add(time.Second))
	kas := f.kas.Load()
	clk.Advance(time.Second)
	waitFor(t, "a keep-alive sent when the fake time reached KATO/2", func() bool { return f.kas.Load() > kas })

	// lost, and the first attempt refused: the next one waits 5 s
	f.refuse.Store(true)
	f.dropAll()
	waitFor(t, "disconnected", func() bool { return !c.Connected() })
	lost := clk.Now()
	nextAt(t, clk, "reconnect backoff armed for ReconnectDelay", lost.Add(time.Hour))
	clk.Advance(time.Hour)
	nextAt(t, clk, "after a refused attempt, the backoff doubled and capped at 5 s", lost.Add(time.Hour+5*time.Second))
	if c.Connected() || c.Reconnects() != 0 {
		t.Fatalf("connected %v, %d reconnects while the target refuses", c.Connected(), c.Reconnects())
	}

	f.refuse.Store(false)
	clk.Advance(5 * time.Second)
	waitFor(t, "reconnected once the fake time reached the backoff", c.Connected)
	if n := c.Reconnects(); n != 1 {
		t.Errorf("%d reconnects, want 1", n)
	}
}

// TestCtrlLossWaitOnClock: I/O while the controller is down waits
// CtrlLossTimeout on Options.Clock, then fails with ErrIO naming how long
// the controller was down (in the fake time).
func TestCtrlLossWaitOnClock(t *testing.T) {
	f := newFakeTarget(t, testNQN, 1<<20)
	clk := clock.NewFake(time.Unix(1e9, 0))
	o := testOpts()
	o.KATO = 0 // no keep-alive ticker: the two timers below are all there is
	o.Clock = clk
	o.ReconnectDelay = 10 * time.Hour
	o.CtrlLossTimeout = time.Hour
	c, ns := dialNS(t, f, o)
	f.refuse.Store(true)
	f.dropAll()
	waitFor(t, "disconnected", func() bool { return !c.Connected() })
	done := make(chan error, 1)
	go func() { _, err := ns.ReadAt(make([]byte, 512), 0); done <- err }()
	waitFor(t, "the backoff and the read's loss wait armed on the fake clock", func() bool { return clk.Waiters() >= 2 })
	select {
	case err := <-done:
		t.Fatalf("the read returned (%v) before the fake time reached CtrlLossTimeout", err)
	default:
	}
	clk.Advance(time.Hour)
	select {
	case err := <-done:
		if !errors.Is(err, blockdev.ErrIO) || !strings.Contains(err.Error(), "for 1h0m0s") {
			t.Fatalf("read after CtrlLossTimeout: %v, want ErrIO after 1h0m0s down", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the read still waits after the fake time passed CtrlLossTimeout")
	}
}
