package memstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/clock"
	"tier0/daemon/store"
)

// ErrUnreachable: the node is partitioned from the store.
var ErrUnreachable = errors.New("memstore: the store is unreachable from this node (partitioned)")

// Store is the shared in-memory state. Its methods are safe for
// concurrent use.
type Store struct {
	clk    clock.Clock
	prefix string

	mu       sync.Mutex
	rev      int64
	kv       map[string]*entry
	leases   map[int64]*lease
	nextID   int64
	watchers map[*watcher]struct{}
	cut      map[string]bool // nodes partitioned from the store
	evSeq    int64
}

type entry struct {
	val              []byte
	create, mod, ver int64
	lease            int64
}

type lease struct {
	id      int64
	ttl     time.Duration
	expires time.Time
	keys    map[string]bool
}

// New makes an empty store whose keys live under prefix (as
// store.Options.Prefix: "/tier0/<cluster>/") and whose leases run on clk.
func New(clk clock.Clock, prefix string) *Store {
	return &Store{clk: clock.Or(clk), prefix: prefix, kv: map[string]*entry{}, leases: map[int64]*lease{},
		watchers: map[*watcher]struct{}{}, cut: map[string]bool{}}
}

// Partition cuts node off from the store (cut) or reconnects it.
func (s *Store) Partition(node string, cut bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cut[node] = cut
	if cut {
		for w := range s.watchers {
			if w.node == node {
				s.endWatchLocked(w)
			}
		}
	}
}

// Expire drops every lease whose TTL has run out on the clock (the
// simulation calls it after advancing the clock; every call does it too).
func (s *Store) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
}

func (s *Store) expireLocked() {
	now := s.clk.Now()
	ids := make([]int64, 0, len(s.leases))
	for id, l := range s.leases {
		if !now.Before(l.expires) {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		s.revokeLocked(id)
	}
}

func (s *Store) revokeLocked(id int64) {
	l, ok := s.leases[id]
	if !ok {
		return
	}
	delete(s.leases, id)
	keys := make([]string, 0, len(l.keys))
	for k := range l.keys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s.deleteLocked(k)
	}
}

func (s *Store) key(parts ...string) string { return s.prefix + strings.Join(parts, "/") }

// put writes one key (attached to lease when non-zero) and returns the new
// revision.
func (s *Store) putLocked(k string, v []byte, leaseID int64) int64 {
	s.rev++
	e, ok := s.kv[k]
	if !ok {
		e = &entry{create: s.rev}
		s.kv[k] = e
	}
	if e.lease != 0 && e.lease != leaseID {
		if l := s.leases[e.lease]; l != nil {
			delete(l.keys, k)
		}
	}
	e.val, e.mod, e.lease = append([]byte(nil), v...), s.rev, leaseID
	e.ver++
	if leaseID != 0 {
		if l := s.leases[leaseID]; l != nil {
			l.keys[k] = true
		}
	}
	s.notifyLocked(mvccpb.PUT, s.kvOf(k, e))
	return s.rev
}

func (s *Store) deleteLocked(k string) bool {
	e, ok := s.kv[k]
	if !ok {
		return false
	}
	delete(s.kv, k)
	if l := s.leases[e.lease]; l != nil {
		delete(l.keys, k)
	}
	s.rev++
	s.notifyLocked(mvccpb.DELETE, &mvccpb.KeyValue{Key: []byte(k), ModRevision: s.rev})
	return true
}

func (s *Store) kvOf(k string, e *entry) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(k), Value: append([]byte(nil), e.val...), CreateRevision: e.create, ModRevision: e.mod, Version: e.ver, Lease: e.lease}
}

// rangeLocked lists the keys in [key, end) (just key when end is empty),
// sorted by key.
func (s *Store) rangeLocked(key, end string) []*mvccpb.KeyValue {
	var out []*mvccpb.KeyValue
	if end == "" {
		if e, ok := s.kv[key]; ok {
			out = append(out, s.kvOf(key, e))
		}
		return out
	}
	for k, e := range s.kv {
		if k >= key && (end == "\x00" || k < end) {
			out = append(out, s.kvOf(k, e))
		}
	}
	sort.Slice(out, func(i, j int) bool { return string(out[i].Key) < string(out[j].Key) })
	return out
}

// View is one node's connection to the store: a node.Store.
type View struct {
	s    *Store
	node string
	cli  *clientv3.Client
}

// View returns node's connection.
func (s *Store) View(node string) *View {
	v := &View{s: s, node: node}
	cli := clientv3.NewCtxClient(context.Background())
	cli.KV = &kv{v: v}
	cli.Watcher = &watchAPI{v: v}
	v.cli = cli
	return v
}

