package raid

import (
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// stallDev blocks its reads of the data area while stalled is set, until
// release is closed (a slow or dying member that does not fail).
type stallDev struct {
	blockdev.Device
	from    int64
	stalled atomic.Bool
	release chan struct{}
	blocked atomic.Int64
	late    atomic.Int64 // blocked reads that ended
}

func (d *stallDev) ReadAt(p []byte, off int64) (int, error) {
	if off >= d.from && d.stalled.Load() {
		d.blocked.Add(1)
		<-d.release
		defer d.late.Add(1)
	}
	return d.Device.ReadAt(p, off)
}

// With Policy.SlowRead, a read of a chunk whose member does not answer is
// served from the other members (issue 15: one slow or dying member
// stalls every array about 1 s). The member is not failed for it, the
// late request does not touch the caller's buffer, and reads of other
// members are not delayed.
func TestSlowMemberReadsAroundIt(t *testing.T) {
	ms := newMems(4, 4<<20)
	sd := &stallDev{Device: ms[0], release: make(chan struct{})}
	ds := devs(ms)
	ds[0] = sd
	cfg := testCfg(RAID5, nil)
	cfg.SlowRead = 5 * time.Millisecond
	a := mustCreate(t, ds, cfg)
	sd.from = a.Geometry().DataOffset
	want := randBuf(rand.New(rand.NewSource(9)), int(4*a.Geometry().StripeSize))
	mustWrite(t, a, 0, want)
	sd.stalled.Store(true)
	released := false
	defer func() {
		if !released {
			close(sd.release)
		}
	}()
	// Stripe 0: data chunk 0 is on role 0 (P on role 3).
	C := a.Geometry().ChunkSize
	if a.dataRole(0, 0) != 0 {
		t.Fatalf("layout: data chunk 0 of stripe 0 on role %d, want 0", a.dataRole(0, 0))
	}
	buf := make([]byte, 4096)
	done := make(chan error, 1)
	go func() {
		_, err := a.ReadAt(buf, 4096)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read of a chunk on the stalled member 0: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a read of a chunk on member 0 waited 30 s for the stalled member; want it served from the others after Policy.SlowRead")
	}
	expectEqual(t, "read around the stalled member", buf, want[4096:8192])
	if sd.blocked.Load() == 0 {
		t.Fatal("the stalled member was never asked: the test did not exercise a slow read")
	}
	if got := a.slowReads.Load(); got != 1 {
		t.Errorf("slow reads served around a member: %d, want 1", got)
	}
	if st := a.Status(); st.State != "optimal" {
		t.Errorf("state %s after a slow read (%s), want optimal: a slow member is not failed", st.State, st.Reason)
	}
	// A read of another member's chunk is unaffected.
	expectEqual(t, "read of data chunk 1 of stripe 0", mustRead(t, a, C, 4096), want[C:C+4096])
	// The late completion must not write into the caller's buffer.
	clear(buf)
	sd.stalled.Store(false)
	released = true
	close(sd.release)
	for i := 0; sd.late.Load() == 0; i++ {
		if i > 3000 {
			t.Fatal("the stalled member's read did not end within 30 s of its release")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond) // its copy, if any, would follow the device's return
	if !isZero(buf) {
		t.Error("the late completion of the abandoned read wrote into the caller's buffer")
	}
}
