package raid

import (
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// drivePace makes a member answer like a drive (a fixed service time per
// data-area request), counting the reads it starts; a write to the
// rebuilt member waits a while for a source read to start meanwhile.
type drivePace struct {
	blockdev.Device
	from    int64
	reads   *atomic.Int64 // reads started on any source member
	active  *atomic.Int64 // source reads in progress
	overlap *atomic.Int64 // writes during which a source read ran
	target  bool
}

func (d *drivePace) ReadAt(p []byte, off int64) (int, error) {
	if off >= d.from {
		d.reads.Add(1)
		d.active.Add(1)
		time.Sleep(2 * time.Millisecond)
		defer d.active.Add(-1)
	}
	return d.Device.ReadAt(p, off)
}

func (d *drivePace) WriteAt(p []byte, off int64) (int, error) {
	if d.target && off >= d.from {
		// A read of the next stripes issued with this write may have
		// started before it (scheduling under load): one still running,
		// or one starting while it waits, is an overlap.
		r0 := d.reads.Load()
		ran := func() bool { return d.active.Load() > 0 || d.reads.Load() != r0 }
		for i := 0; i < 100 && !ran(); i++ {
			time.Sleep(time.Millisecond)
		}
		if ran() {
			d.overlap.Add(1)
		}
	} else if off >= d.from {
		time.Sleep(200 * time.Microsecond)
	}
	return d.Device.WriteAt(p, off)
}

// A rebuild keeps several member requests in flight: the sources' reads
// of the next stripes run while the rebuilt member writes the previous
// ones (issue 15: rebuild at 0.06 of a member's write bandwidth, one
// request at a time). The result is correct.
func TestRebuildOverlapsReadsAndWrites(t *testing.T) {
	ms := newMems(4, 1<<20)
	var reads, active, overlap atomic.Int64
	ds := make([]blockdev.Device, 4)
	for i := range ds {
		ds[i] = &drivePace{Device: ms[i], reads: &reads, active: &active, overlap: &overlap}
	}
	a := mustCreate(t, ds, testCfg(RAID5, nil))
	g := a.Geometry()
	for _, d := range ds {
		d.(*drivePace).from = g.DataOffset
	}
	want := randBuf(rand.New(rand.NewSource(6)), int(a.Size()))
	mustWrite(t, a, 0, want)
	if err := a.FailMember(2, "test"); err != nil {
		t.Fatal(err)
	}
	nd := &drivePace{Device: blockdev.NewMem(1<<20, 512), from: g.DataOffset, reads: &reads, active: &active, overlap: &overlap, target: true}
	if err := a.Replace(2, nd); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	if st := a.Status(); st.State != "optimal" {
		t.Fatalf("after the rebuild: state %s (%s), want optimal", st.State, st.Reason)
	}
	if n := overlap.Load(); n == 0 {
		t.Errorf("no source read started while the rebuilt member was writing (%d stripes): the rebuild has one request in flight at a time, want reads of the next stripes overlapping the writes", g.Stripes)
	}
	if err := a.FailMember(0, "test: read from the rebuilt member"); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "array after the rebuild with member 0 failed", mustRead(t, a, 0, len(want)), want)
}
