package raid

import (
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Member requests of one batch run in parallel: the caller runs the
// first itself and hands the others to parked worker goroutines (a new
// one only when none is idle), so that a batch allocates nothing — a
// go statement with a closure allocates per request.

// mop is one member request of a batch.
type mop struct {
	m     *member
	buf   []byte
	off   int64
	write bool
	fua   bool
	// slow: a read that a write needs; with Policy.SlowWrite it is
	// written around like the write (hedgewrite.go).
	slow bool
	// merged: runMerged's request for several (see noteUnit).
	merged bool
	// parts: a merged request with an IOTimeout is these requests' buffers
	// in order, gathered into the timed request's own buffer (buf is nil;
	// see callBuf).
	parts []mop
}

// fanBatch collects the results of one batch.
type fanBatch struct {
	wg   sync.WaitGroup
	errs []error
}

var batchPool = sync.Pool{New: func() any { return new(fanBatch) }}

// opJob is one unit of a batch for a worker: a single request, or (merged)
// one member's requests in order through runMerged.
type opJob struct {
	a      *Array
	o      mop
	ops    []mop
	merged bool
	sh     [][]byte // non-nil: ops are whole stripes for writeStripes
	b      *fanBatch
	i      int
	t      *timedReq // a timed request's own goroutine (no batch)
}

func (j *opJob) do() {
	if j.t != nil {
		j.t.run()
		return
	}
	var err error
	switch {
	case j.sh != nil:
		err = j.a.writeStripes(j.ops, j.sh)
	case j.merged:
		err = j.a.runMerged(j.ops)
	default:
		err = j.a.do(j.o)
	}
	j.b.errs[j.i] = err
	j.b.wg.Done()
}

// Parked workers wait each on a channel of its own and form a stack, the
// most recently parked on top (its stack and caches are the warmest).
// One unbuffered channel that every idle worker received from in a
// select with its idle timer made every hand-off take that channel's
// lock against the other workers parking on it and cost two timer
// operations per job: on 2 CPUs, a quarter of the samples of 4 KiB
// writes with member deadlines went to those locks.
type opParked struct {
	ch    chan opJob // one job, or closed: exit
	since int64      // monoNow when it parked
}

var opPool struct {
	mu      sync.Mutex
	idle    []*opParked // oldest first
	reaping bool        // reapOps is running
}

// opIdle is how long, in ns, a worker stays parked before it exits
// (tests shorten it; atomic, since a reaper may be running then).
var opIdle atomic.Int64

func init() { opIdle.Store(int64(2 * time.Second)) }

// startOp runs j on a parked worker, or on a new one when none is idle.
func startOp(j opJob) {
	opPool.mu.Lock()
	if n := len(opPool.idle); n > 0 {
		w := opPool.idle[n-1]
		opPool.idle[n-1] = nil
		opPool.idle = opPool.idle[:n-1]
		opPool.mu.Unlock()
		w.ch <- j // buffered: never blocks
		return
	}
	opPool.mu.Unlock()
	go opWorker(&opParked{ch: make(chan opJob, 1)}, j)
}

func opWorker(w *opParked, j opJob) {
	for {
		j.do()
		j = opJob{} // hold nothing of the job while parked
		opPool.mu.Lock()
		w.since = monoNow()
		opPool.idle = append(opPool.idle, w)
		if !opPool.reaping {
			opPool.reaping = true
			go reapOps()
		}
		opPool.mu.Unlock()
		var ok bool
		if j, ok = <-w.ch; !ok {
			return
		}
	}
}

// reapOps ends the workers parked for opIdle or longer, every opIdle/2,
// and returns once none is parked.
func reapOps() {
	for {
		idle := opIdle.Load()
		time.Sleep(time.Duration(idle / 2))
		opPool.mu.Lock()
		now, k := monoNow(), 0
		for k < len(opPool.idle) && now-opPool.idle[k].since >= idle {
			close(opPool.idle[k].ch)
			k++
		}
		n := copy(opPool.idle, opPool.idle[k:])
		clear(opPool.idle[n:])
		opPool.idle = opPool.idle[:n]
		if n == 0 {
			opPool.reaping = false
			opPool.mu.Unlock()
			return
		}
		opPool.mu.Unlock()
	}
}

func (a *Array) do(o mop) error {
	t0 := time.Now()
	var err error
	n := len(o.buf)
	switch {
	case o.parts != nil:
		n = partsLen(o.parts)
		op := "read"
		if o.write {
			op = "write"
		}
		err = a.callBuf(o.m, op, nil, o.parts, o.off, o.write, o.fua, o.slow)
	case o.write:
		err = a.mwrite(o.m, o.buf, o.off, o.fua)
	case o.slow:
		err = a.callBuf(o.m, "read", o.buf, nil, o.off, false, false, true)
	default:
		err = a.mread(o.m, o.buf, o.off)
	}
	o.m.noteRequest(int64(time.Since(t0)), n, o.merged)
	return err
}

// noteRequest adds a request of n bytes that took d ns to m's figures:
// lat, a moving average over about 8 requests (racy updates lose a
// sample), and unit (noteUnit).
func (m *member) noteRequest(d int64, n int, merged bool) {
	l := m.lat.Load()
	m.lat.Store(l + (d-l)/8)
	m.noteUnit(d, n, merged)
}

// noteUnit adds a request of n bytes that took d ns to m.unit, a floor
// estimate of its time per mergeUnit bytes: it follows a faster request
// at once and a slower one by at most 1/16 of itself per request (at
// least 1 ns), so that the host's stalls (a thread preempted for
// milliseconds in the middle of a memory member's copy) do not make a
// memory member look like a drive, while a member that really slows down
// is followed within some 50 requests. A merged request lowers it by at
// most 1/16 too: merging spreads a drive's cost per request over its
// chunks, which at once would make a fast drive look like memory and
// stop the merging that made it look so (a file member on this VM's
// virtual disk took about 9 µs per 64 KiB in merged 1 MiB reads and 40 µs
// for a 64 KiB one).
func (m *member) noteUnit(d int64, n int, merged bool) {
	if n > mergeUnit {
		d = d * mergeUnit / int64(n)
	}
	d = max(d, 1)
	u := m.unit.Load()
	switch {
	case u == 0 || d <= u && !merged:
		u = d
	case d < u:
		u -= max((u-d)/16, 1)
	case d > u:
		u += max((min(d, 2*u)-u)/16, 1)
	}
	m.unit.Store(u)
}

// mergeUnit and mergeFrom: runMerged merges a member's contiguous
// requests only when the member takes mergeFrom or more per mergeUnit
// bytes (or has not been measured yet). Merging saves a drive or a
// fabric its fixed cost per request (tens of µs and more) at the price
// of a copy through a bounce buffer; a member that moves 64 KiB within
// 10 µs (memory, the page cache: over 6.5 GB/s) has no fixed cost worth
// saving, and the copy would double its work (BenchmarkSeqRead and
// BenchmarkSeqWrite with memory members, docs/PERFORMANCE.md).
const (
	mergeUnit = 64 << 10
	mergeFrom = 10 * time.Microsecond
)

// merges reports whether runMerged merges m's requests.
func merges(m *member) bool {
	u := m.unit.Load()
	return u == 0 || u >= int64(mergeFrom)
}

// inlineBelow: a batch whose members all answer faster than this on
// average runs its requests one after another on the caller's goroutine.
// Handing a request to another goroutine costs a wake-up — microseconds
// on an idle machine, up to milliseconds on a loaded one — which is more
// than a memory member or a page-cache hit takes for the whole request;
// drives and fabrics (tens of µs and more) keep the parallel fan-out.
const inlineBelow = 10 * time.Microsecond

// inline reports whether a batch runs on the caller's goroutine: with no
// IOTimeout (a timed request runs on a goroutine of its own), when the
// serial knob is set, or when every member answers within inlineBelow on
// average and either the batch holds at most inlineBytes or the array has
// a request in flight per CPU already (a large batch of fast members
// gains from parallel copies only while CPUs are idle; otherwise the
// hand-offs are all that parallel requests add).
func (a *Array) inline(ops []mop) bool {
	if a.pol.IOTimeout != 0 || !a.serial() && !fastMembers(ops) {
		return false
	}
	if a.serial() || a.busy() {
		return true
	}
	var n int
	for _, o := range ops {
		n += len(o.buf)
	}
	return n <= inlineBytes
}

// fastMembers reports whether every request of ops goes to a member that
// answers within inlineBelow on average.
func fastMembers(ops []mop) bool {
	for _, o := range ops {
		if o.m.lat.Load() >= int64(inlineBelow) {
			return false
		}
	}
	return true
}

// busy reports whether the array has at least one foreground request in
// flight per CPU.
func (a *Array) busy() bool { return a.fgInflight.Load() >= int64(cpus) }

// cpus is GOMAXPROCS when the process started (asking it each time takes
// the scheduler's lock).
var cpus = runtime.GOMAXPROCS(0)

// serial reports the test-only knob that runs every batch inline
// (replayKnobs).
func (a *Array) serial() bool { return a.pol.replay != nil && a.pol.replay.serial }

// inlineBytes bounds an inline batch.
const inlineBytes = 256 << 10

func (a *Array) runInline(ops []mop) error {
	var r batchResult
	for _, o := range ops {
		r.add(a.do(o))
	}
	return r.err()
}

func getBatch(n int) *fanBatch {
	b := batchPool.Get().(*fanBatch)
	if cap(b.errs) < n {
		b.errs = make([]error, n)
	}
	b.errs = b.errs[:n]
	return b
}

// finish waits for the batch and returns its error: a fencing or stop
// error if one occurred, else errGone when a member failed, else nil.
func (b *fanBatch) finish() error {
	b.wg.Wait()
	var r batchResult
	for i, e := range b.errs {
		b.errs[i] = nil
		r.add(e)
	}
	batchPool.Put(b)
	return r.err()
}

// batchResult combines the errors of a batch's requests as its callers
// report them: a fencing or stop error if one occurred (the first), else
// errGone when a member failed, else nil.
type batchResult struct{ gone, other error }

func (r *batchResult) add(err error) {
	switch {
	case err == nil:
	case errors.Is(err, errGone):
		r.gone = err
	case r.other == nil:
		r.other = err
	}
}

func (r *batchResult) err() error {
	if r.other != nil {
		return r.other
	}
	return r.gone
}

// run performs ops in parallel. It returns a fencing or stop error if one
// occurred, else errGone when a member failed, else nil.
func (a *Array) run(ops []mop) error {
	switch len(ops) {
	case 0:
		return nil
	case 1:
		return a.do(ops[0])
	}
	if a.inline(ops) {
		return a.runInline(ops)
	}
	if a.timedBatchOK(ops) {
		return a.runTimed(ops)
	}
	b := getBatch(len(ops))
	b.wg.Add(len(ops) - 1)
	for i := 1; i < len(ops); i++ {
		startOp(opJob{a: a, o: ops[i], b: b, i: i})
	}
	b.errs[0] = a.do(ops[0])
	return b.finish()
}

// runGrouped runs ops with one worker per member, each member's
// requests in their order (it reorders ops in place, stably by role).
func (a *Array) runGrouped(ops []mop) error {
	if len(ops) <= 1 {
		return a.run(ops)
	}
	slices.SortStableFunc(ops, func(x, y mop) int { return x.m.role - y.m.role })
	groups := 0
	for i := range ops {
		if i == 0 || ops[i].m != ops[i-1].m {
			groups++
		}
	}
	if groups == 1 {
		return a.runMerged(ops)
	}
	if a.inline(ops) {
		return a.runGroupsInline(ops)
	}
	b := getBatch(groups)
	b.wg.Add(groups - 1)
	var first []mop
	g := 0
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && ops[j].m == ops[i].m {
			j++
		}
		if g == 0 {
			first = ops[i:j]
		} else {
			startOp(opJob{a: a, ops: ops[i:j], merged: true, b: b, i: g})
		}
		g++
		i = j
	}
	b.errs[0] = a.runMerged(first)
	return b.finish()
}

