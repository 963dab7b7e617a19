package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	Since(t time.Time) time.Duration
	Sleep(d time.Duration)
	After(d time.Duration) <-chan time.Time
	NewTimer(d time.Duration) Timer
	NewTicker(d time.Duration) Ticker
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a time.Timer of some Clock.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker of some Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
	Reset(d time.Duration)
}

// Real is the wall clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) Since(t time.Time) time.Duration        { return time.Since(t) }
func (realClock) Sleep(d time.Duration)                  { time.Sleep(d) }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (realClock) NewTimer(d time.Duration) Timer         { return realTimer{time.NewTimer(d)} }
func (realClock) NewTicker(d time.Duration) Ticker       { return realTicker{time.NewTicker(d)} }
func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }

// Or returns c, or Real when c is nil: for option structs whose zero value
// means the wall clock.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

// Fake is a Clock whose time moves only through Advance and Set. Timers,
// tickers, Sleep and After fire, in deadline order, when the time reaches
// their deadline. It is safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64
	waiters []*fakeTimer
	changed chan struct{} // closed and replaced whenever waiters change
}

// NewFake starts a Fake at start (a fixed date when start is zero, so that
// runs replay).
func NewFake(start time.Time) *Fake {
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &Fake{now: start, changed: make(chan struct{})}
}

type fakeTimer struct {
	f        *Fake
	when     time.Time
	period   time.Duration // tickers
	seq      uint64        // order among equal deadlines: creation order
	c        chan time.Time
	fn       func()
	inactive bool
}

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) Since(t time.Time) time.Duration { return f.Now().Sub(t) }

// Sleep blocks until the fake time has advanced by d.
func (f *Fake) Sleep(d time.Duration) { <-f.After(d) }

func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

func (f *Fake) NewTimer(d time.Duration) Timer { return f.add(d, 0, nil) }

func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer { return f.add(d, 0, fn) }

func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	return fakeTicker{f.add(d, d, nil)}
}

func (f *Fake) add(d, period time.Duration, fn func()) *fakeTimer {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	t := &fakeTimer{f: f, when: f.now.Add(d), period: period, seq: f.seq, fn: fn}
	if fn == nil {
		t.c = make(chan time.Time, 1)
	}
	f.schedule(t)
	f.fireLocked()
	return t
}

// schedule inserts t (f.mu held).
func (f *Fake) schedule(t *fakeTimer) {
	t.inactive = false
	f.waiters = append(f.waiters, t)
	sort.SliceStable(f.waiters, func(i, j int) bool {
		a, b := f.waiters[i], f.waiters[j]
		if !a.when.Equal(b.when) {
			return a.when.Before(b.when)
		}
		return a.seq < b.seq
	})
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *Fake) unschedule(t *fakeTimer) bool {
	for i, w := range f.waiters {
		if w == t {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			t.inactive = true
			close(f.changed)
			f.changed = make(chan struct{})
			return true
		}
	}
	return false
}

// fireLocked fires every waiter whose deadline has come (f.mu held).
func (f *Fake) fireLocked() {
	for len(f.waiters) > 0 && !f.waiters[0].when.After(f.now) {
		t := f.waiters[0]
		f.waiters = f.waiters[1:]
		t.inactive = true
		at := t.when
		if t.fn != nil {
			go t.fn()
		} else {
			select {
			case t.c <- at:
			default: // a ticker whose reader is behind drops ticks, as time.Ticker does
			}
		}
		if t.period > 0 {
			t.when = at.Add(t.period)
			f.schedule(t)
		}
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// Advance moves the time forward by d, firing what comes due in order.
func (f *Fake) Advance(d time.Duration) {
	if d < 0 {
		panic("clock: Advance by a negative duration")
	}
	f.Set(f.Now().Add(d))
}

// Set moves the time to t (never backwards), firing what comes due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Step through each deadline so that a ticker re-armed at one
	// deadline fires again before a later one.
	for len(f.waiters) > 0 && !f.waiters[0].when.After(t) {
		if f.waiters[0].when.After(f.now) {
			f.now = f.waiters[0].when
		}
		f.fireLocked()
	}
	if t.After(f.now) {
		f.now = t
	}
}

// Next returns the earliest pending deadline, and false when nothing waits.
func (f *Fake) Next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.waiters) == 0 {
		return time.Time{}, false
	}
	return f.waiters[0].when, true
}

// Waiters is the number of pending timers, tickers, sleeps and afters.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// BlockUntil waits (in real time) until at least n timers are pending: a
// test calls it before Advance to know that the goroutine under test has
// reached its Sleep or select.
func (f *Fake) BlockUntil(n int) {
	for {
		f.mu.Lock()
		if len(f.waiters) >= n {
			f.mu.Unlock()
			return
		}
		ch := f.changed
		f.mu.Unlock()
		<-ch
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.f.unschedule(t)
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	active := t.f.unschedule(t)
	t.when = t.f.now.Add(d)
	t.f.schedule(t)
	t.f.fireLocked()
	return active
}

type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) C() <-chan time.Time { return k.t.c }
func (k fakeTicker) Stop()               { k.t.Stop() }
func (k fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	k.t.f.mu.Lock()
	k.t.period = d
	k.t.f.mu.Unlock()
	k.t.Reset(d)
}
