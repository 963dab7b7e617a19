package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
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
	// Fences counts the times the process that started at Started fenced
	// itself before this registration: with Started it names the
	// registration (cluster.NodeReturned), so that one registration
	// reported twice is one return.
	Fences uint64 `json:"fences,omitempty"`
	// TTL is the lease's (set by Register): a watcher holds the deletion
	// of this registration back NodeGoneGrace(TTL).
	TTL time.Duration `json:"ttl,omitempty"`
	// Revision is the store revision of this registration (its key's
	// ModRevision when read; renewals do not change it): a claim of
	// ownership with a higher revision was made under this registration.
	Revision int64 `json:"-"`
}

// Liveness is a node's registration, kept alive by a background loop.
//
// What it guarantees (docs/CONTROL-PLANE.md, "Leases"):
//
//   - Lost closes when the local instant Deadline()−margin passes without a
//     successful renewal, from a local timer (monotonic clock) that no RPC
//     can hold up, or when the store says the lease is gone. Once closed it
//     stays closed; the caller must then self-fence at once
//     (cluster.SelfLeaseLost) and register again.
//   - Deadline is the start of the last successful renewal (or of the
//     grant) plus the TTL. The store counts the TTL from when it processed
//     that renewal, which is later, so the store never expires the lease
//     before Deadline; Lost fires margin earlier. Margin covers clock-rate
//     drift between the node and the store and the time self-fencing takes.
//   - Renewals start every TTL/10 (at least 100 ms, at most 1 s); each is
//     one request with a deadline, sent to the member that answered last and,
//     after a hedge delay of a third of that interval, to the next ones too
//     (renew.go). A frozen or partitioned member costs one hedge delay, a
//     frozen raft leader the election plus at most one retry interval, so
//     while a quorum of members is reachable the lease is renewed whichever
//     member hangs.
type Liveness struct {
	s    *Store
	node string
	ttl  time.Duration
	k    *keeper
}

// Register grants a lease of ttl (whole seconds, at least 1s), publishes
// info under nodes/<node> attached to it, and renews it until Close.
// margin is subtracted from the local deadline (default ttl/5).
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
	var (
		sent time.Time
		g    *clientv3.LeaseGrantResponse
		gttl time.Duration
		v    []byte
	)
	for {
		sent = s.now()
		var err error
		g, err = s.cli.Grant(ctx, int64(ttl/time.Second))
		if err != nil {
			return nil, fmt.Errorf("grant lease for node %q: %w", info.Node, err)
		}
		gttl = time.Duration(g.TTL) * time.Second
		info.TTL = gttl
		v, _ = json.Marshal(info)
		// The same put may be repeated on another member: it is idempotent.
		_, err = onEndpoints(ctx, s, grantTry, func(c context.Context, e *endpoint) (*clientv3.PutResponse, error) {
			return e.kv.Put(c, s.key("nodes", info.Node), string(v), clientv3.WithLease(g.ID))
		})
		if err == nil {
			break
		}
		// A loaded store can take longer than the TTL to answer the put
		// (a try that timed out is applied later, its retry finds the lease
		// expired): nothing renewed the lease yet, so grant another.
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) || ctx.Err() != nil {
			return nil, fmt.Errorf("register node %q: %w", info.Node, err)
		}
		s.log.Warn("lease ended before the node's key was put under it; granting another", "node", info.Node, "lease", fmt.Sprintf("%x", int64(g.ID)), "took", s.now().Sub(sent))
	}
	s.nodeTTL.Store(int64(gttl))
	l := &Liveness{s: s, node: info.Node, ttl: gttl}
	rejoin := func(ctx context.Context) (clientv3.LeaseID, time.Time, time.Duration, error) {
		sent := s.now()
		g, err := s.cli.Grant(ctx, int64(gttl/time.Second))
		if err != nil {
			return 0, sent, 0, fmt.Errorf("grant a new lease for node %q: %w", info.Node, err)
		}
		if _, err := onEndpoints(ctx, s, grantTry, func(c context.Context, e *endpoint) (*clientv3.PutResponse, error) {
			return e.kv.Put(c, s.key("nodes", info.Node), string(v), clientv3.WithLease(g.ID))
		}); err != nil {
			return 0, sent, 0, fmt.Errorf("register node %q again: %w", info.Node, err)
		}
		return g.ID, sent, time.Duration(g.TTL) * time.Second, nil
	}
	l.k = s.keep(g.ID, fmt.Sprintf("node %q", info.Node), gttl, margin, sent, nil, rejoin)
	return l, nil
}

