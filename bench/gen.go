package bench

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
	"unsafe"

	"tier0/daemon/blockdev"
)

// Pattern is an I/O pattern of the load generator.
type Pattern string

// The patterns. Sequential patterns give each worker its own contiguous
// share of the region and walk it in order; random patterns give worker w
// the I/O slots w, w+QD, w+2·QD… of the region and pick among them at random,
// so no two workers ever touch the same bytes (which is what lets verify
// mode run with writes and reads in flight at once).
const (
	SeqRead   Pattern = "seq-read"
	SeqWrite  Pattern = "seq-write"
	RandRead  Pattern = "rand-read"
	RandWrite Pattern = "rand-write"
	// Mixed is random I/O where each operation is a read with probability
	// Config.ReadFraction, otherwise a write.
	Mixed Pattern = "mixed"
)

func (p Pattern) valid() bool {
	switch p {
	case SeqRead, SeqWrite, RandRead, RandWrite, Mixed:
		return true
	}
	return false
}

func (p Pattern) sequential() bool { return p == SeqRead || p == SeqWrite }

// Target is one device under load and the region of it to use.
type Target struct {
	// ID names the device in results and in verify headers ("A1",
	// "array-b@A", "frontend:array-b"). It must be unique within a run and
	// the same between the run that writes and the run that verifies.
	ID  string
	Dev blockdev.Device
	// Offset and Length select the region in bytes, both multiples of
	// 4096. Length 0 means up to the end of the device.
	Offset, Length int64
}

// Config describes one load-generator run. The zero value is not valid: set
// Pattern, IOSize, and at least one of Duration, ByteLimit and Passes.
type Config struct {
	Pattern Pattern
	// IOSize is the size of every I/O in bytes: a multiple of the device
	// block size, and of VerifyUnit in verify mode.
	IOSize int
	// QueueDepth is the number of concurrent workers per target (each keeps
	// one I/O in flight). Default 1.
	QueueDepth int
	// ReadFraction is the share of reads for Mixed, in [0, 1].
	ReadFraction float64

	// Stop conditions; the run ends at the first one reached.
	// Duration bounds the wall time.
	Duration time.Duration
	// ByteLimit bounds the bytes issued per target.
	ByteLimit int64
	// Passes bounds how often each worker covers its share of the region:
	// for sequential patterns exactly that many sweeps, for random ones
	// that many times its slot count in I/Os.
	Passes int

	// Interval is the width of a time-series bucket. Default 1 s.
	Interval time.Duration

	// Verify makes writes carry verify blocks (see VerifyUnit) stamped with
	// Generation, and reads check them. A read unit older than
	// MinGeneration counts as stale; an all-zero unit counts as unwritten,
	// which is a failure unless AllowUnwritten.
	Verify         bool
	Generation     uint64
	MinGeneration  uint64
	AllowUnwritten bool

	// TolerateErrors keeps the run going through I/O errors, counting them
	// per interval and recording the first; a worker that hits an error
	// waits ErrorBackoff (default 1 ms) before its next I/O. Without it the
	// first error stops the run and Run returns it.
	TolerateErrors bool
	ErrorBackoff   time.Duration

	// Seed makes random offsets reproducible.
	Seed uint64
	// Now is the clock; default time.Now. Latencies are differences of two
	// Now readings.
	Now func() time.Time
	// Log receives run start/stop and first-error lines; default discards.
	Log *slog.Logger
}

// Sentinel errors of the generator.
var (
	// ErrConfig: the configuration or a target is unusable; the message
	// names the field and value.
	ErrConfig = errors.New("bench: invalid configuration")
	// ErrVerify: a verify-mode run found bad blocks (returned by
	// Result.VerifyErr, not by Run, so a run that tolerates them finishes).
	ErrVerify = errors.New("bench: verification failed")
)

// ErrorRecord describes one failed I/O.
type ErrorRecord struct {
	At       time.Time `json:"at"`
	Target   string    `json:"target"`
	Offset   int64     `json:"offset"`
	Length   int       `json:"length"`
	Write    bool      `json:"write"`
	Message  string    `json:"message"`
	Sentinel string    `json:"sentinel,omitempty"` // name of the blockdev sentinel it wraps, if any
}

