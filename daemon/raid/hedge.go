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

// hedgeDeadline is max(SlowRead, 4 × the other present members' mean
// request time).
func (a *Array) hedgeDeadline(slow *member) time.Duration {
	var sum int64
	n := 0
	for r := range a.members {
		if m := a.member(r); m != nil && m != slow && present(m) {
			sum += m.lat.Load()
			n++
		}
	}
	d := a.pol.SlowRead
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
	d := a.hedgeDeadline(o.m)
	if r.timer == nil {
		r.timer = time.NewTimer(d)
	} else {
		r.timer.Reset(d)
	}
	select {
	case err := <-r.done:
		r.timer.Stop()
		if err = r.finish(o.buf, err); err != nil {
			return a.do(o) // the error path with its retries and member failure
		}
		dl := int64(time.Since(t0))
		l := o.m.lat.Load()
		o.m.lat.Store(l + (dl-l)/8)
		return nil
	case <-r.timer.C:
		if !r.state.CompareAndSwap(reqRunning, reqAbandoned) {
			if err := r.finish(o.buf, <-r.done); err != nil { // it ended just now
				return a.do(o)
			}
			return nil
		}
	}
	// Abandoned: the request's goroutine owns r and its buffer now.
	o.m.lat.Store(max(o.m.lat.Load(), int64(d)))
	a.slowReads.Add(1)
	err := a.readAround([]span{sp}, o.m)
	if errors.Is(err, errNoHedge) {
		return a.do(o)
	}
	return err
}
