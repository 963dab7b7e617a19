package node

import (
	"runtime"
	"testing"
	"time"
)

// An array's re-add record lives and dies with the array: a package-wide
// table keyed by the served array kept every array ever served (its RAID
// engine, members and buffers) alive for the life of the process — in the
// simulation 12 MiB a seed, 24 GiB in a 30-minute soak.
func TestReaddRecordDiesWithItsArray(t *testing.T) {
	collected := make(chan struct{})
	func() {
		s := &served{}
		s.mu.Lock()
		tr := readdOf(s)
		tr.failed(0, time.Unix(0, 0), "test")
		s.mu.Unlock()
		runtime.AddCleanup(s, func(struct{}) { close(collected) }, struct{}{})
	}()
	for range 20 {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("a served array whose re-add record was taken is never collected: something outside it still holds it")
}
