package store

// Requests that a hung etcd member cannot stall.
//
// The client's balancer sends a share of every request to each member, a
// frozen one included, and such a request hangs until gRPC keep-alive gives
// the connection up (10–12 s: renew.go). The store therefore replaces the
// client's KV and Watcher too: requests go over the per-member connections
// to the member that answered the last lease renewal (renewals find a live
// member within a fraction of a second), reads are retried on the next
// member after a per-try deadline, writes get a bound when the caller gave
// none, and a watch is cancelled — its channel closes, the callers' cue to
// re-read and watch again — when its member stops answering probes.

import (
	"context"
	"errors"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The per-member deadlines at the default election timeout (500 ms);
// Store.patient scales them with a longer one (an emulated machine's: a
// member that answers within its raft's own timescale is not hung).
const (
	readTry   = time.Second            // one read on one member
	writeMax  = 2 * time.Second        // one try of a write with no deadline of its own
	probeTry  = time.Second            // one probe of a watch's member
	probeLoop = 500 * time.Millisecond // between probes
)

// patient is d scaled by ElectionMs/500 (never below d): with
// control_plane.etcd.election at 5 s, a read try is 10 s and a watch's
// member is probed every 5 s, not twice a second.
func (s *Store) patient(d time.Duration) time.Duration {
	if k := time.Duration(s.opts.ElectionMs / 500); k > 1 {
		return d * k
	}
	return d
}

// retryable: the member did not answer in time or is unusable now (the
// request may be sent to another one).
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"code = Unavailable", "code = DeadlineExceeded", "etcdserver: no leader", "etcdserver: request timed out", "etcdserver: leader changed", "etcdserver: too many requests"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func (s *Store) preferred() *endpoint {
	eps := s.ep.eps
	return eps[int(s.ep.pref.Load())%len(eps)]
}

// readOn runs a read on the preferred member, then on the others in turn
// when one does not answer within readTry (patient), until ctx ends.
func readOn[T any](ctx context.Context, s *Store, op func(context.Context, clientv3.KV) (T, error)) (T, error) {
	eps := s.ep.eps
	first := int(s.ep.pref.Load())
	var zero T
	for i := 0; ; i++ {
		e := eps[(first+i)%len(eps)]
		cctx, cancel := context.WithTimeout(ctx, s.patient(readTry))
		v, err := op(cctx, e.kv)
		cancel()
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil || !retryable(err) {
			return zero, err
		}
		if (i+1)%len(eps) == 0 {
			select {
			case <-ctx.Done():
				return zero, err
			case <-s.clk.After(100 * time.Millisecond):
			}
		}
	}
}

// writeOn runs a write on the preferred member. With a deadline of the
// caller's it is sent once. Without one (the caller waits as long as it
// takes, e.g. while the cluster boots) each try is bounded by writeMax and
// the next goes to the member preferred then, so that a write never waits
// on a frozen member: a try that timed out may still be applied, so such
// a write may be applied twice (a put of the same value; a transaction
// whose compare then fails).
func writeOn[T any](ctx context.Context, s *Store, op func(context.Context, clientv3.KV) (T, error)) (T, error) {
	if _, ok := ctx.Deadline(); ok {
		return op(ctx, s.preferred().kv)
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, s.patient(writeMax))
		v, err := op(cctx, s.preferred().kv)
		cancel()
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return v, err
		}
		s.log.Debug("write retried on the preferred member", "err", err)
	}
}

// failoverKV replaces the client's KV (see the top of this file).
type failoverKV struct {
	clientv3.KV // the balanced one, for what is not overridden
	s           *Store
}

func (f *failoverKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	return readOn(ctx, f.s, func(c context.Context, kv clientv3.KV) (*clientv3.GetResponse, error) { return kv.Get(c, key, opts...) })
}

func (f *failoverKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return writeOn(ctx, f.s, func(c context.Context, kv clientv3.KV) (*clientv3.PutResponse, error) {
		return kv.Put(c, key, val, opts...)
	})
}

func (f *failoverKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return writeOn(ctx, f.s, func(c context.Context, kv clientv3.KV) (*clientv3.DeleteResponse, error) {
		return kv.Delete(c, key, opts...)
	})
}

func (f *failoverKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if op.IsGet() {
		return readOn(ctx, f.s, func(c context.Context, kv clientv3.KV) (clientv3.OpResponse, error) { return kv.Do(c, op) })
	}
	return writeOn(ctx, f.s, func(c context.Context, kv clientv3.KV) (clientv3.OpResponse, error) { return kv.Do(c, op) })
}

func (f *failoverKV) Txn(ctx context.Context) clientv3.Txn { return &failoverTxn{ctx: ctx, s: f.s} }

// failoverTxn collects a transaction and commits it as a write.
type failoverTxn struct {
	ctx             context.Context
	s               *Store
	cmps            []clientv3.Cmp
	thenOps, elseOp []clientv3.Op
}

func (t *failoverTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *failoverTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thenOps = append(t.thenOps, ops...)
	return t
}

func (t *failoverTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elseOp = append(t.elseOp, ops...)
	return t
}

func (t *failoverTxn) Commit() (*clientv3.TxnResponse, error) {
	return writeOn(t.ctx, t.s, func(c context.Context, kv clientv3.KV) (*clientv3.TxnResponse, error) {
		return kv.Txn(c).If(t.cmps...).Then(t.thenOps...).Else(t.elseOp...).Commit()
	})
}

// failoverWatcher replaces the client's Watcher: each watch runs on the
// preferred member's connection and is cancelled when that member fails
// two probes in a row.
type failoverWatcher struct {
	clientv3.Watcher // the balanced one, for RequestProgress and Close
	s                *Store
}

func (w *failoverWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	e := w.s.preferred()
	wctx, cancel := context.WithCancel(ctx)
	in := e.watch.Watch(wctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		defer cancel()
		probe := w.s.clk.NewTicker(w.s.patient(probeLoop))
		defer probe.Stop()
		misses := 0
		for {
			select {
			case wr, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- wr:
				case <-wctx.Done():
					return
				}
			case <-probe.C():
				pctx, pcancel := context.WithTimeout(wctx, w.s.patient(probeTry))
				_, err := e.kv.Get(pctx, w.s.key("probe"), clientv3.WithSerializable(), clientv3.WithCountOnly())
				pcancel()
				if err == nil || wctx.Err() != nil {
					misses = 0
					continue
				}
				if misses++; misses >= 2 {
					w.s.log.Warn("watch cancelled: its etcd member does not answer", "endpoint", e.url, "key", key, "err", err)
					return
				}
			case <-wctx.Done():
				return
			}
		}
	}()
	return out
}