// Stall is the longest time during which a target completed no I/O
// successfully: from the completion before the gap to the one after it. In
// a failover run that is the outage an application saw.
type Stall struct {
	From     time.Time     `json:"from"`
	To       time.Time     `json:"to"`
	Duration time.Duration `json:"duration_ns"`
}

// TargetResult is the per-target part of a Result.
type TargetResult struct {
	ID         string       `json:"id"`
	Ops        int64        `json:"ops"`
	Bytes      int64        `json:"bytes"`
	Errors     int64        `json:"errors"`
	Verify     VerifyCounts `json:"verify"`
	Latency    *Histogram   `json:"-"`
	FirstError *ErrorRecord `json:"first_error,omitempty"`
	// FirstOK is the completion time of the first successful I/O.
	FirstOK time.Time `json:"first_ok"`
	// LongestStall between successful completions (zero before two).
	LongestStall Stall `json:"longest_stall"`
}

// Interval is one time-series bucket: the I/Os that completed in
// [Start+Index·Interval, Start+(Index+1)·Interval).
type Interval struct {
	Index   int
	Ops     int64
	Bytes   int64
	Errors  int64
	Latency *Histogram
}

// Result is what a run measured.
type Result struct {
	Config  Config
	Targets []TargetResult
	Start   time.Time
	Elapsed time.Duration

	Ops, Bytes            int64
	ReadOps, WriteOps     int64
	ReadBytes, WriteBytes int64
	Errors                int64
	FirstError            *ErrorRecord
	Verify                VerifyCounts

	// Latency of every successful I/O; ReadLatency and WriteLatency split
	// it by direction.
	Latency, ReadLatency, WriteLatency *Histogram
	// Series has one bucket per Config.Interval from Start, empty buckets
	// included, up to the last completion.
	Series []Interval
	// Marks holds, per Handle.Mark call, the first completions after it.
	Marks []MarkResult
}

// BytesPerSecond is the aggregate throughput over the whole run.
func (r *Result) BytesPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Elapsed.Seconds()
}

// IOPS is the aggregate rate of successful I/Os over the whole run.
func (r *Result) IOPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// VerifyErr returns nil when every checked unit verified (or the run did not
// verify), otherwise an error wrapping ErrVerify with the counts.
func (r *Result) VerifyErr() error {
	if !r.Config.Verify {
		return nil
	}
	if bad := r.Verify.Bad(r.Config.AllowUnwritten); bad > 0 {
		v := r.Verify
		return fmt.Errorf("%d of %d units bad (corrupt %d, misplaced %d, stale %d, unwritten %d): %w",
			bad, v.Checked, v.Corrupt, v.Misplaced, v.Stale, v.Unwritten, ErrVerify)
	}
	return nil
}

// series grows on demand; workers look buckets up without a lock.
type series struct {
	mu      sync.Mutex
	buckets atomic.Pointer[[]*seriesBucket]
}

type seriesBucket struct {
	ops, bytes, errors atomic.Int64
	lat                *Histogram
}

