package checker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"tier0/bench"
	"tier0/daemon/blockdev"
	"tier0/reliability/history"
)

// UnitSize is the size of one checked unit (one register).
const UnitSize = bench.VerifyUnit

// Target is one device the checker writes to: Units units starting at byte
// Offset (a multiple of UnitSize and of the device's block size).
type Target struct {
	// Name identifies the device in verify headers and reports (the array
	// name). Two targets must not share a name.
	Name string
	// Dev is the device. The checker does not close it.
	Dev blockdev.Device
	// Offset is where the checked region starts, in bytes.
	Offset int64
	// Units is the size of the region in units (default: as many as fit,
	// at most 2048).
	Units int
}

// Options tune the workload.
type Options struct {
	// Workers per target (default 4).
	Workers int
	// MaxRun is the largest write in units (default 4); each write covers
	// 1..MaxRun consecutive units, chosen at random.
	MaxRun int
	// ReadPercent of operations are read-backs checked at once (default
	// 0: writes only). A read-back of a unit not being written must
	// satisfy the same rule as the final verification.
	ReadPercent int
	// ReadAny lets a worker's reads cover any units of its target, not
	// only its own slice: reads then run concurrently with other
	// workers' writes to the same units, and each is checked against the
	// writes acknowledged before it was issued.
	ReadAny bool
	// FUA makes every write a Force Unit Access write when the device
	// supports it, so that an acknowledged write is durable without a
	// flush (default true via New; set NoFUA to turn it off).
	NoFUA bool
	// ErrorBackoff is how long a worker pauses after a failed I/O
	// (default 20 ms).
	ErrorBackoff time.Duration
	// Seed makes the choice of units and run lengths reproducible.
	Seed uint64
	// MaxProblems is how many problems a Report lists in detail
	// (default 20); all of them are counted.
	MaxProblems int
	// Logger (default: discard).
	Logger *slog.Logger
}

// unitState is what the checker knows about one unit. Only the worker
// owning the unit's slice touches it while a workload runs.
type unitState struct {
	acked uint64 // newest acknowledged generation; 0: none
	// pending are generations newer than acked whose writes were issued
	// but not acknowledged: each may or may not be on the device.
	pending []uint64
}

type target struct {
	Target
	idx   int32              // index in the history
	id    uint64             // bench.DeviceHash(Name)
	fua   blockdev.FUAWriter // nil: plain WriteAt
	mu    sync.Mutex         // guards units (readers of other slices look)
	units []unitState
}

// Checker runs the workload and verifies the result. Its methods are safe
// for concurrent use, except that Run and Verify must not overlap.
type Checker struct {
	opts    Options
	log     *slog.Logger
	targets []*target
	gen     atomic.Uint64
	pace    atomic.Int64  // ns each worker waits between operations
	runs    atomic.Uint64 // seeds for successive Run calls

	running sync.Mutex // held by Run and Verify
	born    time.Time  // for the time stamps of online problems
	hist    *history.Recorder

	issued, acked, failed, inflight atomic.Int64
	reads, readErrs                 atomic.Int64

	mu       sync.Mutex
	online   Report // problems found by read-backs during Run
	lastErrs []string
}

