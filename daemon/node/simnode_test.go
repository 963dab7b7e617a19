package node

import (
	"bytes"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/cluster"
	"tier0/daemon/raid"
)

// Quiesce returns only once no array of the node has background work
// queued or running: the resync that creating an array, or assembling it
// after an unclean stop, queues is done when it returns true, and so is
// its report. Before, it looked only at the running task's name (empty
// until the worker took the task and started its progress) and could
// return while the resync was still queued; the resync then ran on beside
// the simulation's next step, and its end's report (goBG, a WaitGroup Add
// from zero) raced with the simulation's Wait: `go test -race
// ./reliability/sim` reported it (docs/RELIABILITY.md "Simulation").
func TestQuiesceWaitsForQueuedResync(t *testing.T) {
	s := newTestSite(t)
	a := s.node("A")
	sim := &SimNode{n: a}
	x := a.served("x")
	block := bytes.Repeat([]byte{0x42}, 4096)
	for epoch := uint64(1); epoch <= 5; epoch++ {
		s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: epoch, Members: []string{"C1", "D1", "E1"}})
		// Assemble and quiesce on one P: the engine's worker goroutine,
		// started by the assembly, runs only once this goroutine blocks,
		// so the resync is still queued when Quiesce first looks.
		procs := runtime.GOMAXPROCS(1)
		x.mu.Lock()
		err := x.assembleLocked(t.Context(), epoch, nil)
		x.mu.Unlock()
		quiet := err == nil && sim.Quiesce(time.Minute)
		runtime.GOMAXPROCS(procs)
		if err != nil {
			t.Fatalf("epoch %d: assemble: %v", epoch, err)
		}
		if !quiet {
			t.Fatalf("epoch %d: background work still running after a minute", epoch)
		}
		x.mu.Lock()
		arr := x.array
		x.mu.Unlock()
		if arr == nil {
			t.Fatalf("epoch %d: the array is not running: reports %+v", epoch, s.reports())
		}
		// The resync's progress record is set when it starts (a new
		// array object each assembly) and the task's name cleared when
		// it ends.
		if st := arr.Status(); st.Progress.Kind != raid.ResyncProgress || st.Task != "" {
			t.Fatalf("epoch %d: Quiesce returned with task %q and progress %+v: the resync the assembly queued had not run to its end", epoch, st.Task, st.Progress)
		}
		// Dirty a few regions and stop without writing (a crash): the
		// next assembly is unclean and queues a resync of them.
		for i := range int64(8) {
			if _, err := x.gate.WriteAt(block, i*(512<<10)); err != nil {
				t.Fatal(err)
			}
		}
		x.mu.Lock()
		x.stopLocked(true)
		x.mu.Unlock()
		s.reports()
	}
}

// A RAID task that outlasts SimNode.Quiesce's bound (a frozen node's
// member commands wait) starts its report's goroutine (goBG) while the
// simulation waits for the node's background work (Wait, the next
// Quiesce): a sync.WaitGroup forbids an Add from zero beside a Wait, and
// the race detector reported it. The node's background group allows it:
// a Wait returns once the goroutines started before it ended, and work
// started beside it is waited for by the next Wait.
func TestBackgroundWaitBesideNewWork(t *testing.T) {
	n := &Node{}
	const rounds = 2000
	var ran atomic.Int64
	started := make(chan struct{})
	go func() {
		defer close(started)
		for range rounds {
			n.goBG(func() { ran.Add(1) })
		}
	}()
	for done := false; !done; {
		select {
		case <-started:
			done = true
		default:
		}
		n.bg.Wait()
	}
	n.bg.Wait()
	if got := ran.Load(); got != rounds {
		t.Fatalf("after the last Wait %d of %d background functions had run", got, rounds)
	}
}
