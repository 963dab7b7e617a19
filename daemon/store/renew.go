package store

// Lease renewal that survives a hung etcd member.
//
// A frozen member (SIGSTOP, a soft lockup, a stalled disk) keeps its TCP
// connections open and answers nothing. The client's connection to it stays
// READY until gRPC keep-alive gives up on it, and grpc-go never pings more
// often than every 10 s (internal.KeepaliveMinPingTime), so a renewal that
// the round-robin balancer sends there hangs for 10–12 s — several lease
// TTLs. So renewals do not use the balanced connection nor a long-lived
// keep-alive stream: each attempt is one request on a stream of its own to
// one endpoint, over a connection per endpoint, with a deadline; when the
// first endpoint has not answered within a hedge delay the next one is
// asked as well, and the first answer wins. Attempts overlap when none
// answers: a new one starts every retry interval, so a member that stops
// answering costs one hedge delay, and a frozen raft leader costs the
// election plus one retry interval. The node's own view of its lease — the
// Lost channel — runs on a local timer, never on an RPC.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// endpoint is a connection to one etcd member, outside the client's
// balancer.
type endpoint struct {
	url   string
	lease pb.LeaseClient
	kv    clientv3.KV
	watch clientv3.Watcher
	close func() error
}

// endpoints holds one connection per member and remembers which one
// answered last (asked first next time).
type endpoints struct {
	eps  []*endpoint
	pref atomic.Int32
}

func (s *Store) dialEndpoints(urls []string) error {
	for _, u := range urls {
		conn, err := s.cli.Dial(u)
		if err != nil {
			s.closeEndpoints()
			return fmt.Errorf("store: connection to endpoint %s: %w", u, err)
		}
		w := clientv3.NewWatchFromWatchClient(pb.NewWatchClient(conn), s.cli)
		s.ep.eps = append(s.ep.eps, &endpoint{url: u, lease: pb.NewLeaseClient(conn),
			kv: clientv3.NewKVFromKVClient(pb.NewKVClient(conn), s.cli), watch: w,
			close: func() error { w.Close(); return conn.Close() }})
	}
	return nil
}

// closeEndpoints closes every member connection. The list itself stays:
// a call still in flight when the store closes (a session revoked by a
// goroutine that outlives Close, as the daemon's coordinator may) reads it
// and fails on a closed connection instead of racing with a write.
func (s *Store) closeEndpoints() {
	for _, e := range s.ep.eps {
		_ = e.close()
	}
}

// renewTiming is derived from the lease TTL.
type renewTiming struct {
	every time.Duration // between two renewals while they work
	retry time.Duration // start another attempt when none has answered for this long
	hedge time.Duration // within an attempt, ask the next endpoint after this long
	call  time.Duration // deadline of one attempt
}

// maxAttempts bounds the attempts in flight at once (each asks at most
// every endpoint once).
const maxAttempts = 4

func timingFor(ttl time.Duration) renewTiming {
	every := min(max(ttl/10, 100*time.Millisecond), time.Second)
	return renewTiming{every: every, retry: every / 2, hedge: every / 3, call: max(3*every, 500*time.Millisecond)}
}

// renewal is the outcome of one attempt.
type renewal struct {
	id   clientv3.LeaseID
	sent time.Time // when the attempt started (the lease runs at least TTL from then)
	ttl  time.Duration
	ep   string // the endpoint that answered
	err  error
}

// renewOn renews lease id once through one member: a stream of its own, one
// request, one answer.
func renewOn(ctx context.Context, lc pb.LeaseClient, id clientv3.LeaseID) (int64, error) {
	stream, err := lc.LeaseKeepAlive(ctx)
	if err != nil {
		return 0, rpctypes.Error(err)
	}
	if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
		return 0, rpctypes.Error(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return 0, rpctypes.Error(err)
	}
	_ = stream.CloseSend()
	if resp.TTL <= 0 {
		return 0, rpctypes.ErrLeaseNotFound
	}
	return resp.TTL, nil
}

