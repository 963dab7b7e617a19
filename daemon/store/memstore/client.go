package memstore

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// errNotSupported: a raw client call the in-memory store does not serve.
var errNotSupported = errors.New("memstore: not supported by the in-memory store's raw client (Get, Put, Delete and Watch are); use the store's methods")

// kv is the raw client's KV: Get, Put and Delete, with WithPrefix,
// WithRange and WithLease; other options are ignored (results are sorted
// by key, as etcd's default). The embedded interface is nil: the other
// methods of clientv3.KV are not served.
type kv struct {
	clientv3.KV
	v *View
}

func (k *kv) header() *pb.ResponseHeader { return &pb.ResponseHeader{Revision: k.v.s.rev} }

func (k *kv) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if err := k.v.lock(ctx, "put"); err != nil {
		return nil, err
	}
	defer k.v.unlock()
	k.v.s.putLocked(key, []byte(val), 0)
	return &clientv3.PutResponse{Header: k.header()}, nil
}

func (k *kv) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	op := clientv3.OpGet(key, opts...)
	if err := k.v.lock(ctx, "get"); err != nil {
		return nil, err
	}
	defer k.v.unlock()
	kvs := k.v.s.rangeLocked(key, string(op.RangeBytes()))
	return &clientv3.GetResponse{Header: k.header(), Kvs: kvs, Count: int64(len(kvs))}, nil
}

func (k *kv) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	op := clientv3.OpDelete(key, opts...)
	if err := k.v.lock(ctx, "delete"); err != nil {
		return nil, err
	}
	defer k.v.unlock()
	n := int64(0)
	for _, e := range k.v.s.rangeLocked(key, string(op.RangeBytes())) {
		if k.v.s.deleteLocked(string(e.Key)) {
			n++
		}
	}
	return &clientv3.DeleteResponse{Header: k.header(), Deleted: n}, nil
}

func (k *kv) Txn(ctx context.Context) clientv3.Txn { return failTxn{} }

func (k *kv) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	return clientv3.OpResponse{}, errNotSupported
}

type failTxn struct{}

func (t failTxn) If(...clientv3.Cmp) clientv3.Txn  { return t }
func (t failTxn) Then(...clientv3.Op) clientv3.Txn { return t }
func (t failTxn) Else(...clientv3.Op) clientv3.Txn { return t }
func (t failTxn) Commit() (*clientv3.TxnResponse, error) {
	return nil, fmt.Errorf("transaction: %w", errNotSupported)
}

// watchAPI is the raw client's Watcher.
type watchAPI struct {
	clientv3.Watcher
	v *View
}

func (w *watchAPI) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	op := clientv3.OpGet(key, opts...)
	return w.v.watch(ctx, key, string(op.RangeBytes()), op.Rev())
}

func (w *watchAPI) Close() error { return nil }

// watcher is one watch: events for keys in [key, end) (just key when end
// is empty), delivered in order by its own goroutine.
type watcher struct {
	node     string
	key, end string
	ctx      context.Context
	queue    []*mvccpb.Event
	wake     chan struct{}
	ended    bool
}

func (w *watcher) matches(k string) bool {
	if w.end == "" {
		return k == w.key
	}
	return k >= w.key && (w.end == "\x00" || k < w.end)
}

// watch starts a watch from revision rev (0: from now). The in-memory store
// keeps no history: a watch from a past revision starts from now, which is
// what every caller in tier0 asks for (the revision after a read).
func (v *View) watch(ctx context.Context, key, end string, rev int64) clientv3.WatchChan {
	out := make(chan clientv3.WatchResponse)
	w := &watcher{node: v.node, key: key, end: end, ctx: ctx, wake: make(chan struct{}, 1)}
	v.s.mu.Lock()
	if v.s.cut[v.node] || ctx.Err() != nil {
		v.s.mu.Unlock()
		close(out)
		return out
	}
	v.s.watchers[w] = struct{}{}
	v.s.mu.Unlock()
	go func() {
		defer close(out)
		for {
			v.s.mu.Lock()
			q, ended := w.queue, w.ended
			w.queue = nil
			v.s.mu.Unlock()
			if len(q) > 0 {
				select {
				case out <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: q[len(q)-1].Kv.ModRevision}, Events: q}:
				case <-ctx.Done():
					v.s.mu.Lock()
					v.s.endWatchLocked(w)
					v.s.mu.Unlock()
					return
				}
				continue
			}
			if ended {
				return
			}
			select {
			case <-w.wake:
			case <-ctx.Done():
				v.s.mu.Lock()
				v.s.endWatchLocked(w)
				v.s.mu.Unlock()
				return
			}
		}
	}()
	return out
}

func (s *Store) endWatchLocked(w *watcher) {
	delete(s.watchers, w)
	w.ended = true
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (s *Store) notifyLocked(typ mvccpb.Event_EventType, kv *mvccpb.KeyValue) {
	for w := range s.watchers {
		if w.matches(string(kv.Key)) {
			w.queue = append(w.queue, &mvccpb.Event{Type: typ, Kv: kv})
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}
