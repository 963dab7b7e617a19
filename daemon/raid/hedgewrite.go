package raid

import (
	"fmt"
	"strings"
	"time"

	"tier0/daemon/blockdev"
)

// Writes around a member that stops answering (Policy.SlowWrite). A
// member that hangs without its connection failing (a partition, a hung
// node) used to stall every write to it until IOTimeout; reads were
// already served around it (hedge.go). With SlowWrite, a member write
// or flush of a RAID-5/6 array — data and parity chunks, partial parity
// log entries, write-intent bitmap blocks — and a read that a partial
// write needs, not completed by max(SlowWrite, 4 × the other members'
// mean request time), is treated as the IOTimeout path treats a timeout,
// only earlier: the request is abandoned to its goroutine (which keeps
// its buffer until the request ends, m.late counts it), the member is
// made missing (unreachable: its writes from then on are tracked for a
// resync, and ReAdd or Assemble takes it back), the survivors are
// flushed and the superblocks written before the request returns
// errGone, and the write completes degraded. Superblock writes have no
// deadline (sbwrite.go) and are not written around.
//
// Only while the array keeps its promise without the member: every
// other member active (RAID-5), or all but one (RAID-6). Otherwise the
// request waits for its member up to IOTimeout, as before. The check and
// the member's failure are one step under a.mu, so that two members
// hung at once cannot both be written around past the redundancy.

// slowErr: the request was abandoned at its slow deadline and its member
// marked missing by it (claimSlow); why is the failure's reason.
type slowErr struct{ why string }

func (e *slowErr) Error() string { return e.why }
func (e *slowErr) Unwrap() error { return blockdev.ErrTimeout }

// slowAfter is the slow deadline of a write-class request to m, 0 when
// requests to m are not written around.
func (a *Array) slowAfter(m *member) time.Duration {
	if a.pol.SlowWrite <= 0 || (a.geo.Level != RAID5 && a.geo.Level != RAID6) {
		return 0
	}
	d := a.hedgeDeadline(m, a.pol.SlowWrite)
	if a.pol.IOTimeout > 0 && d >= a.pol.IOTimeout {
		return 0
	}
	return d
}

// spareLocked reports whether the array keeps its redundancy promise
// without m (a.mu held): fewer other members not active (failed,
// missing, rebuilding) than the level tolerates losing.
func (a *Array) spareLocked(m *member) bool {
	n := 0
	for r := range a.members {
		if x := a.member(r); r != m.role && (x == nil || uint8(x.state.Load()) != roleActive) {
			n++
		}
	}
	return n < a.geo.Level.redundancy(a.geo.Members)
}

// monoBase anchors monoNow, monotonic nanoseconds.
var monoBase = time.Now()

func monoNow() int64 { return int64(time.Since(monoBase)) }

// begin and end track a timed request of m (busy, busySince, doneAt).
func (m *member) begin() {
	if m.busy.Add(1) == 1 {
		m.busySince.Store(monoNow())
	}
}

func (m *member) end() {
	m.doneAt.Store(monoNow())
	m.busy.Add(-1)
}

// silentSince reports whether m has had a request running since before
// t (monoNow) and none has ended since: it does not answer either.
func (m *member) silentSince(t int64) bool {
	return m.busy.Load() > 0 && m.busySince.Load() < t && m.doneAt.Load() < t
}

// claimSlow decides, at a request's slow deadline, whether it is written
// around. It abandons r (nil for a flush, which holds nothing of the
// caller's) and, when m is still present and the array can lose it,
// marks m missing with why, in one step under a.mu. A request to a
// member that another request failed already is abandoned too (the
// timeout path would fail it as well); marked is false then.
//
// later: another present member has been silent since before this
// request began (silentSince), so which one is hung is not known (a
// member merely slow while another is hung must not take the
// redundancy the hung one needs): decide again at the next deadline.
func (a *Array) claimSlow(m *member, r *timedReq, why string, began int64) (abandoned, marked, later bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.dead.Load() || a.stopped.Load() || a.fenced.Load() || a.member(m.role) != m {
		return false, false, false
	}
	failed := uint8(m.state.Load()) == roleFailed
	if !failed && (!present(m) || !a.spareLocked(m)) {
		return false, false, false
	}
	if !failed {
		for i := range a.members {
			if x := a.member(i); x != nil && x != m && present(x) && x.silentSince(began) {
				return false, false, true
			}
		}
	}
	if r != nil {
		if !r.state.CompareAndSwap(reqRunning, reqAbandoned) {
			return false, false, false // it ended just now
		}
		m.late.Add(1)
	}
	if !failed {
		a.markFailedLocked(m, why, true)
		m.recorded = make(chan struct{})
	}
	return true, !failed, false
}

