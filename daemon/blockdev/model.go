package blockdev

import (
	"fmt"
	"sync"
	"time"
)

// Model is a drive's performance: bandwidth, IOPS and latency for reads
// and writes. A zero rate is unlimited; a zero latency adds none.
type Model struct {
	ReadBytesPerS, WriteBytesPerS float64
	ReadIOPS, WriteIOPS           float64
	ReadLatency, WriteLatency     time.Duration
}

// Scaled multiplies the model's rates by f (0 < f). Latencies stay: they
// are the drive's service floor, and queueing for the scaled rates adds
// the rest.
func (m Model) Scaled(f float64) Model {
	m.ReadBytesPerS *= f
	m.WriteBytesPerS *= f
	m.ReadIOPS *= f
	m.WriteIOPS *= f
	return m
}

// String describes the model in one line.
func (m Model) String() string {
	return fmt.Sprintf("read %.1f MiB/s %.0f IOPS %s, write %.1f MiB/s %.0f IOPS %s",
		m.ReadBytesPerS/(1<<20), m.ReadIOPS, m.ReadLatency, m.WriteBytesPerS/(1<<20), m.WriteIOPS, m.WriteLatency)
}

// cost is the drive time one request of n bytes takes in direction
// write: the larger of its transfer time and its share of the IOPS.
func (m Model) cost(write bool, n int) time.Duration {
	bw, iops := m.ReadBytesPerS, m.ReadIOPS
	if write {
		bw, iops = m.WriteBytesPerS, m.WriteIOPS
	}
	var c float64
	if bw > 0 {
		c = float64(n) / bw
	}
	if iops > 0 {
		c = max(c, 1/iops)
	}
	return time.Duration(c * float64(time.Second))
}

// Clock is the time source of a Shaped device (tests inject a fake).
type Clock interface {
	Now() time.Time
	// SleepUntil returns at t or later.
	SleepUntil(t time.Time)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) SleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// Budget is a token bucket of device time, shared by every request that
// draws on one resource (a drive, or a node's link): each request takes
// its cost from it, refilled at one second per second, at most Burst
// ahead of use. A request whose cost is not yet covered waits its turn:
// the budget serves requests in the order they reserve.
type Budget struct {
	mu    sync.Mutex
	clk   Clock
	next  time.Time // when the budget is free again
	burst time.Duration
}

// NewBudget returns a budget on clk (nil: the real clock) that lets idle
// time accumulate up to burst of credit.
func NewBudget(clk Clock, burst time.Duration) *Budget {
	if clk == nil {
		clk = realClock{}
	}
	return &Budget{clk: clk, burst: burst}
}

// reserve takes cost from the budget and returns when the request is
// done with it.
func (b *Budget) reserve(now time.Time, cost time.Duration) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if floor := now.Add(-b.burst); b.next.Before(floor) {
		b.next = floor
	}
	b.next = b.next.Add(cost)
	return b.next
}

// Shaped is a Device whose requests take as long as the Model says at
// least: each reserves its cost from the drive's budget (and from any
// extra budgets, such as the node's link, by bytes) and completes no
// sooner than its latency after it was issued, nor before the budgets
// have served it. The real I/O runs meanwhile. Flush and Discard are not
// shaped; WriteZeroes costs one write operation.
type Shaped struct {
	dev   Device
	m     Model
	clk   Clock
	drive *Budget
	links []*LinkBudget
}

// LinkBudget is a shared byte-rate budget (a node's network link) that a
// Shaped device charges for every byte it moves.
type LinkBudget struct {
	b           *Budget
	bytesPerSec float64
}

// NewLinkBudget shapes to bytesPerSec on clk (nil: real clock).
func NewLinkBudget(clk Clock, bytesPerSec float64, burst time.Duration) *LinkBudget {
	return &LinkBudget{b: NewBudget(clk, burst), bytesPerSec: bytesPerSec}
}

