package checker

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/bench"
	"tier0/daemon/blockdev"
)

const devSize = 1 << 20 // 256 units

func newMem() *blockdev.Mem { return blockdev.NewMem(devSize, 4096) }

// runFor runs the workload until at least n writes were acknowledged.
func runFor(t *testing.T, c *Checker, n int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for c.Progress().Acked < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := c.Progress().Acked; got < n {
		t.Fatalf("only %d writes acknowledged in 10 s, wanted %d; last errors %v", got, n, c.LastErrors())
	}
}

func verify(t *testing.T, c *Checker) Report {
	t.Helper()
	r, err := c.Verify(context.Background(), VerifyOptions{ReadRetries: 1, RetryDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCleanRunVerifies(t *testing.T) {
	m1, m2 := newMem(), newMem()
	c, err := New([]Target{{Name: "a", Dev: m1}, {Name: "b", Dev: m2, Offset: 64 << 10, Units: 128}}, Options{Seed: 1, ReadPercent: 20})
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, c, 2000)
	r := verify(t, c)
	if !r.OK() || r.Err() != nil {
		t.Fatalf("clean run: %v; %v", r, r.Problems)
	}
	if want := int64(256 + 128); r.Checked != want || r.Verified != want {
		t.Fatalf("checked %d verified %d, want %d each", r.Checked, r.Verified, want)
	}
	if o := c.Online(); !o.OK() || o.Checked == 0 {
		t.Fatalf("online read-backs: %v", o)
	}
	p := c.Progress()
	if p.Failed != 0 || p.InFlight != 0 || p.Issued != p.Acked {
		t.Fatalf("progress %+v: want every write acknowledged", p)
	}
}

// snapshotUnit copies unit i of a mem device.
func snapshotUnit(t *testing.T, d blockdev.Device, i int) []byte {
	t.Helper()
	b := make([]byte, UnitSize)
	if _, err := d.ReadAt(b, int64(i)*UnitSize); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCatchesStaleBlock(t *testing.T) {
	m := newMem()
	c, err := New([]Target{{Name: "a", Dev: m}}, Options{Seed: 2, Workers: 1, MaxRun: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Fill every unit once, remember unit 7's old content, write more.
	runFor(t, c, 1)
	for i := range 256 {
		if err := c.write(c.targets[0], i, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
			t.Fatal(err)
		}
	}
	old := snapshotUnit(t, m, 7)
	if err := c.write(c.targets[0], 7, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
		t.Fatal(err)
	}
	if r := verify(t, c); !r.OK() {
		t.Fatalf("before the stale write: %v %v", r, r.Problems)
	}
	// A fenced owner's late write puts the older block back.
	if _, err := m.WriteAt(old, 7*UnitSize); err != nil {
		t.Fatal(err)
	}
	r := verify(t, c)
	if r.Stale != 1 || r.Lost != 0 || r.Corrupt != 0 || r.OK() {
		t.Fatalf("want exactly one stale unit: %v %v", r, r.Problems)
	}
	if !errors.Is(r.Err(), ErrViolation) || !strings.Contains(r.Problems[0], "unit 7 ") {
		t.Fatalf("error %v / problems %v: want ErrViolation naming unit 7", r.Err(), r.Problems)
	}
}

// dropper acknowledges writes that touch byte drop but does not store them.
type dropper struct {
	blockdev.Device
	drop int64
}

func (d *dropper) WriteAt(p []byte, off int64) (int, error) {
	if off <= d.drop && d.drop < off+int64(len(p)) {
		return len(p), nil
	}
	return d.Device.WriteAt(p, off)
}

func TestCatchesLostWrite(t *testing.T) {
	// A device that acknowledges but drops every write to unit 9: the
	// unit reads back as never written.
	m := newMem()
	c, err := New([]Target{{Name: "a", Dev: &dropper{Device: m, drop: 9 * UnitSize}}}, Options{Seed: 3, MaxRun: 1})
	if err != nil {
		t.Fatal(err)
	}
	runFor(t, c, 3000)
	// Unit 9 is written at least once, whatever the workload reached.
	if err := c.write(c.targets[0], 9, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
		t.Fatal(err)
	}
	r := verify(t, c)
	if r.Lost != 1 || r.Stale != 0 || r.Corrupt != 0 {
		t.Fatalf("want exactly one lost unit: %v %v", r, r.Problems)
	}
	if !strings.Contains(r.Problems[0], "unit 9 ") || !strings.Contains(r.Problems[0], "never written") {
		t.Fatalf("problem %q does not name unit 9 as never written", r.Problems[0])
	}

	// Unflushed writes lost in a crash are lost acknowledged writes too,
	// when the checker does not ask for FUA.
	m2 := newMem()
	c2, _ := New([]Target{{Name: "b", Dev: m2}}, Options{Seed: 3, NoFUA: true})
	runFor(t, c2, 500)
	m2.Crash()
	if r := verify(t, c2); r.Lost == 0 || r.OK() {
		t.Fatalf("crash without flush: want lost units, got %v", r)
	}
}

func TestFUAWritesSurviveTornCrash(t *testing.T) {
	// With FUA every acknowledged write is durable: a crash that tears
	// everything not yet durable must leave nothing lost.
	m := newMem()
	c, _ := New([]Target{{Name: "a", Dev: m}}, Options{Seed: 4})
	runFor(t, c, 1000)
	m.CrashRandom(mrand.New(mrand.NewSource(4)))
	if r := verify(t, c); !r.OK() {
		t.Fatalf("FUA writes after a crash: %v %v", r, r.Problems)
	}
}

func TestCatchesTornWrite(t *testing.T) {
	m := newMem()
	c, _ := New([]Target{{Name: "a", Dev: m}}, Options{Seed: 5, Workers: 1, MaxRun: 1})
	tg := c.targets[0]
	for i := range 256 {
		if err := c.write(tg, i, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
			t.Fatal(err)
		}
	}
	// Unit 20 torn: its first half from a newer write, its second half
	// still the old block (512-byte sectors landing separately).
	newer := blockdev.AlignedBuffer(UnitSize)
	f := blockdev.NewFault(m)
	f.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Action: blockdev.Fail, Err: blockdev.ErrTimeout})
	tg.Dev, tg.fua = f, nil
	if err := c.write(tg, 20, 1, newer); err == nil {
		t.Fatal("the fault device accepted the write")
	}
	// What the failed write would have put there:
	cur := snapshotUnit(t, m, 20)
	copy(cur[:UnitSize/2], newer[:UnitSize/2])
	if _, err := m.WriteAt(cur, 20*UnitSize); err != nil {
		t.Fatal(err)
	}
	// A write corrupted on its way (bit flips) is garbage too.
	tg.Dev = m
	f2 := blockdev.NewFault(m)
	f2.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Action: blockdev.Corrupt, Off: 30 * UnitSize, Len: UnitSize})
	tg.Dev = f2
	if err := c.write(tg, 30, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
		t.Fatal(err)
	}
	tg.Dev = m
	r := verify(t, c)
	if r.Corrupt != 2 || r.Lost != 0 || r.Stale != 0 {
		t.Fatalf("want two corrupt units (20 torn, 30 flipped): %v %v", r, r.Problems)
	}
	if !strings.Contains(r.Problems[0], "unit 20 ") || !strings.Contains(r.Problems[1], "unit 30 ") {
		t.Fatalf("problems %v: want units 20 and 30", r.Problems)
	}
}

// lander stores every write but reports failure for those touching byte
// fail: a write that landed although its acknowledgement was lost.
type lander struct {
	blockdev.Device
	mu   sync.Mutex
	fail int64
}

func (d *lander) WriteAt(p []byte, off int64) (int, error) {
	n, err := d.Device.WriteAt(p, off)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil && off <= d.fail && d.fail < off+int64(len(p)) {
		return n, fmt.Errorf("connection lost after sending: %w", blockdev.ErrIO)
	}
	return n, err
}

func TestInFlightOutcomesAreAllowed(t *testing.T) {
	// Writes that fail before reaching the device (unit range 0..63) and
	// writes that land but fail to acknowledge (unit 100) are both legal
	// outcomes; neither is a violation.
	m := newMem()
	f := blockdev.NewFault(&lander{Device: m, fail: 100 * UnitSize})
	f.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: 0, Len: 64 * UnitSize, Action: blockdev.Fail, After: 200, Count: 50})
	c, _ := New([]Target{{Name: "a", Dev: f}}, Options{Seed: 6, ErrorBackoff: time.Microsecond, NoFUA: true})
	runFor(t, c, 3000)
	// Make sure unit 100 was written (the random workload may not have
	// reached it): both writes land and fail.
	for range 2 {
		if err := c.write(c.targets[0], 99, 3, blockdev.AlignedBuffer(3*UnitSize)); err == nil {
			t.Fatal("a write over unit 100 did not fail")
		}
	}
	p := c.Progress()
	if p.Failed == 0 {
		t.Fatal("no write failed: the fault rules did not fire")
	}
	r := verify(t, c)
	if !r.OK() {
		t.Fatalf("in-flight outcomes flagged: %v %v", r, r.Problems)
	}
	if r.InFlightLanded == 0 {
		t.Fatalf("unit 100's landed-but-failed writes not seen as in flight: %v; unit 100 %+v; errors %v", r, c.targets[0].units[100], c.LastErrors())
	}
}