// slowFailed records m's failure after claimSlow marked it (as failAs
// does after marking) and returns what memberErr would.
func (a *Array) slowFailed(m *member, why string) error {
	a.recordFailure(m, why, true)
	if a.stopped.Load() {
		return fmt.Errorf("raid %s: %w", fmtUUID(a.uuid), ErrStopped)
	}
	return errGone
}

// slowWhy is the reason a member is made missing for a slow request.
func slowWhy(op string, d time.Duration) string {
	return fmt.Sprintf("%s: no completion after %v (slow write): %v", op, d, blockdev.ErrTimeout)
}

// errAlreadyFailed: abandoned at the slow deadline (why), its member
// failed by another request.
func errAlreadyFailed(why string) error {
	return fmt.Errorf("%s; abandoned, the member was failed already: %w", strings.TrimSuffix(why, ": "+blockdev.ErrTimeout.Error()), blockdev.ErrTimeout)
}

// slowClock is a request's slow deadline: d (0 once the request is left
// to IOTimeout), its start, whether a stall of the process extended it,
// and the reason recorded when it made its member missing.
type slowClock struct {
	d        time.Duration
	t0       time.Time
	mono     int64 // t0 on monoNow's clock
	extended bool
	why      string
}

type slowVerdict int

const (
	slowWait      slowVerdict = iota // wait on: reset the timer to next (< 0: without bound)
	slowMarked                       // abandoned, and its member made missing (c.why)
	slowAbandoned                    // abandoned, its member failed already
)

// slowDue runs when a request's slow deadline passes. A deadline that
// falls in or right after a stall of the process (stall.go) is extended
// once by d, as IOTimeout's is; otherwise claimSlow decides. A request
// not written around waits for the rest of IOTimeout.
func (a *Array) slowDue(c *slowClock, m *member, r *timedReq, op string, began int64) (v slowVerdict, next time.Duration) {
	d := c.d
	if !c.extended && stalls.stalledSince(began) {
		c.extended = true
	} else {
		c.why = slowWhy(op, time.Since(c.t0).Round(time.Millisecond))
		abandoned, marked, later := a.claimSlow(m, r, c.why, c.mono)
		switch {
		case marked:
			return slowMarked, 0
		case abandoned:
			return slowAbandoned, 0
		case !later:
			c.d = 0
		}
	}
	if c.d > 0 && (a.pol.IOTimeout <= 0 || time.Since(c.t0)+d < a.pol.IOTimeout) {
		return slowWait, d
	}
	c.d = 0
	if a.pol.IOTimeout <= 0 {
		return slowWait, -1
	}
	return slowWait, max(a.pol.IOTimeout-time.Since(c.t0), time.Nanosecond)
}

// failedNow reports whether m is failed and still holds its role. With
// SlowWrite on, a write-class request to such a member (planned before
// it failed) is not sent: on a hung member it would wait a slow deadline
// of its own for nothing (the member's stripes are tracked for its
// resync either way). The caller takes the error path (memberErr), which
// waits until the failure is recorded.
func (a *Array) failedNow(m *member) bool {
	return uint8(m.state.Load()) == roleFailed && a.member(m.role) == m
}

// errNotSent: the request was not sent, its member is failed.
var errNotSent = fmt.Errorf("not sent, the member is failed (slow write): %w", blockdev.ErrTimeout)