// New prepares a checker over targets.
func New(targets []Target, opts Options) (*Checker, error) {
	if len(targets) == 0 {
		return nil, errors.New("checker: no targets given; pass at least one device")
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	if opts.MaxRun <= 0 {
		opts.MaxRun = 4
	}
	if opts.ErrorBackoff <= 0 {
		opts.ErrorBackoff = 20 * time.Millisecond
	}
	if opts.MaxProblems <= 0 {
		opts.MaxProblems = 20
	}
	if opts.ReadPercent < 0 || opts.ReadPercent > 100 {
		return nil, fmt.Errorf("checker: read percent %d out of range; expected 0..100", opts.ReadPercent)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Checker{opts: opts, log: opts.Logger}
	names := map[string]bool{}
	var tnames []string
	for _, t := range targets {
		if t.Dev == nil {
			return nil, fmt.Errorf("checker: target %q has no device", t.Name)
		}
		if names[t.Name] {
			return nil, fmt.Errorf("checker: target name %q given twice; names must be unique", t.Name)
		}
		names[t.Name] = true
		bs := int64(t.Dev.BlockSize())
		if UnitSize%bs != 0 {
			return nil, fmt.Errorf("checker: target %s: block size %d does not divide the %d-byte unit", t.Name, bs, UnitSize)
		}
		if t.Offset < 0 || t.Offset%UnitSize != 0 {
			return nil, fmt.Errorf("checker: target %s: offset %d is not a multiple of %d", t.Name, t.Offset, UnitSize)
		}
		fit := (t.Dev.Size() - t.Offset) / UnitSize
		if t.Units <= 0 {
			t.Units = int(min(fit, 2048))
		}
		if int64(t.Units) > fit || t.Units < opts.Workers {
			return nil, fmt.Errorf("checker: target %s: %d units at offset %d do not fit the %d-byte device, or are fewer than the %d workers",
				t.Name, t.Units, t.Offset, t.Dev.Size(), opts.Workers)
		}
		tt := &target{Target: t, idx: int32(len(c.targets)), id: bench.DeviceHash(t.Name), units: make([]unitState, t.Units)}
		tnames = append(tnames, t.Name)
		if f, ok := t.Dev.(blockdev.FUAWriter); ok && !opts.NoFUA {
			tt.fua = f
		}
		c.targets = append(c.targets, tt)
	}
	c.hist = history.NewRecorder(tnames)
	c.born = c.hist.Born()
	return c, nil
}

// History is the record of every operation (and of the fault events noted
// in it by the caller).
func (c *Checker) History() *history.Recorder { return c.hist }

// CheckHistory checks the record so far for linearizability per unit. It
// must not run while Run or Verify does.
func (c *Checker) CheckHistory(o history.Options) history.Result {
	c.running.Lock()
	defer c.running.Unlock()
	return history.Check(c.hist.Ops(), c.hist.Targets(), o)
}

// Progress is a snapshot of the workload's counters.
type Progress struct {
	// Issued writes, Acked (acknowledged) ones, Failed ones (returned an
	// error: outcome unknown) and InFlight ones (issued, not returned).
	Issued   int64 `json:"issued"`
	Acked    int64 `json:"acked"`
	Failed   int64 `json:"failed"`
	InFlight int64 `json:"in_flight"`
	// Reads checked online and read errors.
	Reads      int64 `json:"reads"`
	ReadErrors int64 `json:"read_errors"`
}

// Progress returns the counters now. Taken when a fault is injected, its
// InFlight says how many writes the fault caught mid-way.
func (c *Checker) Progress() Progress {
	return Progress{Issued: c.issued.Load(), Acked: c.acked.Load(), Failed: c.failed.Load(), InFlight: c.inflight.Load(),
		Reads: c.reads.Load(), ReadErrors: c.readErrs.Load()}
}

// LastErrors returns the most recent distinct I/O errors the workload saw
// (at most 5), for reports.
func (c *Checker) LastErrors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lastErrs...)
}

func (c *Checker) noteErr(err error) {
	s := err.Error()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.lastErrs {
		if e == s {
			return
		}
	}
	c.lastErrs = append(c.lastErrs, s)
	if len(c.lastErrs) > 5 {
		c.lastErrs = c.lastErrs[1:]
	}
}

// SetPace makes every worker wait d after each operation (0: none), for
// example to leave a throttled rebuild room while still writing. It may be
// called while Run runs.
func (c *Checker) SetPace(d time.Duration) { c.pace.Store(int64(d)) }

// Run writes (and reads back) until ctx ends, then waits for every I/O it
// issued to return, and returns nil. I/O errors do not stop it: a failed
// write is recorded as in flight (its outcome unknown) and the worker goes
// on. Run may be called again later; the record carries over.
func (c *Checker) Run(ctx context.Context) error {
	c.running.Lock()
	defer c.running.Unlock()
	run := c.runs.Add(1)
	var wg sync.WaitGroup
	for ti, t := range c.targets {
		per := t.Units / c.opts.Workers
		for w := 0; w < c.opts.Workers; w++ {
			lo, hi := w*per, (w+1)*per
			if w == c.opts.Workers-1 {
				hi = t.Units
			}
			rng := rand.New(rand.NewPCG(c.opts.Seed, run<<32|uint64(ti)<<16|uint64(w)))
			client := int32(ti*c.opts.Workers + w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.worker(ctx, t, client, lo, hi, rng)
			}()
		}
	}
	wg.Wait()
	return nil
}