// ID is the etcd lease ID (it changes when a revoked lease is replaced).
func (l *Liveness) ID() clientv3.LeaseID { return l.k.currentID() }

// Lost is closed once the node can no longer be sure it holds its lease.
func (l *Liveness) Lost() <-chan struct{} { return l.k.lost }

// Err says why Lost closed (nil while held).
func (l *Liveness) Err() error { return l.k.err() }

// Deadline is the local instant after which the lease may have expired in
// the store (the last successful renewal's send time plus TTL).
func (l *Liveness) Deadline() time.Time { return l.k.Deadline() }

// Held reports, without waiting for anything, whether the lease is still
// sure to be held: Lost has not closed and Deadline−margin has not passed.
// A path that must not act on a lost lease (I/O of a node that may have
// been frozen) checks it at the point of acting: after a long pause the
// timer that closes Lost may not have run yet.
func (l *Liveness) Held() bool { return l.k.held() }

// Stats says how the renewals went (for measurements and metrics).
func (l *Liveness) Stats() LeaseStats { return l.k.Stats() }

// Close stops renewing and revokes the lease (a clean shutdown: the node's
// liveness key disappears at once).
func (l *Liveness) Close(ctx context.Context) error {
	l.Abandon()
	_, err := l.s.cli.Revoke(ctx, l.ID())
	return err
}

// Abandon stops renewing without revoking, as a crash would: the store
// expires the lease after its TTL. Lost does not close afterwards.
func (l *Liveness) Abandon() { l.k.stop() }

// Nodes returns the registrations of every node whose lease is alive.
func (s *Store) Nodes(ctx context.Context) (map[string]NodeInfo, error) {
	out, _, err := s.listNodes(ctx)
	return out, err
}

// listNodes reads every live registration (each with its key's
// ModRevision) and the revision of the answer.
func (s *Store) listNodes(ctx context.Context) (map[string]NodeInfo, int64, error) {
	resp, err := s.cli.Get(ctx, s.key("nodes")+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("list live nodes: %w", err)
	}
	out := map[string]NodeInfo{}
	for _, kv := range resp.Kvs {
		var ni NodeInfo
		if err := json.Unmarshal(kv.Value, &ni); err != nil {
			return nil, 0, fmt.Errorf("node key %s: %w", kv.Key, err)
		}
		ni.Revision = kv.ModRevision
		out[ni.Node] = ni
	}
	return out, resp.Header.Revision, nil
}

// NodeEvent is a change of a node's liveness.
type NodeEvent struct {
	Node     string
	Alive    bool // false: the lease expired or was revoked
	Info     NodeInfo
	Revision int64
}

// fallbackNodeTTL is assumed for a registration that does not say its TTL
// when no lease was registered through this store either: tier0's
// default policies.lease_ttl.
const fallbackNodeTTL = 5 * time.Second

// nodeGrace is how long WatchNodes holds back the deletion of was:
// NodeGoneGrace of its lease's TTL, else of the TTL of the leases
// registered through this store (the site's), else of fallbackNodeTTL.
func (s *Store) nodeGrace(was NodeInfo) time.Duration {
	if was.TTL > 0 {
		return NodeGoneGrace(was.TTL)
	}
	if ttl := time.Duration(s.nodeTTL.Load()); ttl > 0 {
		return NodeGoneGrace(ttl)
	}
	return NodeGoneGrace(fallbackNodeTTL)
}

