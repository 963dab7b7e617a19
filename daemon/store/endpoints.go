package store

import (
	"context"
	"errors"
	"fmt"
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
			case <-s.clk.After(100 * time.Millisecond):
			}
		}
	}
}