func TestPhantomGenerationIsCorrupt(t *testing.T) {
	// A valid block for this unit with a generation never written there
	// (e.g. a write to another unit misdirected by LBA arithmetic and
	// rewritten with this LBA) is corrupt, not in flight.
	m := newMem()
	c, _ := New([]Target{{Name: "a", Dev: m}}, Options{Seed: 7, Workers: 1, MaxRun: 1})
	tg := c.targets[0]
	if err := c.write(tg, 5, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
		t.Fatal(err)
	}
	// Unit 6's block written at unit 5: misplaced.
	b := blockdev.AlignedBuffer(UnitSize)
	if err := c.write(tg, 6, 1, b); err != nil {
		t.Fatal(err)
	}
	if _, err := m.WriteAt(b, 5*UnitSize); err != nil {
		t.Fatal(err)
	}
	// Unit 7 gets a valid block for itself with a generation nobody wrote.
	bench.FillUnit(b, tg.id, tg.lba(7), 1<<40)
	if _, err := m.WriteAt(b, 7*UnitSize); err != nil {
		t.Fatal(err)
	}
	r := verify(t, c)
	if r.Corrupt != 2 || !strings.Contains(r.Problems[0], "written for device") || !strings.Contains(r.Problems[1], "never written there") {
		t.Fatalf("misplaced and phantom blocks: %v %v", r, r.Problems)
	}
}

