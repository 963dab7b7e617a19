package raid

import (
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// gateDev holds its data-area reads while held is set, until gate is
// closed (a member that is late once, e.g. its node is busy).
type gateDev struct {
	blockdev.Device
	from    int64
	held    atomic.Bool
	gate    chan struct{}
	waiting atomic.Int64
}

func (d *gateDev) ReadAt(p []byte, off int64) (int, error) {
	if off >= d.from && d.held.Load() {
		d.waiting.Add(1)
		<-d.gate
	}
	return d.Device.ReadAt(p, off)
}

// A read that is late on a healthy member while another member is known
// slow (it has a request abandoned by an earlier read around it) must not
// be rebuilt from that slow member: it waits for its own member instead.
// Before, it was reconstructed from P and the slow member's chunk and
// stalled as long as the slow member did (BenchmarkSlowMember: 500 ms
// reads with the member delayed 500 ms and Policy.SlowRead 5 ms).
func TestHedgeDoesNotReadFromAnotherSlowMember(t *testing.T) {
	ms := newMems(4, 4<<20)
	ds := devs(ms)
	slow := &stallDev{Device: ms[0], release: make(chan struct{})}
	late := &gateDev{Device: ms[2], gate: make(chan struct{})}
	ds[0], ds[2] = slow, late
	cfg := testCfg(RAID5, nil)
	cfg.SlowRead = 5 * time.Millisecond
	a := mustCreate(t, ds, cfg)
	slow.from, late.from = a.Geometry().DataOffset, a.Geometry().DataOffset
	want := randBuf(rand.New(rand.NewSource(3)), int(4*a.Geometry().StripeSize))
	mustWrite(t, a, 0, want)
	C := a.Geometry().ChunkSize
	if a.dataRole(0, 0) != 0 || a.dataRole(0, 2) != 2 {
		t.Fatalf("layout: stripe 0 data chunks 0 and 2 on roles %d and %d, want 0 and 2", a.dataRole(0, 0), a.dataRole(0, 2))
	}
	slow.stalled.Store(true)
	defer close(slow.release)
	// Member 0 is slow: its read is served around it and stays in flight.
	expectEqual(t, "read around the stalled member 0", mustRead(t, a, 0, 4096), want[:4096])
	if slow.blocked.Load() != 1 {
		t.Fatalf("the stalled member 0 got %d reads, want 1", slow.blocked.Load())
	}
	// Member 2 is late once, past the hedge deadline.
	late.held.Store(true)
	buf := make([]byte, 4096)
	done := make(chan error, 1)
	go func() {
		_, err := a.ReadAt(buf, 2*C)
		done <- err
	}()
	for i := 0; late.waiting.Load() == 0; i++ {
		if i > 3000 {
			t.Fatal("the read of data chunk 2 never reached member 2")
		}
		time.Sleep(time.Millisecond)
	}
	// Let the hedge deadline (about 5 ms) pass; a shorter wait could only
	// let the old code pass, not this one fail.
	time.Sleep(200 * time.Millisecond)
	late.held.Store(false)
	close(late.gate)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read of data chunk 2 (member 2, late once): %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a read late on member 2 still waits 10 s after member 2 answered: it was rebuilt from the stalled member 0 (reads of member 0 blocked: %d)", slow.blocked.Load())
	}
	expectEqual(t, "read of data chunk 2", buf, want[2*C:2*C+4096])
	if n := slow.blocked.Load(); n != 1 {
		t.Errorf("the stalled member 0 got %d reads, want 1: the late read of member 2 was rebuilt from it", n)
	}
}