// runGroupsInline runs ops (sorted by role) one member after another on
// the caller's goroutine. A member that fails ends only its own requests:
// the others' still run, as on the worker path (stopping at the first
// error left the members after it with old chunks and parity under an
// acknowledged write; TestMemberFailingUnderInlineFullStripeBatchKeepsOthersWrites).
// Errors as finish reports them.
func (a *Array) runGroupsInline(ops []mop) error {
	var r batchResult
	for i := 0; i < len(ops); {
		j := i + 1
		for j < len(ops) && ops[j].m == ops[i].m {
			j++
		}
		r.add(a.runMerged(ops[i:j]))
		i = j
	}
	return r.err()
}

// maxMerge bounds one merged member request.
const maxMerge = 4 << 20

// runMerged runs requests one after another, turning runs of one member's
// requests that are contiguous on the member (consecutive stripes) into
// one request through a bounce buffer: one large I/O costs a drive or a
// fabric much less than many chunk-sized ones, and a copy is cheap next
// to that (not next to a memory member's request: see merges).
func (a *Array) runMerged(ops []mop) error {
	for i := 0; i < len(ops); {
		j, n := i+1, int64(len(ops[i].buf))
		merge := merges(ops[i].m)
		for merge && j < len(ops) && ops[j].m == ops[i].m && ops[j].write == ops[i].write && ops[j].fua == ops[i].fua &&
			ops[j].off == ops[i].off+n && n+int64(len(ops[j].buf)) <= maxMerge {
			n += int64(len(ops[j].buf))
			j++
		}
		if j == i+1 {
			if err := a.do(ops[i]); err != nil {
				return err
			}
			i = j
			continue
		}
		if a.pol.IOTimeout > 0 {
			// The timed request has a buffer of its own already (the
			// late-buffer rule, memberio.go): it gathers the writes into
			// it and scatters a read from it, in place of the bounce
			// buffer and its second copy.
			o := ops[i]
			if err := a.do(mop{m: o.m, off: o.off, write: o.write, fua: o.fua, slow: o.slow, merged: true, parts: ops[i:j]}); err != nil {
				return err
			}
			i = j
			continue
		}
		ref := getBufRef(n)
		bounce := *ref
		if ops[i].write {
			pos := 0
			for _, o := range ops[i:j] {
				pos += copy(bounce[pos:], o.buf)
			}
		}
		err := a.do(mop{m: ops[i].m, buf: bounce, off: ops[i].off, write: ops[i].write, fua: ops[i].fua, slow: ops[i].slow, merged: true})
		if err == nil && !ops[i].write {
			pos := 0
			for _, o := range ops[i:j] {
				pos += copy(o.buf, bounce[pos:])
			}
		}
		putBufRef(ref)
		if err != nil {
			return err
		}
		i = j
	}
	return nil
}
