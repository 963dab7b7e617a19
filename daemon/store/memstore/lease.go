package memstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"tier0/daemon/store"
)

// Lease is a node's registration (what store.Liveness is for etcd). Its
// keep-alive loop is Renew, called by whoever drives the simulation for
// each node that runs: a frozen node's lease is not renewed, a partitioned
// node's renewals fail. Deadline is the time of the last successful
// renewal (or grant) plus the TTL; Lost closes when Renew finds that
// Deadline minus margin has passed, or that the store dropped the lease.
type Lease struct {
	v      *View
	info   store.NodeInfo
	ttl    time.Duration
	margin time.Duration

	mu       sync.Mutex
	id       int64
	deadline time.Time
	lost     chan struct{}
	err      error
	stopped  bool
}

// Register grants a lease of ttl to node info.Node and puts its liveness
// key under it (margin: see store.Store.Register; default ttl/5).
func (v *View) Register(ctx context.Context, info store.NodeInfo, ttl, margin time.Duration) (*Lease, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("lease TTL %s is below the store's 1s granularity: %w", ttl, store.ErrBadOptions)
	}
	if margin <= 0 {
		margin = ttl / 5
	}
	if margin >= ttl {
		return nil, fmt.Errorf("lease margin %s not below TTL %s: %w", margin, ttl, store.ErrBadOptions)
	}
	if info.Started.IsZero() {
		info.Started = v.s.clk.Now()
	}
	b, _ := json.Marshal(info)
	if err := v.lock(ctx, "grant lease"); err != nil {
		return nil, fmt.Errorf("grant lease for node %q: %w", info.Node, err)
	}
	defer v.unlock()
	now := v.s.clk.Now()
	v.s.nextID++
	id := v.s.nextID
	v.s.leases[id] = &lease{id: id, ttl: ttl, expires: now.Add(ttl), keys: map[string]bool{}}
	v.s.putLocked(v.s.key("nodes", info.Node), b, id)
	return &Lease{v: v, info: info, ttl: ttl, margin: margin, id: id, deadline: now.Add(ttl), lost: make(chan struct{})}, nil
}

// Renew is one keep-alive: it extends the lease in the store, or closes
// Lost when the lease cannot be trusted any more. It does nothing after
// Lost, Close or Abandon.
func (l *Lease) Renew() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || l.err != nil {
		return
	}
	s := l.v.s
	now := s.clk.Now()
	s.mu.Lock()
	s.expireLocked()
	cut := s.cut[l.v.node]
	sl, alive := s.leases[l.id]
	if !cut && alive {
		sl.expires = now.Add(l.ttl)
	}
	s.mu.Unlock()
	switch {
	case !cut && alive:
		l.deadline = now.Add(l.ttl)
	case !cut && !alive:
		l.markLostLocked(fmt.Errorf("the store expired lease %d of node %s: %w", l.id, l.info.Node, store.ErrNotAlive))
	case !now.Before(l.deadline.Add(-l.margin)):
		l.markLostLocked(fmt.Errorf("lease of node %s not renewed by its local deadline %s minus margin %s (store unreachable)", l.info.Node, l.deadline.Format(time.RFC3339Nano), l.margin))
	}
}

func (l *Lease) markLostLocked(err error) {
	if l.err == nil {
		l.err = err
		close(l.lost)
	}
}

// Lost is closed once the node can no longer be sure it holds its lease.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err says why Lost closed (nil while held).
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Deadline is the local instant after which the store may expire the lease.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Held reports whether the lease is still sure to be held: Lost has not
// closed and Deadline minus margin has not passed on the clock.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err == nil && l.v.s.clk.Now().Before(l.deadline.Add(-l.margin))
}

// Close stops renewing and revokes the lease.
func (l *Lease) Close(ctx context.Context) error {
	l.Abandon()
	if err := l.v.lock(ctx, "revoke lease"); err != nil {
		return err
	}
	defer l.v.unlock()
	if _, ok := l.v.s.leases[l.id]; !ok {
		return errors.New("memstore: lease already gone")
	}
	l.v.s.revokeLocked(l.id)
	return nil
}

// Abandon stops renewing without revoking, as a crash would.
func (l *Lease) Abandon() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}
