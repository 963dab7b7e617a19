package raid

import (
	"sync"
	"sync/atomic"
	"time"
)

// A process that was stopped (SIGSTOP, a hung host, a paused VM, a long
// scheduler stall) wakes with every timer due at once: a member request
// whose deadline passed while this process itself was not running has
// not shown that the member is slow. Failing members then would record
// healthy members failed in the superblocks of an array this node may no
// longer even own (the lease expired meanwhile, the node is about to
// fence itself). So a member deadline that falls in or right after a
// stall of the process is extended once by the I/O timeout instead of
// failing the member; a member that is really dead still fails at the
// extended deadline.
//
// The stall watcher is a goroutine that ticks every stallTick on the
// monotonic clock; a tick that comes more than stallGap after the one
// before marks a stall, and so does a tick overdue now (the watcher has
// not run yet since the process resumed).

const (
	stallTick = 50 * time.Millisecond
	stallGap  = 500 * time.Millisecond
)

type stallWatcher struct {
	once     sync.Once
	base     time.Time
	last     atomic.Int64 // monotonic ns since base of the last tick
	stallEnd atomic.Int64 // monotonic ns since base when the last stall was seen
	tick     time.Duration
	gap      time.Duration
}

// stalls is the process's watcher; tests replace it.
var stalls stallDetector = newStallWatcher(stallTick, stallGap)

// stallDetector tells whether the process stalled since a moment.
type stallDetector interface {
	now() int64
	// stalledSince reports whether the process stalled at or after t
	// (a value of now), or is stalled now.
	stalledSince(t int64) bool
}

func newStallWatcher(tick, gap time.Duration) *stallWatcher {
	return &stallWatcher{base: time.Now(), tick: tick, gap: gap}
}

func (w *stallWatcher) start() {
	w.once.Do(func() {
		w.last.Store(int64(time.Since(w.base)))
		go func() {
			t := time.NewTicker(w.tick)
			defer t.Stop()
			for range t.C {
				w.observe(int64(time.Since(w.base)))
			}
		}()
	})
}

// observe records a tick at now.
func (w *stallWatcher) observe(now int64) {
	if now-w.last.Load() > int64(w.gap) {
		w.stallEnd.Store(now)
	}
	w.last.Store(now)
}

func (w *stallWatcher) now() int64 {
	w.start()
	return int64(time.Since(w.base))
}

func (w *stallWatcher) stalledSince(t int64) bool { return w.stalledAt(t, w.now()) }

func (w *stallWatcher) stalledAt(t, now int64) bool {
	return w.stallEnd.Load() >= t || now-w.last.Load() > int64(w.gap)
}
