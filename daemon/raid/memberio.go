package raid

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
)

// call runs one member request that uses no buffer (a flush) with the
// retry and timeout policy. At the deadline the member is failed and call
// returns; the request may go on in its goroutine, touching nothing of
// the caller's.
func (a *Array) call(m *member, op string, f func() error) error {
	var err error
	for attempt := 0; ; attempt++ {
		slow := a.slowAfter(m) // a flush is written around like a write
		if slow > 0 && a.failedNow(m) {
			err = errNotSent
			break
		}
		if a.pol.IOTimeout > 0 || slow > 0 {
			done := make(chan error, 1)
			go func() {
				m.begin()
				err := f()
				m.end()
				done <- err
			}()
			began := stalls.now()
			sc := slowClock{d: slow, t0: time.Now(), mono: monoNow()}
			t := time.NewTimer(a.pol.IOTimeout)
			if slow > 0 {
				t.Reset(slow)
			}
		wait:
			for extended := false; ; {
				select {
				case err = <-done:
					t.Stop()
					break wait
				case <-t.C:
					if sc.d > 0 {
						switch v, next := a.slowDue(&sc, m, nil, op, began); v {
						case slowMarked:
							return a.slowFailed(m, sc.why)
						case slowAbandoned:
							err = errAlreadyFailed(sc.why)
							break wait
						default:
							if next < 0 {
								err = <-done
								break wait
							}
							t.Reset(next)
							continue
						}
					}
					if !extended && stalls.stalledSince(began) {
						// the process, not the member, stalled
						extended = true
						t.Reset(a.pol.IOTimeout)
						continue
					}
					err = fmt.Errorf("no completion after %v: %w", a.pol.IOTimeout, blockdev.ErrTimeout)
					break wait
				}
			}
		} else {
			err = f()
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, blockdev.ErrFenced) || errors.Is(err, blockdev.ErrTimeout) || attempt >= a.pol.Retries {
			break
		}
	}
	return a.memberErr(m, op, err)
}

// timedReq is one member read or write with a deadline; it runs on a
// buffer of its own (see callBuf).
type timedReq struct {
	state atomic.Int32 // reqRunning, reqAbandoned, reqEnded
	done  chan error
	timer *time.Timer
	ref   *[]byte // the pooled buffer
	buf   []byte
	m     *member
	off   int64
	write bool
	fua   bool
	// The caller's, from startTimed to the end of waitTimed: the stall
	// clock and the slow deadline at the start.
	began int64
	sc    slowClock
	endAt int64 // monoNow when the request returned (run)
}

const (
	reqRunning int32 = iota
	reqAbandoned
	reqEnded
)

// memberIO reads or writes b at off on m.
func memberIO(m *member, b []byte, off int64, write, fua bool) error {
	if !write {
		_, err := m.dev.ReadAt(b, off)
		return err
	}
	if fua {
		if f, ok := m.dev.(blockdev.FUAWriter); ok {
			_, err := f.WriteAtFUA(b, off)
			return err
		}
		if _, err := m.dev.WriteAt(b, off); err != nil {
			return err
		}
		return m.dev.Flush()
	}
	_, err := m.dev.WriteAt(b, off)
	return err
}

// callBuf runs one member read or write of p at off with the retry and
// timeout policy.
//
// Buffer lifetime: a buffer handed to a member request is given back to
// its owner (the caller of ReadAt/WriteAt, or the scratch pool) only
// after the request has returned, never on a timer alone: a late
// completion (a C2HData arriving after the deadline) would otherwise
// write into memory that belongs to another request by then. Without a
// timeout the request runs on p and returns before callBuf does. With
// one, it runs on a pooled buffer of its own (one copy); at the deadline
// the member is failed at once and callBuf returns, and the request's
// goroutine owns that buffer from then on and returns it to the pool
// when the request ends.
//
// With Policy.SlowWrite, a write (or, with slowRead, a read that a write
// needs) also has a slow deadline (hedgewrite.go): abandoned there, its
// member is made missing and callBuf returns errGone.
//
// parts, when not nil, stands for p: the request is the concatenation of
// their buffers (runMerged's merged request with an IOTimeout), which the
// private buffer gathers (a write) or is scattered to (a read), as the
// copy of p would be. It needs the timed path: IOTimeout > 0.
func (a *Array) callBuf(m *member, op string, p []byte, parts []mop, off int64, write, fua, slowRead bool) error {
	return a.callBufFrom(0, m, op, p, parts, off, write, fua, slowRead)
}

// callBufFrom is callBuf from attempt first on (runTimed made the first).
func (a *Array) callBufFrom(first int, m *member, op string, p []byte, parts []mop, off int64, write, fua, slowRead bool) error {
	if parts != nil && a.pol.IOTimeout <= 0 {
		panic("raid: a gathered member request without an IOTimeout")
	}
	var err error
	for attempt := first; ; attempt++ {
		var slow time.Duration
		if write || slowRead {
			slow = a.slowAfter(m)
		}
		if slow > 0 && a.failedNow(m) {
			err = errNotSent
			break
		}
		if a.pol.IOTimeout > 0 || slow > 0 {
			err = a.timed(m, op, p, parts, off, write, fua, slow)
		} else {
			err = memberIO(m, p, off, write, fua)
		}
		if err == nil {
			return nil
		}
		if se := (*slowErr)(nil); errors.As(err, &se) {
			return a.slowFailed(m, se.why)
		}
		if errors.Is(err, blockdev.ErrFenced) || errors.Is(err, blockdev.ErrTimeout) || attempt >= a.pol.Retries {
			break
		}
	}
	return a.memberErr(m, op, err)
}