func TestNewRejectsBadTargets(t *testing.T) {
	m := newMem()
	for _, tc := range []struct {
		name string
		ts   []Target
	}{
		{"none", nil},
		{"dup", []Target{{Name: "a", Dev: m}, {Name: "a", Dev: m}}},
		{"offset", []Target{{Name: "a", Dev: m, Offset: 100}}},
		{"too big", []Target{{Name: "a", Dev: m, Units: 257}}},
		{"no dev", []Target{{Name: "a"}}},
	} {
		if _, err := New(tc.ts, Options{}); err == nil {
			t.Errorf("%s: New accepted %+v", tc.name, tc.ts)
		}
	}
}

func TestUnreadableDeviceCountsAndGivesUp(t *testing.T) {
	m := newMem()
	f := blockdev.NewFault(m)
	c, _ := New([]Target{{Name: "a", Dev: f}}, Options{Seed: 8})
	runFor(t, c, 100)
	f.AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Fail, Err: blockdev.ErrNoPath})
	r, err := c.Verify(context.Background(), VerifyOptions{ReadRetries: 3, RetryDelay: time.Millisecond, ChunkUnits: 16})
	if err != nil {
		t.Fatal(err)
	}
	if r.Unreadable != 256 || r.OK() || !errors.Is(r.Err(), ErrViolation) {
		t.Fatalf("want all 256 units unreadable: %v", r)
	}
	// Only the first chunk is read (and retried); the rest is given up.
	if f.Fired() != 1+3 {
		t.Fatalf("%d reads failed, want 1 read + 3 retries", f.Fired())
	}
}