func (s *series) get(i int) *seriesBucket {
	if p := s.buckets.Load(); p != nil && i < len(*p) {
		return (*p)[i]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var cur []*seriesBucket
	if p := s.buckets.Load(); p != nil {
		cur = *p
	}
	if i < len(cur) {
		return cur[i]
	}
	n := 2 * len(cur)
	if n <= i {
		n = i + 16
	}
	next := make([]*seriesBucket, n)
	copy(next, cur)
	for j := len(cur); j < n; j++ {
		next[j] = &seriesBucket{lat: NewHistogram()}
	}
	s.buckets.Store(&next)
	return next[i]
}

type targetState struct {
	t       Target
	region  int64
	dev     uint64
	bs      int
	claimed atomic.Int64
	// Counters and histograms are per target so that targets do not
	// share cache lines; finish adds them up.
	rops, wops     atomic.Int64
	rbytes, wbytes atomic.Int64
	errors         atomic.Int64
	rlat, wlat     *Histogram
	lastOK         atomic.Int64 // ns since start of the latest successful completion, -1 none
	firstOK        atomic.Int64
	mu             sync.Mutex
	firstErr       *ErrorRecord
	stall          Stall                                         // guarded by mu
	stallNs        atomic.Int64                                  // stall.Duration, for the lock-free check
	marks          [MaxMarks]struct{ done, issued atomic.Int64 } // ns since start, -1 none
}

type run struct {
	cfg       Config
	start     time.Time
	now       func() time.Time
	stop      atomic.Bool
	errOnce   sync.Once
	err       error
	ser       series
	firstMu   sync.Mutex
	firstErr  *ErrorRecord
	lastIndex atomic.Int64
	nmarks    atomic.Int64
	markAt    [MaxMarks]atomic.Int64 // ns since start
}

const regionAlign = 4096

func (c *Config) check(targets []Target) error {
	if !c.Pattern.valid() {
		return fmt.Errorf("pattern %q: want one of seq-read, seq-write, rand-read, rand-write, mixed: %w", c.Pattern, ErrConfig)
	}
	if c.IOSize <= 0 || c.IOSize%512 != 0 {
		return fmt.Errorf("I/O size %d: want a positive multiple of 512: %w", c.IOSize, ErrConfig)
	}
	if c.Verify && c.IOSize%VerifyUnit != 0 {
		return fmt.Errorf("I/O size %d: verify mode needs a multiple of %d: %w", c.IOSize, VerifyUnit, ErrConfig)
	}
	if c.QueueDepth < 0 {
		return fmt.Errorf("queue depth %d: want at least 1: %w", c.QueueDepth, ErrConfig)
	}
	if c.ReadFraction < 0 || c.ReadFraction > 1 {
		return fmt.Errorf("read fraction %g: want a value in [0, 1]: %w", c.ReadFraction, ErrConfig)
	}
	if c.Duration <= 0 && c.ByteLimit <= 0 && c.Passes <= 0 {
		return fmt.Errorf("no stop condition: set Duration, ByteLimit or Passes: %w", ErrConfig)
	}
	if len(targets) == 0 {
		return fmt.Errorf("no targets: give at least one device: %w", ErrConfig)
	}
	seen := map[string]bool{}
	for _, t := range targets {
		if t.Dev == nil {
			return fmt.Errorf("target %q has no device: %w", t.ID, ErrConfig)
		}
		if seen[t.ID] {
			return fmt.Errorf("target id %q used twice: ids must be unique in a run: %w", t.ID, ErrConfig)
		}
		seen[t.ID] = true
		bs := t.Dev.BlockSize()
		if bs <= 0 || regionAlign%bs != 0 || c.IOSize%bs != 0 {
			return fmt.Errorf("target %q: block size %d must divide both 4096 and the I/O size %d: %w", t.ID, bs, c.IOSize, ErrConfig)
		}
		if t.Offset < 0 || t.Length < 0 || t.Offset%regionAlign != 0 || t.Length%regionAlign != 0 {
			return fmt.Errorf("target %q: region offset %d length %d must be non-negative multiples of 4096: %w", t.ID, t.Offset, t.Length, ErrConfig)
		}
		size := t.Dev.Size()
		l := t.Length
		if l == 0 {
			l = (size - t.Offset) / regionAlign * regionAlign
		}
		if t.Offset+l > size {
			return fmt.Errorf("target %q: region [%d, %d) extends past the device size %d: %w", t.ID, t.Offset, t.Offset+l, size, ErrConfig)
		}
		if l < int64(c.IOSize) {
			return fmt.Errorf("target %q: region of %d bytes is smaller than one %d-byte I/O: %w", t.ID, l, c.IOSize, ErrConfig)
		}
	}
	return nil
}

// MaxMarks is how many marks one run can hold (see Handle.Mark).
const MaxMarks = 8

// ErrTooManyMarks: Handle.Mark was called more than MaxMarks times.
var ErrTooManyMarks = errors.New("bench: too many marks in one run")

// Handle is a run in progress, started by Start.
type Handle struct {
	r      *run
	ts     []*targetState
	counts [][]VerifyCounts
	done   chan struct{}
	res    *Result
	log    *slog.Logger
	markMu sync.Mutex
	labels []string
}

// MarkResult is what followed one Handle.Mark call on each target.
type MarkResult struct {
	Label   string       `json:"label"`
	At      time.Time    `json:"at"`
	Targets []TargetMark `json:"targets"`
}

// TargetMark is the first successful completions on one target after a
// mark: of any I/O (FirstDone; it may have been in flight at the mark) and
// of an I/O issued after the mark (FirstIssued). Zero when none.
type TargetMark struct {
	ID          string    `json:"id"`
	FirstDone   time.Time `json:"first_done"`
	FirstIssued time.Time `json:"first_issued"`
}

// Resumed returns FirstIssued - At for target id: how long after the mark
// (say, a node kill) the first I/O that was issued after it completed.
// ok is false if none did or the target is unknown.
func (m MarkResult) Resumed(id string) (d time.Duration, ok bool) {
	for _, t := range m.Targets {
		if t.ID == id && !t.FirstIssued.IsZero() {
			return t.FirstIssued.Sub(m.At), true
		}
	}
	return 0, false
}

// Run is Start followed by Wait.
func Run(ctx context.Context, cfg Config, targets []Target) (*Result, error) {
	h, err := Start(ctx, cfg, targets)
	if err != nil {
		return nil, err
	}
	return h.Wait()
}

// Start checks the configuration and starts the load: QueueDepth workers
// per target, all at once, until a stop condition or ctx ends. The hot path
// (issue, time, record) allocates nothing; the time series grows by whole
// blocks of buckets as the run proceeds.
//
// A context cancellation ends the run normally (the result covers what
// completed). An I/O error ends it with that error unless TolerateErrors;
// Wait returns the partial result with it. Verification failures never end
// a run; see Result.VerifyErr.
func Start(ctx context.Context, cfg Config, targets []Target) (*Handle, error) {
	if cfg.QueueDepth == 0 {
		cfg.QueueDepth = 1
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.ErrorBackoff <= 0 {
		cfg.ErrorBackoff = time.Millisecond
	}
	if err := cfg.check(targets); err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	log := cfg.logger()
	r := &run{cfg: cfg, now: now}
	ts := make([]*targetState, len(targets))
	for i, t := range targets {
		l := t.Length
		if l == 0 {
			l = (t.Dev.Size() - t.Offset) / regionAlign * regionAlign
		}
		st := &targetState{t: t, region: l, dev: DeviceHash(t.ID), bs: t.Dev.BlockSize(), rlat: NewHistogram(), wlat: NewHistogram()}
		st.lastOK.Store(-1)
		st.firstOK.Store(-1)
		for m := range st.marks {
			st.marks[m].done.Store(-1)
			st.marks[m].issued.Store(-1)
		}
		ts[i] = st
	}
	r.ser.get(0)
	r.start = now()
	log.Info("bench run start", "pattern", cfg.Pattern, "io_size", cfg.IOSize, "qd", cfg.QueueDepth, "targets", len(targets), "verify", cfg.Verify)

	h := &Handle{r: r, ts: ts, counts: make([][]VerifyCounts, len(ts)), done: make(chan struct{}), log: log}
	var wg sync.WaitGroup
	for i, st := range ts {
		h.counts[i] = make([]VerifyCounts, cfg.QueueDepth)
		for w := 0; w < cfg.QueueDepth; w++ {
			wk := newWorker(r, st, i, w, &h.counts[i][w])
			if wk == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				wk.loop(ctx)
			}()
		}
	}
	workersDone := make(chan struct{})
	go func() {
		// Workers poll only r.stop: cheaper than ctx.Err on every I/O.
		select {
		case <-ctx.Done():
			r.stop.Store(true)
		case <-workersDone:
		}
	}()
	go func() {
		wg.Wait()
		close(workersDone)
		h.finish()
		close(h.done)
	}()
	return h, nil
}

// Mark records an instant (a node kill, a path change) and returns it. The
// result then reports, per target, the first completions after it (see
// MarkResult). At most MaxMarks per run; marks made after the run ended
// are not reported.
func (h *Handle) Mark(label string) (time.Time, error) {
	h.markMu.Lock()
	defer h.markMu.Unlock()
	n := len(h.labels)
	if n >= MaxMarks {
		return time.Time{}, fmt.Errorf("mark %q would be number %d, the limit is %d: %w", label, n+1, MaxMarks, ErrTooManyMarks)
	}
	at := h.r.now()
	h.r.markAt[n].Store(int64(at.Sub(h.r.start)))
	h.labels = append(h.labels, label)
	h.r.nmarks.Store(int64(n + 1))
	return at, nil
}

// Done is closed when the run has ended and Wait will not block.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Wait blocks until the run ends and returns its result (see Start).
func (h *Handle) Wait() (*Result, error) {
	<-h.done
	return h.res, h.r.err
}

func (h *Handle) finish() {
	r, ts, cfg := h.r, h.ts, h.r.cfg
	elapsed := r.now().Sub(r.start)
	res := &Result{
		Config: cfg, Start: r.start, Elapsed: elapsed,
		Latency: NewHistogram(), ReadLatency: NewHistogram(), WriteLatency: NewHistogram(),
		FirstError: r.firstErr,
	}
	at := func(ns int64) time.Time {
		if ns < 0 {
			return time.Time{}
		}
		return r.start.Add(time.Duration(ns))
	}
	for i, st := range ts {
		tr := TargetResult{
			ID: st.t.ID, Ops: st.rops.Load() + st.wops.Load(), Bytes: st.rbytes.Load() + st.wbytes.Load(), Errors: st.errors.Load(),
			Latency: NewHistogram(), FirstError: st.firstErr, LongestStall: st.stall,
			FirstOK: at(st.firstOK.Load()),
		}
		tr.Latency.Merge(st.rlat)
		tr.Latency.Merge(st.wlat)
		res.Latency.Merge(tr.Latency)
		res.ReadLatency.Merge(st.rlat)
		res.WriteLatency.Merge(st.wlat)
		res.ReadOps += st.rops.Load()
		res.WriteOps += st.wops.Load()
		res.ReadBytes += st.rbytes.Load()
		res.WriteBytes += st.wbytes.Load()
		for _, c := range h.counts[i] {
			tr.Verify.add(c)
		}
		res.Verify.add(tr.Verify)
		res.Errors += tr.Errors
		res.Targets = append(res.Targets, tr)
	}
	res.Ops = res.ReadOps + res.WriteOps
	res.Bytes = res.ReadBytes + res.WriteBytes
	h.markMu.Lock()
	for m, label := range h.labels {
		mr := MarkResult{Label: label, At: at(r.markAt[m].Load())}
		for _, st := range ts {
			mr.Targets = append(mr.Targets, TargetMark{ID: st.t.ID, FirstDone: at(st.marks[m].done.Load()), FirstIssued: at(st.marks[m].issued.Load())})
		}
		res.Marks = append(res.Marks, mr)
	}
	h.markMu.Unlock()
	last := int(r.lastIndex.Load())
	if p := r.ser.buckets.Load(); p != nil {
		for i := 0; i <= last && i < len(*p); i++ {
			b := (*p)[i]
			res.Series = append(res.Series, Interval{Index: i, Ops: b.ops.Load(), Bytes: b.bytes.Load(), Errors: b.errors.Load(), Latency: b.lat})
		}
	}
	h.log.Info("bench run end", "ops", res.Ops, "bytes", res.Bytes, "errors", res.Errors, "elapsed", elapsed)
	h.res = res
}

type worker struct {
	r      *run
	st     *targetState
	w      int
	vc     *VerifyCounts
	rng    *rand.Rand
	buf    []byte
	lo, hi int64 // sequential share, relative to the region
	pos    int64
	slots  int64 // random: number of slots this worker owns
	qd     int64
	passes int64
	ios    int64 // I/Os issued (random patterns' pass accounting)
	// lastIdx is the newest series bucket this worker has published.
	lastIdx int
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+regionAlign)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (regionAlign - 1))
	if off != 0 {
		off = regionAlign - off
	}
	return b[off : off+n : off+n]
}

