package checker

import (
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/reliability/history"
)

// laggard serves reads of one unit from its content before the latest
// write (a replica or cache that missed the newest acknowledged write),
// once armed.
type laggard struct {
	blockdev.Device
	unit  int64
	mu    sync.Mutex
	armed bool
	prev  []byte // content before the newest write
}

func (d *laggard) hit(off, n int64) bool { return off <= d.unit && d.unit < off+n }

func (d *laggard) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.hit(off, int64(len(p))) {
		d.prev = make([]byte, UnitSize)
		if _, err := d.Device.ReadAt(d.prev, d.unit); err != nil {
			return 0, err
		}
	}
	return d.Device.WriteAt(p, off)
}

func (d *laggard) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, err := d.Device.ReadAt(p, off)
	if err == nil && d.armed && d.prev != nil && d.hit(off, int64(len(p))) {
		copy(p[d.unit-off:], d.prev)
	}
	return n, err
}

func TestSharedReadsCatchStaleRead(t *testing.T) {
	// Reads by any worker of any unit: a read of unit 5 (owned by worker
	// 0) by another worker, issued after the newest write to it was
	// acknowledged, returns the generation before it.
	m := newMem()
	lag := &laggard{Device: m, unit: 5 * UnitSize}
	c, err := New([]Target{{Name: "a", Dev: lag}}, Options{Seed: 9, Workers: 4, MaxRun: 2, ReadPercent: 50, ReadAny: true, NoFUA: true})
	if err != nil {
		t.Fatal(err)
	}
	tg := c.targets[0]
	for range 2 {
		if err := c.write(tg, 5, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
			t.Fatal(err)
		}
	}
	lag.mu.Lock()
	lag.armed = true
	lag.mu.Unlock()
	// A read issued by another worker (client 3) sees the old block.
	if err := c.readAt(tg, 3, 4, 2, blockdev.AlignedBuffer(2*UnitSize), true); err != nil {
		t.Fatal(err)
	}
	o := c.Online()
	if o.Stale != 1 || !strings.Contains(o.Problems[0], "unit 5 ") || !strings.Contains(o.Problems[0], "acknowledged before the read was issued") {
		t.Fatalf("online check: %v %v; want one stale read of unit 5", o, o.Problems)
	}
	h := c.CheckHistory(history.Options{})
	if h.ByKind[history.Stale] != 1 || h.Anomalies[0].Unit != 5 {
		t.Fatalf("history: %v; want one stale anomaly on unit 5\n%s", h.ByKind, h.Report(nil, 9))
	}
}

func TestHistoryCatchesResurrectedBlock(t *testing.T) {
	// A write fails but lands; a read returns it; then the device goes
	// back to the older acknowledged block (a member resync copying old
	// data over it, say). Every single read is legal on its own — the
	// per-read checks and the final verification accept it — but the
	// history is not linearizable: old data came back after a newer
	// read.
	m := newMem()
	c, _ := New([]Target{{Name: "a", Dev: &lander{Device: m, fail: -1}}}, Options{Seed: 10, Workers: 1, MaxRun: 1, NoFUA: true})
	tg := c.targets[0]
	if err := c.write(tg, 3, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
		t.Fatal(err)
	}
	old := snapshotUnit(t, m, 3)
	tg.Dev.(*lander).fail = 3 * UnitSize
	if err := c.write(tg, 3, 1, blockdev.AlignedBuffer(UnitSize)); err == nil {
		t.Fatal("the lander acknowledged the write")
	}
	buf := blockdev.AlignedBuffer(UnitSize)
	if err := c.readBack(tg, 3, 1, buf); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WriteAt(old, 3*UnitSize); err != nil {
		t.Fatal(err)
	}
	if err := c.readBack(tg, 3, 1, buf); err != nil {
		t.Fatal(err)
	}
	if o, r := c.Online(), verify(t, c); !o.OK() || !r.OK() {
		t.Fatalf("per-read checks: online %v, final %v; each read alone is legal", o, r)
	}
	h := c.CheckHistory(history.Options{})
	// The workload's second read and the final verification's read both
	// return the resurrected block.
	if h.OK() || h.ByKind[history.Resurrected] != 2 || len(h.ByKind) != 1 || h.Anomalies[0].Op.Client != 0 || h.Anomalies[1].Op.Client != -1 {
		t.Fatalf("history %v: want two resurrected reads (the workload's, the verification's)\n%s", h.ByKind, h.Report(nil, 10))
	}
	if !strings.Contains(h.Report(nil, 10), "a unit 3 ") {
		t.Fatalf("report does not name unit 3:\n%s", h.Report(nil, 10))
	}
}

func TestHistoryOfConcurrentWorkloadIsLinearizable(t *testing.T) {
	// Many workers reading each other's units while writing their own,
	// on a device that fails some writes (before or after they land):
	// the history must be linearizable and every read checked.
	m := newMem()
	f := blockdev.NewFault(&lander{Device: m, fail: 100 * UnitSize})
	f.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: 0, Len: 64 * UnitSize, Action: blockdev.Fail, After: 20, Count: 50})
	c, _ := New([]Target{{Name: "a", Dev: f}, {Name: "b", Dev: newMem()}}, Options{Seed: 11, Workers: 4, ReadPercent: 40, ReadAny: true, ErrorBackoff: time.Microsecond})
	runFor(t, c, 3000)
	if c.Progress().Failed == 0 {
		t.Fatal("no write failed: the fault rules did not fire")
	}
	if o := c.Online(); !o.OK() || o.Checked == 0 {
		t.Fatalf("online: %v %v", o, o.Problems)
	}
	if r := verify(t, c); !r.OK() {
		t.Fatalf("final: %v %v", r, r.Problems)
	}
	h := c.CheckHistory(history.Options{})
	if !h.OK() || h.Ops < 3000 || h.Units != 512 {
		t.Fatalf("history of a correct device: %+v\n%s", h, h.Report(nil, 11))
	}
}