// WatchNodes reports liveness changes from revision rev onward (0: from
// now).
//
// A deletion is reported only after it has lasted NodeGoneGrace (the
// lease TTL) on this watcher's clock: a node whose lease the store revoked
// before its deadline (an etcd leader frozen and thawed does that to every
// lease) registers again within that time, under a new lease and with the
// same Started and Fences, and then neither the deletion nor the new
// registration is reported — the node never stopped holding its arrays.
// One that fenced itself meanwhile (more Fences) stopped serving: only its
// new registration is reported. A real expiry is
// therefore reported a TTL after the store expired the lease. A node registered with another Started
// (it restarted) is reported gone, then back. Events of a node are
// reported in order; a held deletion may come after events of other nodes
// with higher revisions.
//
// The channel closes when ctx ends or when the watch breaks (the member
// lost its leader, or rev was compacted away); the caller then re-reads
// the state and watches again from the last revision it handled + 1.
func (s *Store) WatchNodes(ctx context.Context, rev int64) <-chan NodeEvent {
	out := make(chan NodeEvent)
	prefix := s.key("nodes") + "/"
	wc := openWatch(ctx, s.cli, prefix, WatchOptions{Rev: rev, Ops: []clientv3.OpOption{clientv3.WithPrevKV()}})
	go func() {
		defer close(out)
		type held struct {
			ev    NodeEvent
			since time.Time
			grace time.Duration
			was   NodeInfo // the registration that was deleted (PrevKV)
		}
		pending := map[string]*held{}
		send := func(ne NodeEvent) bool {
			select {
			case out <- ne:
				return true
			case <-ctx.Done():
				return false
			}
		}
		tick := s.clk.NewTicker(max(s.nodeGrace(NodeInfo{})/20, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C():
				now := s.clk.Now()
				var due []*held
				for n, h := range pending {
					if now.Sub(h.since) >= h.grace {
						due = append(due, h)
						delete(pending, n)
					}
				}
				sort.Slice(due, func(i, j int) bool { return due[i].ev.Revision < due[j].ev.Revision })
				for _, h := range due {
					if !send(h.ev) {
						return
					}
				}
			case wr, ok := <-wc:
				if !ok {
					return
				}
				for _, ev := range wr.Events {
					ne := NodeEvent{Node: strings.TrimPrefix(string(ev.Kv.Key), prefix), Revision: ev.Kv.ModRevision}
					if ev.Type != clientv3.EventTypePut {
						h := &held{ev: ne, since: s.clk.Now()}
						if ev.PrevKv != nil {
							_ = json.Unmarshal(ev.PrevKv.Value, &h.was)
						}
						h.grace = s.nodeGrace(h.was)
						pending[ne.Node] = h
						continue
					}
					ne.Alive = true
					_ = json.Unmarshal(ev.Kv.Value, &ne.Info)
					if h := pending[ne.Node]; h != nil {
						delete(pending, ne.Node)
						if !h.was.Started.IsZero() && h.was.Started.Equal(ne.Info.Started) {
							if h.was.Fences == ne.Info.Fences {
								s.log.Info("node registered again under a new lease before its deletion counted", "node", ne.Node, "gone_for", s.clk.Since(h.since))
								continue
							}
							// It fenced itself in between: it is back (the
							// put, with its new Fences), never gone.
							if !send(ne) {
								return
							}
							continue
						}
						if !send(h.ev) {
							return
						}
					}
					if !send(ne) {
						return
					}
				}
			}
		}
	}()
	return out
}

// SettledNodes is Nodes read NodeGoneGrace after the call (of the longest
// TTL among the registrations it finds at once and the lease registered
// through this store), with the revision it was read at: for a watcher
// that starts from a snapshot (a new coordinator) and must not count a
// node as gone while it may still be registering again after a revoked
// lease (see WatchNodes).
func (s *Store) SettledNodes(ctx context.Context) (map[string]NodeInfo, int64, error) {
	now, err := s.Nodes(ctx)
	if err != nil {
		return nil, 0, err
	}
	grace := time.Duration(0)
	for _, ni := range now {
		if ni.TTL > 0 {
			grace = max(grace, NodeGoneGrace(ni.TTL))
		}
	}
	if grace == 0 || s.nodeTTL.Load() > 0 {
		grace = max(grace, s.nodeGrace(NodeInfo{}))
	}
	select {
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	case <-s.clk.After(grace):
	}
	return s.listNodes(ctx)
}