func newWorker(r *run, st *targetState, ti, w int, vc *VerifyCounts) *worker {
	cfg := r.cfg
	qd := int64(cfg.QueueDepth)
	wk := &worker{r: r, st: st, w: w, vc: vc, qd: qd,
		rng: rand.New(rand.NewPCG(cfg.Seed^uint64(ti)<<32, uint64(w)+1)),
		buf: alignedBuf(cfg.IOSize)}
	if (cfg.Pattern == SeqWrite || cfg.Pattern == RandWrite || cfg.Pattern == Mixed) && !cfg.Verify {
		// Incompressible, non-zero data, so that no layer can shortcut
		// the writes (zero detection, compression, dedupe).
		for i := 0; i+8 <= len(wk.buf); i += 8 {
			binary.LittleEndian.PutUint64(wk.buf[i:], wk.rng.Uint64())
		}
	}
	if cfg.Pattern.sequential() {
		per := st.region / regionAlign / qd * regionAlign
		wk.lo = int64(w) * per
		wk.hi = wk.lo + per
		if int64(w) == qd-1 {
			wk.hi = st.region
		}
		if wk.hi <= wk.lo {
			return nil
		}
		wk.pos = wk.lo
		return wk
	}
	n := st.region / int64(cfg.IOSize)
	wk.slots = (n - int64(w) + qd - 1) / qd
	if wk.slots <= 0 {
		return nil
	}
	return wk
}

