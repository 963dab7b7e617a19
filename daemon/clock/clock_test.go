package clock

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestFakeTimersFireInOrder(t *testing.T) {
	f := NewFake(time.Time{})
	start := f.Now()
	a := f.NewTimer(3 * time.Second)
	b := f.NewTimer(time.Second)
	f.Advance(999 * time.Millisecond)
	select {
	case <-b.C():
		t.Fatal("timer fired before its deadline")
	default:
	}
	f.Advance(time.Millisecond)
	if got := <-b.C(); !got.Equal(start.Add(time.Second)) {
		t.Errorf("timer fired with %v, want its deadline %v", got, start.Add(time.Second))
	}
	if a.Stop() != true {
		t.Error("Stop of a pending timer = false")
	}
	f.Advance(time.Hour)
	select {
	case <-a.C():
		t.Error("a stopped timer fired")
	default:
	}
	if f.Waiters() != 0 {
		t.Errorf("%d waiters left", f.Waiters())
	}
}

func TestFakeTickerAndReset(t *testing.T) {
	f := NewFake(time.Time{})
	k := f.NewTicker(time.Second)
	var ticks int
	for i := 0; i < 3; i++ {
		f.Advance(time.Second)
		<-k.C()
		ticks++
	}
	k.Reset(5 * time.Second)
	f.Advance(4 * time.Second)
	select {
	case <-k.C():
		t.Error("ticker fired before its new period")
	default:
	}
	f.Advance(time.Second)
	<-k.C()
	k.Stop()
	tm := f.NewTimer(time.Second)
	if tm.Reset(10*time.Second) != true {
		t.Error("Reset of a pending timer = false")
	}
	f.Advance(9 * time.Second)
	select {
	case <-tm.C():
		t.Error("a reset timer fired at its old deadline")
	default:
	}
	f.Advance(time.Second)
	<-tm.C()
	if ticks != 3 {
		t.Fatal(ticks)
	}
}

func TestFakeSleepAndAfterFunc(t *testing.T) {
	f := NewFake(time.Time{})
	done := make(chan struct{})
	go func() {
		f.Sleep(2 * time.Second)
		close(done)
	}()
	f.BlockUntil(1)
	var called atomic.Bool
	fired := make(chan struct{})
	f.AfterFunc(time.Second, func() { called.Store(true); close(fired) })
	f.Advance(time.Second)
	<-fired
	select {
	case <-done:
		t.Fatal("Sleep(2s) returned after 1s")
	default:
	}
	f.Advance(time.Second)
	<-done
	if !called.Load() {
		t.Error("AfterFunc not called")
	}
	if d := f.Since(NewFake(time.Time{}).Now()); d != 2*time.Second {
		t.Errorf("Since = %v, want 2s", d)
	}
}

// A long Advance fires a ticker once per period in between, in order with
// other timers.
func TestFakeAdvanceSteps(t *testing.T) {
	f := NewFake(time.Time{})
	var order []string
	results := make(chan string, 16)
	f.AfterFunc(2500*time.Millisecond, func() { results <- "timer" })
	k := f.NewTicker(time.Second)
	f.Advance(3 * time.Second)
	// Tickers drop ticks when the reader is behind: one buffered tick.
	<-k.C()
	order = append(order, <-results)
	if order[0] != "timer" {
		t.Fatal(order)
	}
	if next, ok := f.Next(); !ok || !next.Equal(NewFake(time.Time{}).Now().Add(4*time.Second)) {
		t.Errorf("next deadline %v %v, want start+4s", next, ok)
	}
}

func TestRealAndOr(t *testing.T) {
	if Or(nil) != Real {
		t.Error("Or(nil) is not Real")
	}
	f := NewFake(time.Time{})
	if Or(f) != Clock(f) {
		t.Error("Or(f) is not f")
	}
	tm := Real.NewTimer(time.Millisecond)
	<-tm.C()
	if Real.Since(Real.Now()) > time.Minute {
		t.Error("Real.Since is off")
	}
}