// renewAttempt renews lease id through the first endpoint that answers
// within tm.call, asking one more endpoint every tm.hedge.
func (s *Store) renewAttempt(ctx context.Context, id clientv3.LeaseID, tm renewTiming) renewal {
	sent := s.now()
	eps := s.ep.eps
	n := len(eps)
	actx, cancel := context.WithTimeout(ctx, tm.call)
	defer cancel()
	res := make(chan renewal, n)
	first := int(s.ep.pref.Load())
	launched, failed := 0, 0
	launch := func() {
		i := (first + launched) % n
		launched++
		go func() {
			ttl, err := renewOn(actx, eps[i].lease, id)
			if err != nil {
				err = fmt.Errorf("%s: %w", eps[i].url, err)
			}
			res <- renewal{id: id, sent: sent, ttl: time.Duration(ttl) * time.Second, ep: eps[i].url, err: err}
			if err == nil {
				s.ep.pref.Store(int32(i))
			}
		}()
	}
	launch()
	hedge := time.NewTimer(tm.hedge)
	defer hedge.Stop()
	var errs []error
	for {
		var hc <-chan time.Time
		if launched < n {
			hc = hedge.C
		}
		select {
		case r := <-res:
			if r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound) {
				return r
			}
			errs = append(errs, r.err)
			if failed++; failed < launched {
				continue
			}
			if launched < n {
				launch()
				hedge.Reset(tm.hedge)
				continue
			}
			return renewal{id: id, sent: sent, err: fmt.Errorf("every member refused the renewal: %w", errors.Join(errs...))}
		case <-hc:
			launch()
			hedge.Reset(tm.hedge)
		case <-actx.Done():
			return renewal{id: id, sent: sent, err: fmt.Errorf("no member answered within %s (%d asked): %w", tm.call, launched, errors.Join(append(errs, actx.Err())...))}
		}
	}
}

// NodeGoneGrace is how long a watcher of the node keys holds back the
// deletion of one whose lease had ttl (WatchNodes, SettledNodes): the
// whole TTL. The deletion came after the node's last renewal, so a
// watcher acts on it no earlier than the store could have expired the
// lease had it not been revoked: a node whose lease was revoked before
// its deadline has its whole lease — until the start of its last renewal
// + TTL − margin, as without the revoke — to register again, and fences
// itself before then if it cannot (etcd #12528/#15247, docs/RELIABILITY.md
// problem 5). The cost: a real expiry is acted on TTL after it.
func NodeGoneGrace(ttl time.Duration) time.Duration { return ttl }

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
	timer    *time.Timer
	stats    LeaseStats
}

// keep starts renewing lease id of ttl, last renewed (or granted) by a
// request sent at start.
func (s *Store) keep(id clientv3.LeaseID, what string, ttl, margin time.Duration, start time.Time, onRenew func(renewal),
	rejoin func(context.Context) (clientv3.LeaseID, time.Time, time.Duration, error)) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{s: s, idLocked: id, what: what, margin: margin, tm: timingFor(ttl), onRenew: onRenew, rejoin: rejoin, grace: NodeGoneGrace(ttl),
		cancel: cancel, done: make(chan struct{}), lost: make(chan struct{}),
		deadline: start.Add(ttl), stats: LeaseStats{Last: start}}
	k.mu.Lock()
	k.timer = time.AfterFunc(k.deadline.Add(-margin).Sub(s.now()), k.expire)
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
	t := time.NewTimer(0)
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
		case <-t.C:
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

