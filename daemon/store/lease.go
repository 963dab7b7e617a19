package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// NodeInfo is what a node publishes under its liveness key.
type NodeInfo struct {
	Node    string    `json:"node"`
	Domain  string    `json:"domain,omitempty"`
	Drives  []string  `json:"drives,omitempty"`
	API     string    `json:"api,omitempty"`
	Started time.Time `json:"started"`
}

// Liveness is a node's registration, kept alive by a background loop.
//
// Timing: every renewal measures its deadline from the moment the request
// was sent, not from when the answer came, so the node's deadline is never
// later than the store's expiry of the same lease (the store counts TTL from
// when it processed the renewal, which is later). Lost closes when the local
// deadline minus Margin passes without a successful renewal, or when the
// store says the lease is gone; the caller must then self-fence at once
// (cluster.SelfLeaseLost). Margin covers clock-rate drift between the node
// and the store and the time self-fencing takes.
type Liveness struct {
	s      *Store
	node   string
	id     clientv3.LeaseID
	ttl    time.Duration
	margin time.Duration
	cancel context.CancelFunc
	done   chan struct{}
	lost   chan struct{}

	mu       sync.Mutex
	deadline time.Time
	lostErr  error
}

// Register grants a lease of ttl (whole seconds, at least 1s), publishes
// info under nodes/<node> attached to it, and renews it every ttl/3 until
// Close. margin is subtracted from the local deadline (default ttl/5).
func (s *Store) Register(ctx context.Context, info NodeInfo, ttl, margin time.Duration) (*Liveness, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("lease TTL %s is below the store's 1s granularity: %w", ttl, ErrBadOptions)
	}
	if margin <= 0 {
		margin = ttl / 5
	}
	if margin >= ttl {
		return nil, fmt.Errorf("lease margin %s not below TTL %s: %w", margin, ttl, ErrBadOptions)
	}
	if info.Started.IsZero() {
		info.Started = s.now()
	}
	sent := s.now()
	g, err := s.cli.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return nil, fmt.Errorf("grant lease for node %q: %w", info.Node, err)
	}
	v, _ := json.Marshal(info)
	if _, err := s.cli.Put(ctx, s.key("nodes", info.Node), string(v), clientv3.WithLease(g.ID)); err != nil {
		return nil, fmt.Errorf("register node %q: %w", info.Node, err)
	}
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &Liveness{s: s, node: info.Node, id: g.ID, ttl: time.Duration(g.TTL) * time.Second, margin: margin,
		cancel: cancel, done: make(chan struct{}), lost: make(chan struct{}),
		deadline: sent.Add(time.Duration(g.TTL) * time.Second)}
	go l.loop(lctx)
	return l, nil
}

// ID is the etcd lease ID.
func (l *Liveness) ID() clientv3.LeaseID { return l.id }

// Lost is closed once the node can no longer be sure it holds its lease.
func (l *Liveness) Lost() <-chan struct{} { return l.lost }

// Err says why Lost closed (nil while held).
func (l *Liveness) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

// Deadline is the local instant after which the lease may have expired in
// the store (the last renewal's send time plus TTL).
func (l *Liveness) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

func (l *Liveness) markLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.lost:
	default:
		l.lostErr = err
		close(l.lost)
		l.s.log.Warn("liveness lease lost", "node", l.node, "err", err)
	}
}

func (l *Liveness) loop(ctx context.Context) {
	defer close(l.done)
	every := l.ttl / 3
	t := time.NewTicker(every / 4)
	defer t.Stop()
	next := l.s.now().Add(every)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := l.s.now()
		if dl := l.Deadline(); !now.Before(dl.Add(-l.margin)) {
			l.markLost(fmt.Errorf("node %q: no renewal since the deadline %s minus margin %s", l.node, dl.Format(time.RFC3339Nano), l.margin))
			return
		}
		if now.Before(next) {
			continue
		}
		sent := now
		rctx, cancel := context.WithDeadline(ctx, l.Deadline().Add(-l.margin))
		resp, err := l.s.cli.KeepAliveOnce(rctx, l.id)
		cancel()
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				l.markLost(fmt.Errorf("node %q: the store expired lease %x: %w", l.node, int64(l.id), err))
				return
			}
			next = l.s.now().Add(every / 4) // retry soon; the deadline check fences if it never works
			continue
		}
		if resp.TTL <= 0 {
			l.markLost(fmt.Errorf("node %q: the store expired lease %x", l.node, int64(l.id)))
			return
		}
		l.mu.Lock()
		l.deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
		l.mu.Unlock()
		next = sent.Add(every)
	}
}

// Close stops renewing and revokes the lease (a clean shutdown: the node's
// liveness key disappears at once).
func (l *Liveness) Close(ctx context.Context) error {
	l.Abandon()
	_, err := l.s.cli.Revoke(ctx, l.id)
	return err
}

// Abandon stops renewing without revoking, as a crash would: the store
// expires the lease after its TTL.
func (l *Liveness) Abandon() {
	l.cancel()
	<-l.done
}

// Nodes returns the registrations of every node whose lease is alive.
func (s *Store) Nodes(ctx context.Context) (map[string]NodeInfo, error) {
	resp, err := s.cli.Get(ctx, s.key("nodes")+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list live nodes: %w", err)
	}
	out := map[string]NodeInfo{}
	for _, kv := range resp.Kvs {
		var ni NodeInfo
		if err := json.Unmarshal(kv.Value, &ni); err != nil {
			return nil, fmt.Errorf("node key %s: %w", kv.Key, err)
		}
		out[ni.Node] = ni
	}
	return out, nil
}

// NodeEvent is a change of a node's liveness.
type NodeEvent struct {
	Node     string
	Alive    bool // false: the lease expired or was revoked
	Info     NodeInfo
	Revision int64
}

// WatchNodes reports liveness changes from revision rev onward (0: from
// now).
//
// The channel closes when ctx ends or when the watch breaks (the member
// lost its leader, or rev was compacted away); the caller then re-reads
// the state and watches again from the last revision it handled + 1.
func (s *Store) WatchNodes(ctx context.Context, rev int64) <-chan NodeEvent {
	out := make(chan NodeEvent)
	prefix := s.key("nodes") + "/"
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	wc := s.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, opts...)
	go func() {
		defer close(out)
		for wr := range wc {
			for _, ev := range wr.Events {
				ne := NodeEvent{Node: strings.TrimPrefix(string(ev.Kv.Key), prefix), Revision: ev.Kv.ModRevision}
				if ev.Type == clientv3.EventTypePut {
					ne.Alive = true
					_ = json.Unmarshal(ev.Kv.Value, &ne.Info)
				}
				select {
				case out <- ne:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