// NewShaped wraps dev in m, on clk (nil: the real clock), charging links
// too. The result implements FUAWriter when dev does.
func NewShaped(dev Device, m Model, clk Clock, links ...*LinkBudget) Device {
	if clk == nil {
		clk = realClock{}
	}
	s := &Shaped{dev: dev, m: m, clk: clk, drive: NewBudget(clk, 2*time.Millisecond), links: links}
	if _, ok := dev.(FUAWriter); ok {
		return &shapedFUA{s}
	}
	return s
}

// Model returns the model the device is shaped to.
func (s *Shaped) Model() Model { return s.m }

// Unwrap returns the device underneath.
func (s *Shaped) Unwrap() Device { return s.dev }

// admit reserves a request and returns when it may complete.
func (s *Shaped) admit(write bool, n int) time.Time {
	now := s.clk.Now()
	lat := s.m.ReadLatency
	if write {
		lat = s.m.WriteLatency
	}
	done := now.Add(lat)
	if t := s.drive.reserve(now, s.m.cost(write, n)); t.After(done) {
		done = t
	}
	for _, l := range s.links {
		if l == nil || l.bytesPerSec <= 0 {
			continue
		}
		c := time.Duration(float64(n) / l.bytesPerSec * float64(time.Second))
		if t := l.b.reserve(now, c); t.After(done) {
			done = t
		}
	}
	return done
}

func (s *Shaped) ReadAt(p []byte, off int64) (int, error) {
	done := s.admit(false, len(p))
	n, err := s.dev.ReadAt(p, off)
	s.clk.SleepUntil(done)
	return n, err
}

func (s *Shaped) WriteAt(p []byte, off int64) (int, error) {
	done := s.admit(true, len(p))
	n, err := s.dev.WriteAt(p, off)
	s.clk.SleepUntil(done)
	return n, err
}

func (s *Shaped) WriteZeroes(off, length int64) error {
	done := s.admit(true, 0)
	err := s.dev.WriteZeroes(off, length)
	s.clk.SleepUntil(done)
	return err
}

func (s *Shaped) Flush() error                    { return s.dev.Flush() }
func (s *Shaped) Discard(off, length int64) error { return s.dev.Discard(off, length) }
func (s *Shaped) Size() int64                     { return s.dev.Size() }
func (s *Shaped) BlockSize() int                  { return s.dev.BlockSize() }
func (s *Shaped) Close() error                    { return s.dev.Close() }

type shapedFUA struct{ *Shaped }

func (s *shapedFUA) WriteAtFUA(p []byte, off int64) (int, error) {
	done := s.admit(true, len(p))
	n, err := s.dev.(FUAWriter).WriteAtFUA(p, off)
	s.clk.SleepUntil(done)
	return n, err
}

var (
	linksMu sync.Mutex
	links   = map[string]*LinkBudget{}
)

// SharedLink returns the process's link budget named key (a node), made
// at bytesPerSec on first use; nil when bytesPerSec is not positive (no
// link model). Every drive of a node shares its link.
func SharedLink(key string, bytesPerSec float64) *LinkBudget {
	if bytesPerSec <= 0 {
		return nil
	}
	linksMu.Lock()
	defer linksMu.Unlock()
	l := links[key]
	if l == nil {
		l = NewLinkBudget(nil, bytesPerSec, 2*time.Millisecond)
		links[key] = l
	}
	return l
}

// LinkCharged wraps dev (a node's frontend namespace) so that every byte
// it moves is charged to link, the node's modelled network link that its
// drives' bytes draw on too (SharedLink): a frontend-heavy workload is
// bound by the link like a backend one. It adds no drive time and no
// latency; dev itself is returned when link is nil (no link model). clk
// nil: the real clock.
func LinkCharged(dev Device, clk Clock, link *LinkBudget) Device {
	if link == nil || link.bytesPerSec <= 0 {
		return dev
	}
	return NewShaped(dev, Model{}, clk, link)
}