// lock takes the store's lock for one call of the view's node, or says why
// the call fails (ctx ended, the node is partitioned). Expired leases are
// dropped first.
func (v *View) lock(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	v.s.mu.Lock()
	if v.s.cut[v.node] {
		v.s.mu.Unlock()
		return fmt.Errorf("%s from node %s: %w (%w)", what, v.node, ErrUnreachable, context.DeadlineExceeded)
	}
	v.s.expireLocked()
	return nil
}

func (v *View) unlock() { v.s.mu.Unlock() }

func validName(what, s string) error {
	if s == "" || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("%s %q: must be non-empty without '/': %w", what, s, store.ErrBadOptions)
	}
	return nil
}

// Put stores v as JSON under <section>/<kind>/<name>.
func (v *View) Put(ctx context.Context, sec store.Section, kind, name string, val any) (int64, error) {
	if err := errors.Join(validName("kind", kind), validName("name", name)); err != nil {
		return 0, err
	}
	b, err := json.Marshal(val)
	if err != nil {
		return 0, fmt.Errorf("encode %s/%s/%s: %w", sec, kind, name, err)
	}
	if err := v.lock(ctx, "write"); err != nil {
		return 0, fmt.Errorf("write %s/%s/%s: %w", sec, kind, name, err)
	}
	defer v.unlock()
	return v.s.putLocked(v.s.key(string(sec), kind, name), b, 0), nil
}

// Get decodes <section>/<kind>/<name> into val.
func (v *View) Get(ctx context.Context, sec store.Section, kind, name string, val any) (int64, error) {
	if err := v.lock(ctx, "read"); err != nil {
		return 0, fmt.Errorf("read %s/%s/%s: %w", sec, kind, name, err)
	}
	e, ok := v.s.kv[v.s.key(string(sec), kind, name)]
	var b []byte
	var mod int64
	if ok {
		b, mod = append([]byte(nil), e.val...), e.mod
	}
	v.unlock()
	if !ok {
		return 0, fmt.Errorf("%s/%s/%s: %w", sec, kind, name, store.ErrNotFound)
	}
	if err := json.Unmarshal(b, val); err != nil {
		return 0, fmt.Errorf("decode %s/%s/%s: %w", sec, kind, name, err)
	}
	return mod, nil
}

// List returns every <section>/<kind>/* value by name.
func (v *View) List(ctx context.Context, sec store.Section, kind string) (map[string]json.RawMessage, error) {
	prefix := v.s.key(string(sec), kind) + "/"
	if err := v.lock(ctx, "list"); err != nil {
		return nil, fmt.Errorf("list %s/%s: %w", sec, kind, err)
	}
	kvs := v.s.rangeLocked(prefix, clientv3.GetPrefixRangeEnd(prefix))
	v.unlock()
	out := map[string]json.RawMessage{}
	for _, kv := range kvs {
		out[strings.TrimPrefix(string(kv.Key), prefix)] = json.RawMessage(kv.Value)
	}
	return out, nil
}

// Delete removes <section>/<kind>/<name>.
func (v *View) Delete(ctx context.Context, sec store.Section, kind, name string) error {
	if err := v.lock(ctx, "delete"); err != nil {
		return fmt.Errorf("delete %s/%s/%s: %w", sec, kind, name, err)
	}
	defer v.unlock()
	v.s.deleteLocked(v.s.key(string(sec), kind, name))
	return nil
}

// AppendEvent adds ev to the event log.
func (v *View) AppendEvent(ctx context.Context, ev store.Event) (store.Event, error) {
	if ev.Time.IsZero() {
		ev.Time = v.s.clk.Now()
	}
	ev.Time, ev.Revision = ev.Time.UTC(), 0
	b, _ := json.Marshal(ev)
	if err := v.lock(ctx, "append event"); err != nil {
		return ev, fmt.Errorf("append event %s: %w", ev.Kind, err)
	}
	defer v.unlock()
	v.s.evSeq++
	ev.Revision = v.s.putLocked(v.s.key("events", fmt.Sprintf("%019d-%09d", ev.Time.UnixNano(), v.s.evSeq)), b, 0)
	return ev, nil
}

// Events returns the log in the order it was written, after revision
// after, at most limit entries (0: all).
func (v *View) Events(ctx context.Context, after int64, limit int) ([]store.Event, error) {
	prefix := v.s.key("events") + "/"
	if err := v.lock(ctx, "read event log"); err != nil {
		return nil, fmt.Errorf("read event log: %w", err)
	}
	kvs := v.s.rangeLocked(prefix, clientv3.GetPrefixRangeEnd(prefix))
	v.unlock()
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].CreateRevision < kvs[j].CreateRevision })
	var out []store.Event
	for _, kv := range kvs {
		if kv.CreateRevision <= after {
			continue
		}
		var ev store.Event
		if err := json.Unmarshal(kv.Value, &ev); err != nil {
			return nil, fmt.Errorf("event %s: %w", kv.Key, err)
		}
		ev.Revision = kv.CreateRevision
		out = append(out, ev)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out, nil
}

