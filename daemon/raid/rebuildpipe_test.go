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
	overlap *atomic.Int64 // writes during which a source read started
	target  bool
}

func (d *drivePace) ReadAt(p []byte, off int64) (int, error) {
	if off >= d.from {
		d.reads.Add(1)
		time.Sleep(200 * time.Microsecond)
	}
	return d.Device.ReadAt(p, off)
}

func (d *drivePace) WriteAt(p []byte, off int64) (int, error) {
	if d.target && off >= d.from {
		r0 := d.reads.Load()
		for i := 0; i < 100 && d.reads.Load() == r0; i++ {
			time.Sleep(time.Millisecond)
		}
		if d.reads.Load() != r0 {
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
	var reads, overlap atomic.Int64
	ds := make([]blockdev.Device, 4)
	for i := range ds {
		ds[i] = &drivePace{Device: ms[i], reads: &reads, overlap: &overlap}
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
	nd := &drivePace{Device: blockdev.NewMem(1<<20, 512), from: g.DataOffset, reads: &reads, overlap: &overlap, target: true}
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
