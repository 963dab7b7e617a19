package store

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// WatchOptions shapes WatchPrefix.
type WatchOptions struct {
	// Rev is the first revision reported (0: from now).
	Rev int64
	// Buffer is the returned channel's capacity (0: unbuffered).
	Buffer int
	// LastOnly sends, of each watch response, only the last event that
	// decodes (for a watcher that re-reads the state on any change).
	LastOnly bool
	// Any loses the leader requirement: the watch does not break when
	// the member loses its leader (a watch of keys the caller deletes
	// itself, such as a queue it drains).
	Any bool
	// Exact watches the one key named, not the keys under it.
	Exact bool
	// Ops are more options for the watch (WithPrevKV, WithFilterDelete...).
	Ops []clientv3.OpOption
}

// openWatch starts the watch WatchPrefix reads: the keys under prefix
// (the key itself when o.Exact), from o.Rev, requiring a leader unless
// o.Any. WatchNodes reads it directly, to multiplex it with its timer.
func openWatch(ctx context.Context, w clientv3.Watcher, prefix string, o WatchOptions) clientv3.WatchChan {
	var opts []clientv3.OpOption
	if !o.Exact {
		opts = append(opts, clientv3.WithPrefix())
	}
	opts = append(opts, o.Ops...)
	if o.Rev > 0 {
		opts = append(opts, clientv3.WithRev(o.Rev))
	}
	if !o.Any {
		ctx = clientv3.WithRequireLeader(ctx)
	}
	return w.Watch(ctx, prefix, opts...)
}

// WatchPrefix is the store's one watch loop: it watches the keys under
// prefix and sends decode's value for every event it accepts (ok), in
// revision order.
//
// The channel closes when ctx ends or when the watch breaks (the member
// lost its leader, or rev was compacted away: a response that carries the
// error is the last before the watch's own channel closes); the
// caller then re-reads the state and watches again from the last
// revision it handled + 1.
func WatchPrefix[T any](ctx context.Context, w clientv3.Watcher, prefix string, o WatchOptions, decode func(ev *clientv3.Event) (T, bool)) <-chan T {
	out := make(chan T, o.Buffer)
	wc := openWatch(ctx, w, prefix, o)
	go func() {
		defer close(out)
		for wr := range wc {
			var last T
			have := false
			for _, ev := range wr.Events {
				v, ok := decode(ev)
				if !ok {
					continue
				}
				if o.LastOnly {
					last, have = v, true
					continue
				}
				select {
				case out <- v:
				case <-ctx.Done():
					return
				}
			}
			if have {
				select {
				case out <- last:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// KV is one key's value, as Puts decodes it.
type KV struct {
	Key   string
	Value []byte
}

// Puts is a WatchPrefix decoder for a watcher of raw keys: the key and
// value of every put; deletions are skipped.
func Puts(ev *clientv3.Event) (KV, bool) {
	if ev.Type != clientv3.EventTypePut {
		return KV{}, false
	}
	return KV{Key: string(ev.Kv.Key), Value: ev.Kv.Value}, true
}
