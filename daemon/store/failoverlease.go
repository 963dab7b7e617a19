package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
		case <-f.s.clk.After(100 * time.Millisecond):
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
