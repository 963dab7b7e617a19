package target

import (
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// The inline watchdog's timer can fire before the reader has stored it
// (a reader descheduled right after starting it, as under load): the
// take-over's reader then runs, and a teardown reads the timer field the
// first reader writes. The timer is started and stored under c.emu, which
// onWatch and teardown hold, so they are ordered (run with -race: before
// the fix the race detector failed this test, as it failed a CI run in
// TestAuthTier0Target).
func TestWatchFiringBeforeItIsStoredIsOrdered(t *testing.T) {
	judgeFast(t) // the reads must run inline for the watchdog to start
	old := newWatch
	t.Cleanup(func() { newWatch = old })
	newWatch = func(d time.Duration, f func()) *time.Timer {
		go f()                            // fires at once ...
		time.Sleep(20 * time.Millisecond) // ... while the reader is away
		return time.AfterFunc(time.Hour, f)
	}
	mem := blockdev.NewMem(testSize, testBS)
	_, addr := newTarget(t, Config{}, mem)
	_, id := adminConnect(t, addr, 0, testHostNQN, testHostID)
	q := ioConnect(t, addr, 0, testHostNQN, testHostID, id, 1)
	for i := 0; i < 4; i++ {
		if r := q.read(1, uint64(i), 1, testBS); !r.cqe.Status.OK() {
			t.Fatalf("read %d: %v", i, r.cqe.Status)
		}
	}
	q.nc.Close() // the connection ends: teardown reads the timer
	time.Sleep(100 * time.Millisecond)
}
