package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
	"unsafe"

	"tier0/daemon/blockdev"
)

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