func (c *Checker) worker(ctx context.Context, t *target, client int32, lo, hi int, rng *rand.Rand) {
	buf := blockdev.AlignedBuffer(c.opts.MaxRun * UnitSize)
	for ctx.Err() == nil {
		n := 1 + rng.IntN(c.opts.MaxRun)
		n = min(n, hi-lo)
		first := lo + rng.IntN(hi-lo-n+1)
		var err error
		if c.opts.ReadPercent > 0 && rng.IntN(100) < c.opts.ReadPercent {
			if c.opts.ReadAny {
				first = rng.IntN(t.Units - n + 1)
			}
			err = c.readAt(t, client, first, n, buf[:n*UnitSize], first < lo || first+n > hi)
		} else {
			err = c.writeAt(t, client, first, n, buf[:n*UnitSize])
		}
		wait := time.Duration(c.pace.Load())
		if err != nil {
			c.noteErr(err)
			wait = max(wait, c.opts.ErrorBackoff)
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
	}
}

// write is writeAt by client 0 (tests).
func (c *Checker) write(t *target, first, n int, buf []byte) error {
	return c.writeAt(t, 0, first, n, buf)
}

// writeAt issues one write of n units from unit first with a new
// generation and records its outcome.
func (c *Checker) writeAt(t *target, client int32, first, n int, buf []byte) error {
	gen := c.gen.Add(1)
	for i := range n {
		bench.FillUnit(buf[i*UnitSize:(i+1)*UnitSize], t.id, t.lba(first+i), gen)
	}
	t.mu.Lock()
	for i := range n {
		u := &t.units[first+i]
		u.pending = append(u.pending, gen)
	}
	t.mu.Unlock()
	c.issued.Add(1)
	c.inflight.Add(1)
	off := t.Offset + int64(first)*UnitSize
	call := c.hist.Now()
	var err error
	if t.fua != nil {
		_, err = t.fua.WriteAtFUA(buf, off)
	} else {
		_, err = t.Dev.WriteAt(buf, off)
	}
	ret := c.hist.Now()
	c.inflight.Add(-1)
	out := history.OK
	if err != nil {
		out = history.Unknown
	}
	ops := make([]history.Op, n)
	for i := range n {
		ops[i] = history.Op{Target: t.idx, Unit: int32(first + i), Kind: history.Write, Value: gen, Client: client, Call: call, Return: ret, Outcome: out}
	}
	c.hist.Add(ops...)
	if err != nil {
		c.failed.Add(1)
		return fmt.Errorf("write %s units %d..%d gen %d: %w", t.Name, first, first+n-1, gen, err)
	}
	c.acked.Add(1)
	t.mu.Lock()
	for i := range n {
		u := &t.units[first+i]
		u.acked = gen
		// Older in-flight generations may no longer be found: an
		// acknowledged newer write must win.
		u.pending = u.pending[:0]
	}
	t.mu.Unlock()
	return nil
}

// lba is the verify header's LBA of unit i: its byte offset / UnitSize.
func (t *target) lba(i int) uint64 { return uint64(t.Offset/UnitSize) + uint64(i) }

// readBack is readAt of the caller's own units by client 0 (tests).
func (c *Checker) readBack(t *target, first, n int, buf []byte) error {
	return c.readAt(t, 0, first, n, buf, false)
}

// readAt reads n units from unit first, records the read and checks it.
// shared: the units may be written by other workers meanwhile; the read is
// then checked against the generations acknowledged before it was issued,
// else (the units are the caller's, nothing writes them meanwhile) exactly
// like the final verification.
func (c *Checker) readAt(t *target, client int32, first, n int, buf []byte, shared bool) error {
	c.reads.Add(1)
	snap := make([]uint64, n)
	t.mu.Lock()
	for i := range n {
		snap[i] = t.units[first+i].acked
	}
	t.mu.Unlock()
	call := c.hist.Now()
	if _, err := t.Dev.ReadAt(buf, t.Offset+int64(first)*UnitSize); err != nil {
		c.readErrs.Add(1)
		return fmt.Errorf("read %s units %d..%d: %w", t.Name, first, first+n-1, err)
	}
	ret := c.hist.Now()
	ops := make([]history.Op, n)
	for i := range n {
		ops[i] = history.Op{Target: t.idx, Unit: int32(first + i), Kind: history.Read, Value: t.value(first+i, buf[i*UnitSize:(i+1)*UnitSize]),
			Client: client, Call: call, Return: ret}
	}
	c.hist.Add(ops...)
	c.mu.Lock()
	defer c.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range n {
		u := buf[i*UnitSize : (i+1)*UnitSize]
		if shared {
			c.classifyShared(&c.online, t, first+i, u, snap[i], ops[i].Value)
		} else {
			c.classify(&c.online, t, first+i, u, true)
		}
	}
	return nil
}

// value is the history's value of unit i's content u.
func (t *target) value(i int, u []byte) uint64 {
	switch err := bench.CheckUnit(u, t.id, t.lba(i), 0); {
	case errors.Is(err, bench.ErrVerifyUnwritten):
		return history.Unwritten
	case errors.Is(err, bench.ErrVerifyMisplaced):
		return history.Foreign
	case err != nil:
		return history.Torn
	}
	return binary.LittleEndian.Uint64(u[24:32])
}
