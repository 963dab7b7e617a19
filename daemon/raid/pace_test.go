package raid

import (
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
)

// queueDev serves one data-area request at a time, taking time in
// proportion to its size (a drive with one queue): a foreground request
// queued behind a rebuild's large one waits for it.
type queueDev struct {
	blockdev.Device
	from    int64
	mu      sync.Mutex
	perByte time.Duration
	fixed   time.Duration
}

func (d *queueDev) serve(n int, off int64) {
	if off < d.from {
		return
	}
	d.mu.Lock()
	time.Sleep(d.fixed + time.Duration(n)*d.perByte)
	d.mu.Unlock()
}

func (d *queueDev) ReadAt(p []byte, off int64) (int, error) {
	d.serve(len(p), off)
	return d.Device.ReadAt(p, off)
}

func (d *queueDev) WriteAt(p []byte, off int64) (int, error) {
	d.serve(len(p), off)
	return d.Device.WriteAt(p, off)
}

// sleepClock is the wall clock, adding up its sleeps.
type sleepClock struct {
	clock.Clock
	slept atomic.Int64
}

func (c *sleepClock) Sleep(d time.Duration) {
	c.slept.Add(int64(d))
	time.Sleep(d)
}

// With Policy.Adaptive, a rebuild whose member requests make the
// foreground's wait pauses as long as it costs the foreground (issue 15:
// throttled by the foreground's latency, not a fixed 1–2 ms yield per
// step, which left the foreground 0.55 of its throughput), and does not
// pause at all without foreground requests.
func TestRebuildPacedByForegroundLatency(t *testing.T) {
	for _, fg := range []bool{true, false} {
		ms := newMems(4, 2<<20)
		ds := make([]blockdev.Device, 4)
		for i := range ds {
			ds[i] = &queueDev{Device: ms[i], perByte: 100 * time.Nanosecond, fixed: time.Millisecond}
		}
		clk := &sleepClock{Clock: clock.Real}
		cfg := testCfg(RAID5, nil)
		cfg.Adaptive = true
		cfg.Clock = clk
		a := mustCreate(t, ds, cfg)
		g := a.Geometry()
		for _, d := range ds {
			d.(*queueDev).from = g.DataOffset
		}
		if err := a.FailMember(2, "test"); err != nil {
			t.Fatal(err)
		}
		var stop atomic.Bool
		var wg sync.WaitGroup
		if fg {
			for w := 0; w < 2; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewSource(int64(w)))
					buf := make([]byte, 4096)
					for !stop.Load() {
						if _, err := a.ReadAt(buf, rng.Int63n(a.Size()/4096)*4096); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			time.Sleep(10 * time.Millisecond) // the foreground runs before the rebuild starts
		}
		nd := &queueDev{Device: blockdev.NewMem(2<<20, 512), from: g.DataOffset, perByte: 100 * time.Nanosecond, fixed: time.Millisecond}
		t0 := time.Now()
		if err := a.Replace(2, nd); err != nil {
			t.Fatal(err)
		}
		a.WaitIdle()
		el := time.Since(t0)
		stop.Store(true)
		wg.Wait()
		if st := a.Status(); st.State != "optimal" {
			t.Fatalf("after the rebuild: state %s (%s), want optimal", st.State, st.Reason)
		}
		slept := time.Duration(clk.slept.Load())
		ran := el - slept
		t.Logf("foreground %v: rebuild of %d stripes ran %v, paused %v", fg, g.Stripes, ran, slept)
		if fg && slept < ran/2 {
			t.Errorf("with foreground reads queued behind its requests the rebuild ran %v and paused only %v; want it to pause at least half as long as it runs (each of its steps makes the foreground's requests wait several times their own time)", ran, slept)
		}
		if !fg && slept > 0 {
			t.Errorf("without foreground requests the rebuild paused %v, want no pause", slept)
		}
		a.Abort()
	}
}
