package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/clock"
)

// LeaseStats describes how a lease's renewals went.
type LeaseStats struct {
	Renewals   int           // successful renewals
	LongestGap time.Duration // longest time between the starts of two successive successful renewals
	Last       time.Time     // start of the last successful renewal
	// Rejoins counts leases revoked while they were being renewed and
	// replaced by a new one in time (see keeper.rejoin).
	Rejoins int
}

// keeper renews one lease until stopped and closes lost, from a local
// timer, when deadline−margin passes with no successful renewal.
type keeper struct {
	s      *Store
	what   string // names the lease in messages: `node "A"`
	margin time.Duration
	tm     renewTiming
	// onRenew is called (from the keeper's goroutine) after each
	// successful renewal.
	onRenew func(r renewal)
	// rejoin, when set, replaces a lease that the store revoked before
	// its deadline (no correct etcd leader expires it that early: an
	// etcd leader that was frozen and thaws revokes every lease it
	// believes expired, etcd issues #12528 and #15247). It must be done
	// by the start of the last renewal + grace − margin (grace is the
	// TTL: the local deadline − margin, the instant Lost would close
	// anyway): watchers of the node keys hold a deletion back for grace
	// (WatchNodes), so nobody acts on it before; later, Lost closes as
	// usual. Renewals after the revoke (their answers may come late, the
	// store being busy) only make the window shorter, never the node's
	// own lease.
	rejoin func(ctx context.Context) (id clientv3.LeaseID, sent time.Time, ttl time.Duration, err error)
	grace  time.Duration

	cancel context.CancelFunc
	done   chan struct{}
	lost   chan struct{}

	mu       sync.Mutex
	idLocked clientv3.LeaseID // the lease kept now (rejoin replaces it)
	deadline time.Time
	lostErr  error
	timer    clock.Timer
	stats    LeaseStats
}

// keep starts renewing lease id of ttl, last renewed (or granted) by a
// request sent at start.
func (s *Store) keep(id clientv3.LeaseID, what string, ttl, margin time.Duration, start time.Time, onRenew func(renewal),
	rejoin func(context.Context) (clientv3.LeaseID, time.Time, time.Duration, error)) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	tm := timingFor(ttl)
	// A slow member's late answer still counts (the lease runs from the
	// attempt's start), up to half the lease: the attempt's deadline grows
	// with the election timeout as the other per-member deadlines do.
	tm.call = min(s.patient(tm.call), max(tm.call, ttl/2))
	k := &keeper{s: s, idLocked: id, what: what, margin: margin, tm: tm, onRenew: onRenew, rejoin: rejoin, grace: NodeGoneGrace(ttl),
		cancel: cancel, done: make(chan struct{}), lost: make(chan struct{}),
		deadline: start.Add(ttl), stats: LeaseStats{Last: start}}
	k.mu.Lock()
	k.timer = s.clk.AfterFunc(k.deadline.Add(-margin).Sub(s.now()), k.expire)
	k.mu.Unlock()
	go k.run(ctx)
	return k
}

// expire runs on the local timer at deadline−margin.
func (k *keeper) expire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	fence := k.deadline.Add(-k.margin)
	if now := k.s.now(); now.Before(fence) {
		k.timer.Reset(fence.Sub(now)) // a renewal moved the deadline meanwhile
		return
	}
	k.markLostLocked(fmt.Errorf("%s: no renewal since the deadline %s minus margin %s (last renewal sent %s, lease %x)",
		k.what, k.deadline.Format(time.RFC3339Nano), k.margin, k.stats.Last.Format(time.RFC3339Nano), int64(k.idLocked)))
}

func (k *keeper) markLostLocked(err error) {
	select {
	case <-k.lost:
	default:
		k.lostErr = err
		close(k.lost)
		k.s.log.Warn("lease lost", "lease", k.what, "err", err)
	}
}

func (k *keeper) markLost(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.markLostLocked(err)
}

// renewed records a successful renewal; false if the lease was already
// given up for lost.
func (k *keeper) renewed(r renewal) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.lost:
		return false
	default:
	}
	if r.sent.After(k.stats.Last) {
		gap := r.sent.Sub(k.stats.Last)
		if gap > k.stats.LongestGap {
			k.stats.LongestGap = gap
		}
		if gap > 3*k.tm.every {
			k.s.log.Info("lease renewal late", "lease", k.what, "gap", gap, "via", r.ep)
		}
		k.stats.Last = r.sent
	}
	k.stats.Renewals++
	if dl := r.sent.Add(r.ttl); dl.After(k.deadline) {
		k.deadline = dl
		k.timer.Reset(dl.Add(-k.margin).Sub(k.s.now()))
	}
	return true
}

