package blockdev

import (
	"sync"
	"testing"
	"time"
)

// fakeClock advances only when told; SleepUntil records the wake-up and
// jumps the clock there (one goroutine at a time in these tests).
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	wakeUp []time.Duration
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) SleepUntil(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wakeUp = append(c.wakeUp, t.Sub(time.Unix(0, 0)))
	if t.After(c.now) {
		c.now = t
	}
}
func (c *fakeClock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

func newFake() *fakeClock { return &fakeClock{now: time.Unix(0, 0)} }

// TestShapedBandwidthAndIOPS: back-to-back requests complete at the
// model's rate: 1 MiB reads at 100 MiB/s every 10 ms; 4 KiB writes at
// 1000 IOPS every 1 ms (their transfer time is smaller); a latency floor
// when idle.
func TestShapedBandwidthAndIOPS(t *testing.T) {
	clk := newFake()
	m := Model{ReadBytesPerS: 100 << 20, WriteBytesPerS: 100 << 20, ReadIOPS: 1e6, WriteIOPS: 1000, ReadLatency: 50 * time.Microsecond, WriteLatency: 20 * time.Microsecond}
	d := NewShaped(NewMem(64<<20, 4096), m, clk)
	buf := make([]byte, 1<<20)
	for i := 0; i < 3; i++ {
		if _, err := d.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The first request draws on the 2 ms burst credit.
	if got, want := clk.now.Sub(time.Unix(0, 0)), 28*time.Millisecond; got != want {
		t.Errorf("3 x 1 MiB at 100 MiB/s took %s, want %s (30 ms less the 2 ms burst)", got, want)
	}
	clk.advance(time.Second) // idle: the budget refills, up to the burst
	start := clk.now
	small := make([]byte, 4096)
	for i := 0; i < 10; i++ {
		if _, err := d.WriteAt(small, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := clk.now.Sub(start), 8*time.Millisecond; got != want {
		t.Errorf("10 x 4 KiB writes at 1000 IOPS took %s, want %s", got, want)
	}
	clk.advance(time.Second)
	start = clk.now
	if _, err := d.ReadAt(small, 0); err != nil {
		t.Fatal(err)
	}
	if got := clk.now.Sub(start); got != 50*time.Microsecond {
		t.Errorf("idle 4 KiB read took %s, want the 50µs latency floor", got)
	}
	if _, ok := d.(FUAWriter); !ok {
		t.Error("a shaped Mem lost FUAWriter")
	}
}

// TestShapedLinkIsShared: two drives on one link share its byte rate.
func TestShapedLinkIsShared(t *testing.T) {
	clk := newFake()
	link := NewLinkBudget(clk, 10<<20, 0)
	fast := Model{ReadBytesPerS: 1 << 30}
	a := NewShaped(NewMem(8<<20, 4096), fast, clk, link)
	b := NewShaped(NewMem(8<<20, 4096), fast, clk, link)
	buf := make([]byte, 1<<20)
	for i := 0; i < 5; i++ {
		a.ReadAt(buf, 0)
		b.ReadAt(buf, 0)
	}
	if got, want := clk.now.Sub(time.Unix(0, 0)), time.Second; got != want {
		t.Errorf("10 MiB over a 10 MiB/s link took %s, want %s", got, want)
	}
}

func TestModelScaled(t *testing.T) {
	m := Model{ReadBytesPerS: 1000, WriteBytesPerS: 500, ReadIOPS: 100, WriteIOPS: 10, ReadLatency: time.Millisecond}.Scaled(0.1)
	if m.ReadBytesPerS != 100 || m.WriteBytesPerS != 50 || m.ReadIOPS != 10 || m.WriteIOPS != 1 || m.ReadLatency != time.Millisecond {
		t.Errorf("Scaled = %+v", m)
	}
	if c := (Model{}).cost(true, 1<<20); c != 0 {
		t.Errorf("an unlimited model costs %s", c)
	}
}

func TestSharedLink(t *testing.T) {
	if SharedLink("t/A", 0) != nil {
		t.Error("a zero link rate made a budget")
	}
	a, b := SharedLink("t/A", 100), SharedLink("t/A", 100)
	if a == nil || a != b || SharedLink("t/B", 100) == a {
		t.Error("one node's drives do not share one link budget, or two nodes share one")
	}
}

// TestLinkChargedSharesTheNodeLink: a node's frontend bytes draw on the
// link its drives' bytes draw on (issue 17: only the drives' bytes were
// charged, so a frontend-heavy figure was not bound by the model): 5 MiB
// served by the frontend and 5 MiB read from a drive over a 10 MiB/s link
// take a second, and a FUA write through the frontend is charged too.
func TestLinkChargedSharesTheNodeLink(t *testing.T) {
	clk := newFake()
	link := NewLinkBudget(clk, 10<<20, 0)
	drive := NewShaped(NewMem(8<<20, 4096), Model{ReadBytesPerS: 1 << 30}, clk, link)
	front := LinkCharged(NewMem(8<<20, 4096), clk, link)
	buf := make([]byte, 1<<20)
	for i := 0; i < 5; i++ {
		if _, err := front.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := drive.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := clk.now.Sub(time.Unix(0, 0)), time.Second; got != want {
		t.Errorf("5 MiB through the frontend and 5 MiB from a drive over a 10 MiB/s link took %s, want %s", got, want)
	}
	fw, ok := front.(FUAWriter)
	if !ok {
		t.Fatal("the link-charged frontend lost FUAWriter")
	}
	start := clk.now
	if _, err := fw.WriteAtFUA(buf, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := clk.now.Sub(start), 100*time.Millisecond; got != want {
		t.Errorf("a 1 MiB FUA write through the frontend took %s of a 10 MiB/s link, want %s", got, want)
	}
	if d := NewMem(1<<20, 4096); LinkCharged(d, clk, nil) != d {
		t.Error("without a link model the frontend device is wrapped anyway")
	}
}