// onEndpoints runs op on one endpoint after the other (the last one that
// answered a renewal first), each try bounded by per, until one succeeds
// or ctx ends. For requests that may be repeated: a try that timed out
// may still be applied later.
func onEndpoints[T any](ctx context.Context, s *Store, per time.Duration, op func(context.Context, *endpoint) (T, error)) (T, error) {
	var zero T
	eps := s.ep.eps
	first := int(s.ep.pref.Load())
	var errs []error
	for i := 0; ; i++ {
		e := eps[(first+i)%len(eps)]
		cctx, cancel := context.WithTimeout(ctx, per)
		v, err := op(cctx, e)
		cancel()
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil {
			return zero, fmt.Errorf("%w (tries: %w)", ctx.Err(), errors.Join(errs...))
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrLeaseTTLTooLarge) {
			return zero, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", e.url, err))
		if len(errs) > 3*len(eps) {
			errs = errs[len(errs)-len(eps):]
		}
		if (i+1)%len(eps) == 0 {
			select { // every endpoint failed once: do not spin
			case <-ctx.Done():
				return zero, fmt.Errorf("%w (tries: %w)", ctx.Err(), errors.Join(errs...))
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// failoverLease replaces the client's Lease so that every lease kept
// through the client — concurrency sessions (the coordinator election) in
// particular — is renewed like a node's liveness lease, not on a
// long-lived stream that a frozen member can hang.
type failoverLease struct {
	clientv3.Lease // the client's own, for what is not overridden
	s              *Store

	mu      sync.Mutex
	grants  map[clientv3.LeaseID]renewal // grant time and TTL of leases granted here
	keepers map[*keeper]struct{}
	closed  bool
}

// grantTry bounds one Grant or Revoke request to one endpoint.
const grantTry = 2 * time.Second

func (f *failoverLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	sent := f.s.now()
	resp, err := onEndpoints(ctx, f.s, grantTry, func(c context.Context, e *endpoint) (*pb.LeaseGrantResponse, error) {
		r, err := e.lease.LeaseGrant(c, &pb.LeaseGrantRequest{TTL: ttl})
		return r, rpctypes.Error(err)
	})
	if err != nil {
		return nil, err
	}
	g := &clientv3.LeaseGrantResponse{ResponseHeader: resp.Header, ID: clientv3.LeaseID(resp.ID), TTL: resp.TTL, Error: resp.Error}
	f.mu.Lock()
	f.grants[g.ID] = renewal{sent: sent, ttl: time.Duration(g.TTL) * time.Second}
	f.mu.Unlock()
	return g, nil
}

func (f *failoverLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	f.mu.Lock()
	delete(f.grants, id)
	f.mu.Unlock()
	resp, err := onEndpoints(ctx, f.s, grantTry, func(c context.Context, e *endpoint) (*pb.LeaseRevokeResponse, error) {
		r, err := e.lease.LeaseRevoke(c, &pb.LeaseRevokeRequest{ID: int64(id)})
		return r, rpctypes.Error(err)
	})
	if err != nil {
		return nil, err
	}
	return (*clientv3.LeaseRevokeResponse)(resp), nil
}

// KeepAlive renews id until ctx ends or the lease is lost; the channel
// closes then. It closes when ttl−ttl/5 has passed since the start of the
// last successful renewal (as a node's liveness lease would fire Lost).
func (f *failoverLease) KeepAlive(ctx context.Context, id clientv3.LeaseID) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	f.mu.Lock()
	g, ok := f.grants[id]
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("keep-alive of lease %x on a closed client: %w", int64(id), clientv3.ErrKeepAliveHalted{Reason: context.Canceled})
	}
	if !ok { // granted elsewhere: learn its TTL from a first renewal
		g = f.s.renewAttempt(ctx, id, timingFor(time.Second))
		if g.err != nil {
			return nil, fmt.Errorf("first keep-alive of lease %x: %w", int64(id), g.err)
		}
	}
	ch := make(chan *clientv3.LeaseKeepAliveResponse, 16)
	k := f.s.keep(id, fmt.Sprintf("lease %x", int64(id)), g.ttl, g.ttl/5, g.sent, func(r renewal) {
		select {
		case ch <- &clientv3.LeaseKeepAliveResponse{ResponseHeader: &pb.ResponseHeader{}, ID: id, TTL: int64(r.ttl / time.Second)}:
		default: // nobody reads: drop, as the client's own lessor does
		}
	}, nil)
	f.mu.Lock()
	f.keepers[k] = struct{}{}
	f.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-k.lost:
		case <-k.done:
		}
		k.stop()
		f.mu.Lock()
		delete(f.keepers, k)
		f.mu.Unlock()
		close(ch)
	}()
	return ch, nil
}

func (f *failoverLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	for {
		r := f.s.renewAttempt(ctx, id, timingFor(time.Second))
		if r.err == nil {
			return &clientv3.LeaseKeepAliveResponse{ResponseHeader: &pb.ResponseHeader{}, ID: id, TTL: int64(r.ttl / time.Second)}, nil
		}
		if errors.Is(r.err, rpctypes.ErrLeaseNotFound) {
			return nil, r.err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("keep-alive of lease %x: %w", int64(id), r.err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *failoverLease) Close() error {
	f.mu.Lock()
	f.closed = true
	ks := make([]*keeper, 0, len(f.keepers))
	for k := range f.keepers {
		ks = append(ks, k)
	}
	f.mu.Unlock()
	for _, k := range ks {
		k.cancel()
	}
	return f.Lease.Close()
}