// next picks the next I/O: relative offset, length, and whether it writes.
// ok is false once the worker's passes are done.
func (wk *worker) next() (off int64, n int, write bool, ok bool) {
	cfg := &wk.r.cfg
	if cfg.Pattern.sequential() {
		if wk.pos >= wk.hi {
			wk.passes++
			if cfg.Passes > 0 && wk.passes >= int64(cfg.Passes) {
				return 0, 0, false, false
			}
			wk.pos = wk.lo
		}
		off = wk.pos
		n = cfg.IOSize
		if rem := wk.hi - off; rem < int64(n) {
			n = int(rem)
		}
		wk.pos += int64(n)
		return off, n, cfg.Pattern == SeqWrite, true
	}
	if cfg.Passes > 0 && wk.ios >= wk.slots*int64(cfg.Passes) {
		return 0, 0, false, false
	}
	wk.ios++
	slot := wk.rng.Int64N(wk.slots)*wk.qd + int64(wk.w)
	off = slot * int64(cfg.IOSize)
	switch cfg.Pattern {
	case RandWrite:
		write = true
	case Mixed:
		write = wk.rng.Float64() >= cfg.ReadFraction
	}
	return off, cfg.IOSize, write, true
}

func (wk *worker) loop(ctx context.Context) {
	r, st, cfg := wk.r, wk.st, &wk.r.cfg
	for !r.stop.Load() {
		t0 := r.now()
		if cfg.Duration > 0 && t0.Sub(r.start) >= cfg.Duration {
			return
		}
		rel, n, write, ok := wk.next()
		if !ok {
			return
		}
		if cfg.ByteLimit > 0 && st.claimed.Add(int64(n)) > cfg.ByteLimit {
			return
		}
		off := st.t.Offset + rel
		p := wk.buf[:n]
		if write && cfg.Verify {
			for u := 0; u < n; u += VerifyUnit {
				FillUnit(p[u:u+VerifyUnit], st.dev, uint64(off+int64(u))/uint64(st.bs), cfg.Generation)
			}
		}
		t0 = r.now() // the pattern fill is not part of the I/O's latency
		var err error
		if write {
			_, err = st.t.Dev.WriteAt(p, off)
		} else {
			_, err = st.t.Dev.ReadAt(p, off)
		}
		t1 := r.now()
		since := t1.Sub(r.start)
		idx := int(since / cfg.Interval)
		if idx < 0 {
			idx = 0
		}
		if idx > wk.lastIdx {
			wk.lastIdx = idx
			for {
				l := r.lastIndex.Load()
				if int64(idx) <= l || r.lastIndex.CompareAndSwap(l, int64(idx)) {
					break
				}
			}
		}
		b := r.ser.get(idx)
		if err != nil {
			st.errors.Add(1)
			b.errors.Add(1)
			wk.recordError(t1, off, n, write, err)
			if !cfg.TolerateErrors {
				r.stop.Store(true)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(cfg.ErrorBackoff):
			}
			continue
		}
		lat := t1.Sub(t0)
		b.lat.Record(lat)
		b.ops.Add(1)
		b.bytes.Add(int64(n))
		if write {
			st.wlat.Record(lat)
			st.wops.Add(1)
			st.wbytes.Add(int64(n))
		} else {
			st.rlat.Record(lat)
			st.rops.Add(1)
			st.rbytes.Add(int64(n))
		}
		nowNs := int64(since)
		if nm := int(r.nmarks.Load()); nm > 0 {
			issuedNs := int64(t0.Sub(r.start))
			for m := 0; m < nm; m++ {
				mk := &st.marks[m]
				if at := r.markAt[m].Load(); nowNs >= at {
					storeMin(&mk.done, nowNs)
					if issuedNs >= at {
						storeMin(&mk.issued, nowNs)
					}
				}
			}
		}
		storeMin(&st.firstOK, nowNs)
		if prev := st.lastOK.Swap(nowNs); prev >= 0 && nowNs-prev > st.stallNs.Load() {
			st.mu.Lock()
			if gap := time.Duration(nowNs - prev); gap > st.stall.Duration {
				st.stall = Stall{From: r.start.Add(time.Duration(prev)), To: t1, Duration: gap}
				st.stallNs.Store(int64(gap))
			}
			st.mu.Unlock()
		}
		if !write && cfg.Verify {
			wk.check(p, off)
		}
	}
}

