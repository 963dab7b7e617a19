package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/cluster"
)

// Ownership is the record of which node owns an array, under which fencing
// epoch. Epoch 0 with an empty Owner means never owned.
type Ownership struct {
	Array    string    `json:"array"`
	Owner    string    `json:"owner"`
	Epoch    uint64    `json:"epoch"`
	Since    time.Time `json:"since"`
	Revision int64     `json:"-"` // the key's ModRevision when read
}

// ConflictError is returned (wrapping ErrConflict) when a claim lost: the
// store holds Current.
type ConflictError struct {
	Array   string
	Wanted  uint64 // the epoch the claim asked for
	Current Ownership
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("claim of array %q at epoch %d lost: the store holds owner %q at epoch %d; re-read and decide again",
		e.Array, e.Wanted, e.Current.Owner, e.Current.Epoch)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// Ownership reads an array's ownership record (a zero record when none).
func (s *Store) Ownership(ctx context.Context, array string) (Ownership, error) {
	resp, err := s.cli.Get(ctx, s.key("owners", array))
	if err != nil {
		return Ownership{}, fmt.Errorf("read owner of array %q: %w", array, err)
	}
	o := Ownership{Array: array}
	if len(resp.Kvs) == 0 {
		return o, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &o); err != nil {
		return o, fmt.Errorf("owner record of array %q: %w", array, err)
	}
	o.Revision = resp.Kvs[0].ModRevision
	return o, nil
}

// ClaimOwnership makes node the owner of array at epoch, if and only if the
// store's epoch is still below it and node's liveness lease is alive, in
// one compare-and-swap transaction on the record's revision. It returns the
// new record, or an error wrapping ErrConflict (a *ConflictError with the
// current record) or ErrNotAlive. Epochs therefore only increase, and of
// any number of contenders for one epoch exactly one wins. Claiming again
// what the node already holds at that epoch succeeds (retries are safe).
// The fencing
// epoch is also the NVMe reservation key the new owner registers.
func (s *Store) ClaimOwnership(ctx context.Context, array, node string, epoch uint64) (Ownership, error) {
	cur, err := s.Ownership(ctx, array)
	if err != nil {
		return Ownership{}, err
	}
	if cur.Epoch == epoch && cur.Owner == node {
		return cur, nil // a retried claim that already succeeded
	}
	if cur.Epoch >= epoch {
		return Ownership{}, &ConflictError{Array: array, Wanted: epoch, Current: cur}
	}
	next := Ownership{Array: array, Owner: node, Epoch: epoch, Since: s.now().UTC()}
	v, _ := json.Marshal(next)
	k, alive := s.key("owners", array), s.key("nodes", node)
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", cur.Revision),
			clientv3.Compare(clientv3.CreateRevision(alive), ">", 0)).
		Then(clientv3.OpPut(k, string(v))).
		Else(clientv3.OpGet(k), clientv3.OpGet(alive)).
		Commit()
	if err != nil {
		return Ownership{}, fmt.Errorf("claim array %q for node %q: %w", array, node, err)
	}
	if resp.Succeeded {
		next.Revision = resp.Header.Revision
		return next, nil
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) == 0 {
		return Ownership{}, fmt.Errorf("node %q claims array %q but its liveness key is gone; it must re-register and self-fence: %w", node, array, ErrNotAlive)
	}
	now := Ownership{Array: array}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		_ = json.Unmarshal(kvs[0].Value, &now)
		now.Revision = kvs[0].ModRevision
	}
	return Ownership{}, &ConflictError{Array: array, Wanted: epoch, Current: now}
}

// WatchOwnership reports every ownership change from revision rev (0: now).
//
// The channel closes when ctx ends or when the watch breaks (the member
// lost its leader, or rev was compacted away); the caller then re-reads
// the state and watches again from the last revision it handled + 1.
func (s *Store) WatchOwnership(ctx context.Context, rev int64) <-chan Ownership {
	return WatchPrefix(ctx, s.cli, s.key("owners")+"/", WatchOptions{Rev: rev}, func(ev *clientv3.Event) (Ownership, bool) {
		var o Ownership
		if ev.Type != clientv3.EventTypePut || json.Unmarshal(ev.Kv.Value, &o) != nil {
			return o, false
		}
		o.Revision = ev.Kv.ModRevision
		return o, true
	})
}

// Section is the top level of a state key: what the operator asked for,
// or what the daemons observe.
type Section string

const (
	Desired  Section = "desired"
	Observed Section = "observed"
)

func validName(what, s string) error {
	if s == "" || strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("%s %q: must be non-empty without '/': %w", what, s, ErrBadOptions)
	}
	return nil
}