// timed runs one member request on a private copy of p under the I/O
// timeout. The request state (with its channel and timer) is pooled: the
// caller puts it back after a normal completion, the request's goroutine
// after an abandoned one (the caller no longer touches it then). With
// slow > 0 the request may be abandoned at that deadline too (claimSlow);
// it then returns a *slowErr when that made its member missing.
func (a *Array) timed(m *member, op string, p []byte, parts []mop, off int64, write, fua bool, slow time.Duration) error {
	return a.waitTimed(a.startTimed(m, p, parts, off, write, fua, slow), op, p, parts, nil)
}

// startTimed starts timed's request on its own goroutine, its deadline
// running from now.
func (a *Array) startTimed(m *member, p []byte, parts []mop, off int64, write, fua bool, slow time.Duration) *timedReq {
	n := len(p)
	if parts != nil {
		n = partsLen(parts)
	}
	r := timedPool.Get().(*timedReq)
	r.state.Store(reqRunning)
	r.ref, r.m, r.off, r.write, r.fua = getBufRef(int64(n)), m, off, write, fua
	r.buf = *r.ref
	if write {
		if parts == nil {
			copy(r.buf, p)
		} else {
			pos := 0
			for _, o := range parts {
				pos += copy(r.buf[pos:], o.buf)
			}
		}
	}
	r.began = stalls.now()
	r.sc = slowClock{d: slow, t0: time.Now(), mono: monoNow()}
	startOp(opJob{t: r})
	first := a.pol.IOTimeout
	if slow > 0 {
		first = slow
	}
	if r.timer == nil {
		r.timer = time.NewTimer(first)
	} else {
		r.timer.Reset(first)
	}
	return r
}

// waitTimed waits for r (from startTimed) under its deadlines and ends
// it: after it returns the caller no longer touches r.
//
// took, when not nil, receives how long the request ran when it returned
// (left alone otherwise).
func (a *Array) waitTimed(r *timedReq, op string, p []byte, parts []mop, took *int64) error {
	// Copied: once abandoned, r belongs to its goroutine.
	m, sc, began := r.m, r.sc, r.began
	for extended := false; ; {
		select {
		case err := <-r.done:
			r.timer.Stop()
			if took != nil {
				*took = r.endAt - sc.mono
			}
			return r.finish(p, parts, err)
		case <-r.timer.C:
			if sc.d > 0 {
				switch v, next := a.slowDue(&sc, m, r, op, began); v {
				case slowMarked:
					return &slowErr{why: sc.why}
				case slowAbandoned:
					return errAlreadyFailed(sc.why)
				default:
					if next < 0 {
						return r.finish(p, parts, <-r.done)
					}
					r.timer.Reset(next)
					continue
				}
			}
			if !extended && stalls.stalledSince(began) {
				// the process, not the member, stalled: see stall.go
				extended = true
				r.timer.Reset(a.pol.IOTimeout)
				continue
			}
			if r.state.CompareAndSwap(reqRunning, reqAbandoned) {
				m.late.Add(1)
				return fmt.Errorf("no completion after %v: %w", a.pol.IOTimeout, blockdev.ErrTimeout)
			}
			return r.finish(p, parts, <-r.done) // it ended just now
		}
	}
}

var timedPool = sync.Pool{New: func() any { return &timedReq{done: make(chan error, 1)} }}

func (r *timedReq) run() {
	m := r.m
	m.begin()
	err := memberIO(m, r.buf, r.off, r.write, r.fua)
	m.end()
	r.endAt = monoNow() // read by the caller after done
	if r.state.CompareAndSwap(reqRunning, reqEnded) {
		r.done <- err
		return
	}
	// Abandoned at the deadline: nobody else holds the buffer or r.
	r.m.late.Add(-1)
	putBufRef(r.ref)
	r.recycle()
}

// finish ends a request that has returned: a read's data goes to p, or
// to parts in order (see callBuf).
func (r *timedReq) finish(p []byte, parts []mop, err error) error {
	if err == nil && !r.write {
		if parts == nil {
			copy(p, r.buf)
		} else {
			pos := 0
			for _, o := range parts {
				pos += copy(o.buf, r.buf[pos:])
			}
		}
	}
	putBufRef(r.ref)
	r.recycle()
	return err
}

func (r *timedReq) recycle() {
	r.ref, r.buf, r.m = nil, nil, nil
	timedPool.Put(r)
}

func (a *Array) mread(m *member, p []byte, off int64) error {
	return a.callBuf(m, "read", p, nil, off, false, false, false)
}

func (a *Array) mwrite(m *member, p []byte, off int64, fua bool) error {
	return a.callBuf(m, "write", p, nil, off, true, fua, false)
}

// partsLen is the bytes of the requests in ps.
func partsLen(ps []mop) int {
	n := 0
	for _, o := range ps {
		n += len(o.buf)
	}
	return n
}