// Ownership reads an array's ownership record (zero when none).
func (v *View) Ownership(ctx context.Context, array string) (store.Ownership, error) {
	if err := v.lock(ctx, "read owner"); err != nil {
		return store.Ownership{}, fmt.Errorf("read owner of array %q: %w", array, err)
	}
	defer v.unlock()
	return v.ownershipLocked(array)
}

func (v *View) ownershipLocked(array string) (store.Ownership, error) {
	o := store.Ownership{Array: array}
	e, ok := v.s.kv[v.s.key("owners", array)]
	if !ok {
		return o, nil
	}
	if err := json.Unmarshal(e.val, &o); err != nil {
		return o, fmt.Errorf("owner record of array %q: %w", array, err)
	}
	o.Revision = e.mod
	return o, nil
}

// ClaimOwnership makes node the owner of array at epoch if the store's
// epoch is below it and node's liveness key exists, atomically (as
// store.Store.ClaimOwnership's transaction).
func (v *View) ClaimOwnership(ctx context.Context, array, node string, epoch uint64) (store.Ownership, error) {
	if err := v.lock(ctx, "claim"); err != nil {
		return store.Ownership{}, fmt.Errorf("claim array %q for node %q: %w", array, node, err)
	}
	defer v.unlock()
	cur, err := v.ownershipLocked(array)
	if err != nil {
		return store.Ownership{}, err
	}
	if cur.Epoch == epoch && cur.Owner == node {
		return cur, nil
	}
	if cur.Epoch >= epoch {
		return store.Ownership{}, &store.ConflictError{Array: array, Wanted: epoch, Current: cur}
	}
	if _, alive := v.s.kv[v.s.key("nodes", node)]; !alive {
		return store.Ownership{}, fmt.Errorf("node %q claims array %q but its liveness key is gone; it must re-register and self-fence: %w", node, array, store.ErrNotAlive)
	}
	next := store.Ownership{Array: array, Owner: node, Epoch: epoch, Since: v.s.clk.Now().UTC()}
	b, _ := json.Marshal(next)
	next.Revision = v.s.putLocked(v.s.key("owners", array), b, 0)
	return next, nil
}

// Nodes returns the registrations of every node whose lease is alive.
func (v *View) Nodes(ctx context.Context) (map[string]store.NodeInfo, error) {
	m, _, err := v.nodes(ctx)
	return m, err
}

func (v *View) nodes(ctx context.Context) (map[string]store.NodeInfo, int64, error) {
	prefix := v.s.key("nodes") + "/"
	if err := v.lock(ctx, "list live nodes"); err != nil {
		return nil, 0, fmt.Errorf("list live nodes: %w", err)
	}
	kvs, rev := v.s.rangeLocked(prefix, clientv3.GetPrefixRangeEnd(prefix)), v.s.rev
	v.unlock()
	out := map[string]store.NodeInfo{}
	for _, kv := range kvs {
		var ni store.NodeInfo
		if err := json.Unmarshal(kv.Value, &ni); err != nil {
			return nil, 0, fmt.Errorf("node key %s: %w", kv.Key, err)
		}
		ni.Revision = kv.ModRevision
		out[ni.Node] = ni
	}
	return out, rev, nil
}

// SettledNodes is Nodes with the revision of the answer. The in-memory
// store never revokes every lease at once (no raft leader to freeze), so
// there is nothing to settle: it answers at once.
func (v *View) SettledNodes(ctx context.Context) (map[string]store.NodeInfo, int64, error) {
	return v.nodes(ctx)
}

// WatchNodes reports liveness changes from revision rev. Unlike
// store.Store it does not hold a deletion back for a grace time.
func (v *View) WatchNodes(ctx context.Context, rev int64) <-chan store.NodeEvent {
	out := make(chan store.NodeEvent)
	prefix := v.s.key("nodes") + "/"
	wc := v.watch(ctx, prefix, clientv3.GetPrefixRangeEnd(prefix), rev)
	go func() {
		defer close(out)
		for wr := range wc {
			for _, ev := range wr.Events {
				ne := store.NodeEvent{Node: strings.TrimPrefix(string(ev.Kv.Key), prefix), Alive: ev.Type == mvccpb.PUT, Revision: ev.Kv.ModRevision}
				if ne.Alive {
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

// Client is the raw client: Get, Put and Delete of the KV, and Watch.
func (v *View) Client() *clientv3.Client { return v.cli }

// Close does nothing: the store is shared.
func (v *View) Close() error { return nil }