// storeMin lowers a to v, treating -1 as unset.
func storeMin(a *atomic.Int64, v int64) {
	for {
		c := a.Load()
		if (c >= 0 && c <= v) || a.CompareAndSwap(c, v) {
			return
		}
	}
}

func (wk *worker) check(p []byte, off int64) {
	st, cfg := wk.st, &wk.r.cfg
	for u := 0; u < len(p); u += VerifyUnit {
		lba := uint64(off+int64(u)) / uint64(st.bs)
		wk.vc.Checked++
		switch CheckUnit(p[u:u+VerifyUnit], st.dev, lba, cfg.MinGeneration) {
		case nil:
			wk.vc.OK++
		case ErrVerifyCorrupt:
			wk.vc.Corrupt++
		case ErrVerifyMisplaced:
			wk.vc.Misplaced++
		case ErrVerifyStale:
			wk.vc.Stale++
		case ErrVerifyUnwritten:
			wk.vc.Unwritten++
		}
	}
}

var sentinels = []struct {
	err  error
	name string
}{
	{blockdev.ErrNoPath, "ErrNoPath"},
	{blockdev.ErrFenced, "ErrFenced"},
	{blockdev.ErrTimeout, "ErrTimeout"},
	{blockdev.ErrIO, "ErrIO"},
	{blockdev.ErrClosed, "ErrClosed"},
	{blockdev.ErrOutOfRange, "ErrOutOfRange"},
	{blockdev.ErrMisaligned, "ErrMisaligned"},
	{context.Canceled, "context.Canceled"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
}

func (wk *worker) recordError(at time.Time, off int64, n int, write bool, err error) {
	r, st := wk.r, wk.st
	st.mu.Lock()
	seen := st.firstErr != nil
	st.mu.Unlock()
	if seen { // a target's first error has already been offered to the run
		return
	}
	rec := &ErrorRecord{At: at, Target: st.t.ID, Offset: off, Length: n, Write: write, Message: err.Error()}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			rec.Sentinel = s.name
			break
		}
	}
	st.mu.Lock()
	if st.firstErr == nil {
		st.firstErr = rec
	}
	st.mu.Unlock()
	r.firstMu.Lock()
	if r.firstErr == nil {
		r.firstErr = rec
		r.cfg.logger().Warn("bench: first I/O error", "target", rec.Target, "offset", off, "len", n, "write", write, "err", err)
		if !r.cfg.TolerateErrors {
			r.errOnce.Do(func() {
				r.err = fmt.Errorf("target %q: %s of %d bytes at offset %d failed (set TolerateErrors to count errors and continue): %w",
					st.t.ID, map[bool]string{true: "write", false: "read"}[write], n, off, err)
			})
		}
	}
	r.firstMu.Unlock()
}

func (c *Config) logger() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}
