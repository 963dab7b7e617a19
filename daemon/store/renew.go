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
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
	hedge := s.clk.NewTimer(tm.hedge)
	defer hedge.Stop()
	var errs []error
	for {
		var hc <-chan time.Time
		if launched < n {
			hc = hedge.C()
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
