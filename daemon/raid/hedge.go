package raid

import (
	"errors"
	"time"
)

// Reads around a slow member (Policy.SlowRead). A read of one chunk piece
// runs on a pooled buffer of its own, like a timed request; when its
// member has not answered by the deadline, the request is abandoned to
// its goroutine (which returns the buffer when it ends) and the piece is
// reconstructed from the other members under the stripe lock. One slow
// or dying member then costs a read at most the deadline plus one
// reconstruction instead of stalling the array until IOTimeout.

// errNoHedge: the stripe cannot be read around the member (another
// member is out of sync there); wait for the member instead.
var errNoHedge = errors.New("no read around the member")

// hedgeDeadline is max(floor (SlowRead, SlowWrite), 4 × the other
// present members' mean request time).
func (a *Array) hedgeDeadline(slow *member, floor time.Duration) time.Duration {
	var sum int64
	n := 0
	for r := range a.members {
		if m := a.member(r); m != nil && m != slow && present(m) {
			sum += m.lat.Load()
			n++
		}
	}
	d := floor
	if n > 0 {
		d = max(d, time.Duration(4*sum/int64(n)))
	}
	return d
}

// readHedged reads o (a piece of span sp), reading around its member if
// it is slow.
func (a *Array) readHedged(o mop, sp span) error {
	r := timedPool.Get().(*timedReq)
	r.state.Store(reqRunning)
	r.ref, r.m, r.off, r.write, r.fua = getBufRef(int64(len(o.buf))), o.m, o.off, false, false
	r.buf = *r.ref
	t0 := time.Now()
	startOp(opJob{t: r})
	d := a.hedgeDeadline(o.m, a.pol.SlowRead)
	if r.timer == nil {
		r.timer = time.NewTimer(d)
	} else {
		r.timer.Reset(d)
	}
	select {
	case err := <-r.done:
		r.timer.Stop()
		if err = r.finish(o.buf, nil, err); err != nil {
			return a.do(o) // the error path with its retries and member failure
		}
		dl := int64(time.Since(t0))
		l := o.m.lat.Load()
		o.m.lat.Store(l + (dl-l)/8)
		return nil
	case <-r.timer.C:
		if !a.hedgeable(o.m) {
			return a.waitLate(r, o, t0)
		}
		if !r.state.CompareAndSwap(reqRunning, reqAbandoned) {
			if err := r.finish(o.buf, nil, <-r.done); err != nil { // it ended just now
				return a.do(o)
			}
			return nil
		}
	}
	// Abandoned: the request's goroutine owns r and its buffer now.
	o.m.late.Add(1)
	o.m.lat.Store(max(o.m.lat.Load(), int64(d)))
	a.slowReads.Add(1)
	err := a.readAround([]span{sp}, o.m)
	if errors.Is(err, errNoHedge) {
		return a.do(o)
	}
	return err
}

// hedgeable reports whether a late read of slow may be rebuilt from the
// other members: none of them has an abandoned request of its own still
// running. A rebuild reads every other member of the stripe (RAID-5, and
// RAID-6 through P), so reading around slow while another member is slow
// too would only trade one wait for a longer one: a read that is merely
// late on a healthy member (a busy node, a loaded host) would stall on
// the member that is really slow.
func (a *Array) hedgeable(slow *member) bool {
	for r := range a.members {
		if m := a.member(r); m != nil && m != slow && present(m) && m.late.Load() > 0 {
			return false
		}
	}
	return true
}

// waitLate waits for r (the read o, past its hedge deadline) on its own
// member, up to the I/O timeout when one is set; at that timeout the
// request is abandoned and o takes the error path of an ordinary read
// (its timeout fails the member).
func (a *Array) waitLate(r *timedReq, o mop, t0 time.Time) error {
	var err error
	if a.pol.IOTimeout <= 0 {
		err = <-r.done
	} else {
		r.timer.Reset(a.pol.IOTimeout)
		select {
		case err = <-r.done:
			r.timer.Stop()
		case <-r.timer.C:
			if r.state.CompareAndSwap(reqRunning, reqAbandoned) {
				o.m.late.Add(1)
				return a.do(o)
			}
			err = <-r.done // it ended just now
		}
	}
	if err = r.finish(o.buf, nil, err); err != nil {
		return a.do(o)
	}
	dl := int64(time.Since(t0))
	l := o.m.lat.Load()
	o.m.lat.Store(l + (dl-l)/8)
	return nil
}