// Put stores v as JSON under <section>/<kind>/<name> (kind e.g. "arrays",
// "policies", "members", "health") and returns the new revision.
func (s *Store) Put(ctx context.Context, sec Section, kind, name string, v any) (int64, error) {
	if err := validName("kind", kind); err != nil {
		return 0, err
	}
	if err := validName("name", name); err != nil {
		return 0, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encode %s/%s/%s: %w", sec, kind, name, err)
	}
	resp, err := s.cli.Put(ctx, s.key(string(sec), kind, name), string(b))
	if err != nil {
		return 0, fmt.Errorf("write %s/%s/%s: %w", sec, kind, name, err)
	}
	return resp.Header.Revision, nil
}

// Get decodes <section>/<kind>/<name> into v and returns its ModRevision,
// or an error wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, sec Section, kind, name string, v any) (int64, error) {
	resp, err := s.cli.Get(ctx, s.key(string(sec), kind, name))
	if err != nil {
		return 0, fmt.Errorf("read %s/%s/%s: %w", sec, kind, name, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, fmt.Errorf("%s/%s/%s: %w", sec, kind, name, ErrNotFound)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, v); err != nil {
		return 0, fmt.Errorf("decode %s/%s/%s: %w", sec, kind, name, err)
	}
	return resp.Kvs[0].ModRevision, nil
}

// List returns every <section>/<kind>/* value as raw JSON by name.
func (s *Store) List(ctx context.Context, sec Section, kind string) (map[string]json.RawMessage, error) {
	prefix := s.key(string(sec), kind) + "/"
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s/%s: %w", sec, kind, err)
	}
	out := map[string]json.RawMessage{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), prefix)] = json.RawMessage(kv.Value)
	}
	return out, nil
}

// Delete removes <section>/<kind>/<name>.
func (s *Store) Delete(ctx context.Context, sec Section, kind, name string) error {
	if _, err := s.cli.Delete(ctx, s.key(string(sec), kind, name)); err != nil {
		return fmt.Errorf("delete %s/%s/%s: %w", sec, kind, name, err)
	}
	return nil
}

// Change is one state key change seen by Watch.
type Change struct {
	Kind     string
	Name     string
	Value    json.RawMessage // nil when Deleted
	Deleted  bool
	Revision int64
}

// Watch reports changes under <section>/<kind>/ (every kind when kind is
// empty) from revision rev (0: now).
//
// The channel closes when ctx ends or when the watch breaks (the member
// lost its leader, or rev was compacted away); the caller then re-reads
// the state and watches again from the last revision it handled + 1.
func (s *Store) Watch(ctx context.Context, sec Section, kind string, rev int64) <-chan Change {
	base := s.key(string(sec)) + "/"
	prefix := base
	if kind != "" {
		prefix += kind + "/"
	}
	return WatchPrefix(ctx, s.cli, prefix, WatchOptions{Rev: rev}, func(ev *clientv3.Event) (Change, bool) {
		k, n, _ := strings.Cut(strings.TrimPrefix(string(ev.Kv.Key), base), "/")
		c := Change{Kind: k, Name: n, Revision: ev.Kv.ModRevision, Deleted: ev.Type == clientv3.EventTypeDelete}
		if !c.Deleted {
			c.Value = json.RawMessage(ev.Kv.Value)
		}
		return c, true
	})
}

// Event is one entry of the append-only failover log (defined once, in
// cluster, for the store and the API alike).
type Event = cluster.LogEntry

// AppendEvent adds ev to the log (Time defaults to now) and returns it with
// its revision. An entry is created once and never overwritten.
func (s *Store) AppendEvent(ctx context.Context, ev Event) (Event, error) {
	if ev.Time.IsZero() {
		ev.Time = s.now()
	}
	ev.Time = ev.Time.UTC()
	ev.Revision = 0
	b, _ := json.Marshal(ev)
	k := s.key("events", fmt.Sprintf("%019d-%s", ev.Time.UnixNano(), uuid.NewString()))
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(b))).
		Commit()
	if err != nil {
		return ev, fmt.Errorf("append event %s: %w", ev.Kind, err)
	}
	if !resp.Succeeded {
		return ev, fmt.Errorf("event key %s already exists: %w", k, ErrConflict)
	}
	ev.Revision = resp.Header.Revision
	return ev, nil
}

// Events returns the log in the order it was written, starting after
// revision after (0: from the beginning), at most limit entries (0: all).
func (s *Store) Events(ctx context.Context, after int64, limit int) ([]Event, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	if after > 0 {
		opts = append(opts, clientv3.WithMinCreateRev(after+1))
	}
	if limit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	resp, err := s.cli.Get(ctx, s.key("events")+"/", opts...)
	if err != nil {
		return nil, fmt.Errorf("read event log: %w", err)
	}
	out := make([]Event, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var ev Event
		if err := json.Unmarshal(kv.Value, &ev); err != nil {
			return nil, fmt.Errorf("event %s: %w", kv.Key, err)
		}
		ev.Revision = kv.CreateRevision
		out = append(out, ev)
	}
	return out, nil
}
