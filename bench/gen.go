package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
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
