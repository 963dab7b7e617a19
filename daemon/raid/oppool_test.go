package raid

import (
	"testing"
	"time"
)

// poolGateDev is a memory device whose reads wait for gate to close.
type poolGateDev struct {
	ramDev
	gate chan struct{}
}

func (g *poolGateDev) ReadAt(p []byte, off int64) (int, error) {
	<-g.gate
	return g.ramDev.ReadAt(p, off)
}

// TestOpPoolReusesAndReapsWorkers: jobs started while workers are parked
// run on them (the parked count drops to zero and comes back to n, not
// 2n), and every parked worker ends once idle for opIdle, the reaper with
// the last.
func TestOpPoolReusesAndReapsWorkers(t *testing.T) {
	defer opIdle.Store(opIdle.Load())
	opIdle.Store(int64(50 * time.Millisecond))
	parked := func() (int, bool) {
		opPool.mu.Lock()
		defer opPool.mu.Unlock()
		return len(opPool.idle), opPool.reaping
	}
	waitFor := func(what string, ok func(n int, reaping bool) bool) {
		t.Helper()
		for t0 := time.Now(); ; time.Sleep(time.Millisecond) {
			n, r := parked()
			if ok(n, r) {
				return
			}
			if time.Since(t0) > 10*time.Second {
				t.Fatalf("waiting for %s: %d parked workers, reaper running %v", what, n, r)
			}
		}
	}
	waitFor("no parked worker", func(n int, r bool) bool { return n == 0 && !r })

	const n = 8
	round := func() {
		dev := &poolGateDev{ramDev: ramDev{data: make([]byte, 1<<16)}, gate: make(chan struct{})}
		m := &member{dev: dev}
		rs := make([]*timedReq, n)
		for i := range rs {
			r := &timedReq{done: make(chan error, 1), m: m, buf: make([]byte, 4096)}
			r.ref = &r.buf
			rs[i] = r
			startOp(opJob{t: r})
		}
		if k, _ := parked(); k != 0 {
			t.Fatalf("%d workers parked while %d jobs wait on the device", k, n)
		}
		close(dev.gate)
		for _, r := range rs {
			if err := <-r.done; err != nil {
				t.Fatal(err)
			}
		}
		waitFor("n parked workers", func(k int, _ bool) bool { return k >= n })
		if k, _ := parked(); k != n {
			t.Fatalf("%d workers parked after two rounds of %d jobs, want %d (reused)", k, n, n)
		}
	}
	round()
	round()
	waitFor("every worker reaped", func(k int, r bool) bool { return k == 0 && !r })
}
