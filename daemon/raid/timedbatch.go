package raid

import (
	"errors"
	"time"

	"tier0/daemon/blockdev"
)

// timedBatch is the most requests runTimed starts at once.
const timedBatch = 16

// timedBatchOK reports whether run hands ops to runTimed: with an
// IOTimeout (every request a timed one, on a goroutine of its own) and
// no SlowWrite (whose slow deadlines claimSlow judges as they pass, one
// request at a time; those batches keep the workers).
func (a *Array) timedBatchOK(ops []mop) bool {
	return a.pol.IOTimeout > 0 && a.pol.SlowWrite <= 0 && len(ops) <= timedBatch
}

// runTimed runs a batch of timed requests: it starts them all at once,
// each on its own goroutine with its deadline running from then, and
// waits for each in turn. Handing requests to batch workers, each of
// which handed its request on to the request's own goroutine and waited
// there, cost two wake-ups per request instead of one. A request that
// fails takes the rest of callBuf's retries; the latency figures are
// those do keeps, from each request's own start and end. Errors as
// finish reports them.
func (a *Array) runTimed(ops []mop) error {
	var rs [timedBatch]*timedReq
	for i, o := range ops {
		rs[i] = a.startTimed(o.m, o.buf, o.parts, o.off, o.write, o.fua, 0)
	}
	var r batchResult
	for i, o := range ops {
		t0 := time.Now()
		op := "read"
		if o.write {
			op = "write"
		}
		took := int64(-1)
		err := a.waitTimed(rs[i], op, o.buf, o.parts, &took)
		rs[i] = nil
		if err != nil {
			if !errors.Is(err, blockdev.ErrFenced) && !errors.Is(err, blockdev.ErrTimeout) && a.pol.Retries > 0 {
				t0 = time.Now()
				took = -1
				err = a.callBufFrom(1, o.m, op, o.buf, o.parts, o.off, o.write, o.fua, o.slow)
			} else {
				err = a.memberErr(o.m, op, err)
			}
		}
		d := took
		if d < 0 {
			d = int64(time.Since(t0))
		}
		n := len(o.buf)
		if o.parts != nil {
			n = partsLen(o.parts)
		}
		o.m.noteRequest(d, n, o.merged)
		r.add(err)
	}
	return r.err()
}