func (k *keeper) run(ctx context.Context) {
	defer close(k.done)
	results := make(chan renewal, maxAttempts)
	inflight := 0
	k.mu.Lock()
	next := k.stats.Last.Add(k.tm.every)
	k.mu.Unlock()
	t := k.s.clk.NewTimer(0)
	defer t.Stop()
	for {
		t.Reset(max(next.Sub(k.s.now()), 0))
		select {
		case <-ctx.Done():
			return
		case <-k.lost:
			return
		case r := <-results:
			inflight--
			switch {
			case r.err == nil:
				if !k.renewed(r) {
					return
				}
				k.mu.Lock()
				next = k.stats.Last.Add(k.tm.every)
				k.mu.Unlock()
				if k.onRenew != nil {
					k.onRenew(r)
				}
			case r.id != k.currentID():
				// An attempt for a lease replaced meanwhile: ignore.
			case errors.Is(r.err, rpctypes.ErrLeaseNotFound):
				if k.tryRejoin(ctx) {
					k.mu.Lock()
					next = k.stats.Last.Add(k.tm.every)
					k.mu.Unlock()
					continue
				}
				if k.rejoin != nil {
					k.markLost(fmt.Errorf("%s: the store expired or revoked lease %x and it was not replaced in time: %w", k.what, int64(r.id), r.err))
				} else {
					k.markLost(fmt.Errorf("%s: the store expired lease %x: %w", k.what, int64(r.id), r.err))
				}
				return
			default:
				k.s.log.Debug("lease renewal failed", "lease", k.what, "err", r.err)
				if soon := k.s.now().Add(k.tm.retry); soon.Before(next) {
					next = soon
				}
			}
		case <-t.C():
			if inflight < maxAttempts {
				inflight++
				id := k.currentID()
				go func() { results <- k.s.renewAttempt(ctx, id, k.tm) }()
			}
			next = k.s.now().Add(k.tm.retry)
		}
	}
}

func (k *keeper) currentID() clientv3.LeaseID {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.idLocked
}

// tryRejoin replaces a revoked lease if that can be done in time; false
// when it cannot (then the lease is lost).
func (k *keeper) tryRejoin(ctx context.Context) bool {
	if k.rejoin == nil {
		return false
	}
	k.mu.Lock()
	by := k.stats.Last.Add(k.grace - k.margin)
	old := k.idLocked
	last := k.stats.Last
	k.mu.Unlock()
	if now := k.s.now(); !now.Before(by) {
		k.s.log.Warn("lease revoked or expired, seen only after the time by which it could be replaced",
			"lease", k.what, "old", fmt.Sprintf("%x", int64(old)), "last_renewal", last.Format(time.RFC3339Nano),
			"replace_by", by.Format(time.RFC3339Nano), "late_by", now.Sub(by))
		return false
	}
	rctx, cancel := context.WithDeadline(ctx, by)
	began := k.s.now()
	id, sent, ttl, err := k.rejoin(rctx)
	cancel()
	took := k.s.now().Sub(began)
	if err == nil && !k.s.now().Before(by) {
		err = fmt.Errorf("registered again only after %s", by.Format(time.RFC3339Nano))
	}
	if err != nil {
		k.s.log.Warn("lease revoked before its deadline and not replaced in time", "lease", k.what, "old", fmt.Sprintf("%x", int64(old)),
			"last_renewal", last.Format(time.RFC3339Nano), "replace_by", by.Format(time.RFC3339Nano), "tried_for", took, "err", err)
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.lost:
		return false
	default:
	}
	k.idLocked = id
	k.stats.Last, k.stats.Rejoins = sent, k.stats.Rejoins+1
	k.deadline = sent.Add(ttl)
	k.timer.Reset(k.deadline.Add(-k.margin).Sub(k.s.now()))
	k.s.log.Warn("lease revoked before its deadline (an etcd leader that was frozen and thawed does that; etcd #15247); registered again under a new lease in time",
		"lease", k.what, "old", fmt.Sprintf("%x", int64(old)), "new", fmt.Sprintf("%x", int64(id)), "took", took, "spare", by.Sub(k.s.now()))
	return true
}

// stop ends the renewals and the local timer and waits for the loop.
func (k *keeper) stop() {
	k.cancel()
	<-k.done
	k.mu.Lock()
	k.timer.Stop()
	k.mu.Unlock()
}

func (k *keeper) Deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline
}

func (k *keeper) err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lostErr
}

func (k *keeper) held() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.lost:
		return false
	default:
	}
	return k.s.now().Before(k.deadline.Add(-k.margin))
}

func (k *keeper) Stats() LeaseStats {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stats
}
