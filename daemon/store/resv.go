package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Reservations keeps the hosts' NVMe reservation state of the frontend
// namespaces, one key per namespace, the same for every node that serves
// it (docs/FABRIC.md, "Reservations"). The value is opaque here (the
// target's ReservationState as JSON); a key changes only by
// compare-and-swap on its revision, so concurrent reservation commands
// through different nodes are ordered, and the revision is the state's
// version. The array's owner acknowledges each revision once it enforces
// it, so that a command through another node can wait for that:
//
//	resv/<subnqn>/<nsid>          the state
//	resv-applied/<subnqn>/<nsid>  {"node": owner, "revision": R}
type Reservations struct{ table }

// NewReservations works on cli's keys under prefix (the store's, e.g.
// "/tier0/<cluster>/"). cli may be an in-memory store's client.
func NewReservations(cli *clientv3.Client, prefix string) *Reservations {
	return &Reservations{newTable(cli, prefix, nil)}
}

// Reservations returns the store's reservation keys.
func (s *Store) Reservations() *Reservations { return NewReservations(s.cli, s.prefix) }

// ResvRecord is one namespace's stored reservation state.
type ResvRecord struct {
	SubNQN   string
	NSID     uint32
	Value    []byte // nil: none stored
	Revision int64  // the key's ModRevision; 0: none stored
}

// ResvConflictError is returned (wrapping ErrConflict) when a
// compare-and-swap lost: Current is what the store holds.
type ResvConflictError struct {
	Wanted  int64 // the revision the swap expected
	Current ResvRecord
}

func (e *ResvConflictError) Error() string {
	return fmt.Sprintf("reservation state of %s namespace %d changed: expected revision %d, the store holds %d; decide again on it",
		e.Current.SubNQN, e.Current.NSID, e.Wanted, e.Current.Revision)
}

func (e *ResvConflictError) Unwrap() error { return ErrConflict }

func validResvName(subnqn string, nsid uint32) error {
	if subnqn == "" || strings.ContainsAny(subnqn, "/\x00") || nsid == 0 {
		return fmt.Errorf("reservation key of %q namespace %d: the NQN must be non-empty without '/', the namespace ID not 0: %w", subnqn, nsid, ErrBadOptions)
	}
	return nil
}

func (r *Reservations) key(kind, subnqn string, nsid uint32) string {
	return r.prefix + kind + "/" + subnqn + "/" + strconv.FormatUint(uint64(nsid), 10)
}

// Get reads a namespace's state (Revision 0 when none is stored).
func (r *Reservations) Get(ctx context.Context, subnqn string, nsid uint32) (ResvRecord, error) {
	if err := validResvName(subnqn, nsid); err != nil {
		return ResvRecord{}, err
	}
	rec := ResvRecord{SubNQN: subnqn, NSID: nsid}
	resp, err := r.kv.Get(ctx, r.key("resv", subnqn, nsid))
	if err != nil {
		return rec, fmt.Errorf("read reservation state of %s namespace %d: %w", subnqn, nsid, err)
	}
	if len(resp.Kvs) > 0 {
		rec.Value, rec.Revision = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
	}
	return rec, nil
}

// CompareAndSwap stores value if the key's revision is still prev (0: no
// state stored yet) and returns the new revision; otherwise an error
// wrapping ErrConflict (a *ResvConflictError with the current record).
func (r *Reservations) CompareAndSwap(ctx context.Context, subnqn string, nsid uint32, prev int64, value []byte) (int64, error) {
	if err := validResvName(subnqn, nsid); err != nil {
		return 0, err
	}
	k := r.key("resv", subnqn, nsid)
	resp, err := r.kv.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", prev)).
		Then(clientv3.OpPut(k, string(value))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("store reservation state of %s namespace %d: %w", subnqn, nsid, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil
	}
	cur := ResvRecord{SubNQN: subnqn, NSID: nsid}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		cur.Value, cur.Revision = kvs[0].Value, kvs[0].ModRevision
	}
	return 0, &ResvConflictError{Wanted: prev, Current: cur}
}

// Watch reports every change of any namespace's state from revision rev
// (0: now). The channel closes when ctx ends or the watch breaks; the
// caller then re-reads (Get) and watches again from the last revision it
// handled + 1.
func (r *Reservations) Watch(ctx context.Context, rev int64) <-chan ResvRecord {
	base := r.prefix + "resv/"
	return WatchPrefix(ctx, r.w, base, WatchOptions{Rev: rev}, func(ev *clientv3.Event) (ResvRecord, bool) {
		name := strings.TrimPrefix(string(ev.Kv.Key), base)
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return ResvRecord{}, false
		}
		nsid, err := strconv.ParseUint(name[i+1:], 10, 32)
		if err != nil {
			return ResvRecord{}, false
		}
		rec := ResvRecord{SubNQN: name[:i], NSID: uint32(nsid), Revision: ev.Kv.ModRevision}
		if ev.Type == clientv3.EventTypePut {
			rec.Value = ev.Kv.Value
		}
		return rec, true
	})
}

type resvAck struct {
	Node     string `json:"node"`
	Revision int64  `json:"revision"`
}

// Ack records that node enforces the namespace's state at revision rev
// (the array's owner, once every command admitted under the older state
// has finished).
func (r *Reservations) Ack(ctx context.Context, subnqn string, nsid uint32, node string, rev int64) error {
	if err := validResvName(subnqn, nsid); err != nil {
		return err
	}
	b, _ := json.Marshal(resvAck{Node: node, Revision: rev})
	if _, err := r.kv.Put(ctx, r.key("resv-applied", subnqn, nsid), string(b)); err != nil {
		return fmt.Errorf("acknowledge reservation revision %d of %s namespace %d: %w", rev, subnqn, nsid, err)
	}
	return nil
}

// Applied returns the last acknowledgement of a namespace's state: which
// node enforces which revision ("" and 0 when none).
func (r *Reservations) Applied(ctx context.Context, subnqn string, nsid uint32) (string, int64, error) {
	if err := validResvName(subnqn, nsid); err != nil {
		return "", 0, err
	}
	resp, err := r.kv.Get(ctx, r.key("resv-applied", subnqn, nsid))
	if err != nil {
		return "", 0, fmt.Errorf("read reservation acknowledgement of %s namespace %d: %w", subnqn, nsid, err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, nil
	}
	var a resvAck
	if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
		return "", 0, fmt.Errorf("reservation acknowledgement of %s namespace %d: %w", subnqn, nsid, err)
	}
	return a.Node, a.Revision, nil
}

// WaitApplied waits until node has acknowledged revision rev (or a later
// one) of a namespace's state, or ctx ends.
func (r *Reservations) WaitApplied(ctx context.Context, subnqn string, nsid uint32, node string, rev int64) error {
	if err := validResvName(subnqn, nsid); err != nil {
		return err
	}
	k := r.key("resv-applied", subnqn, nsid)
	for {
		resp, err := r.kv.Get(ctx, k)
		if err != nil {
			return fmt.Errorf("wait for node %s to enforce reservation revision %d of %s namespace %d: %w", node, rev, subnqn, nsid, err)
		}
		from := resp.Header.Revision + 1
		if len(resp.Kvs) > 0 {
			var a resvAck
			if json.Unmarshal(resp.Kvs[0].Value, &a) == nil && a.Node == node && a.Revision >= rev {
				return nil
			}
		}
		wctx, cancel := context.WithCancel(ctx)
		acked := WatchPrefix(wctx, r.w, k, WatchOptions{Rev: from, Exact: true}, func(ev *clientv3.Event) (struct{}, bool) {
			var a resvAck
			return struct{}{}, ev.Type == clientv3.EventTypePut && json.Unmarshal(ev.Kv.Value, &a) == nil && a.Node == node && a.Revision >= rev
		})
		_, done := <-acked
		cancel()
		if done {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("node %s has not enforced reservation revision %d of %s namespace %d: %w", node, rev, subnqn, nsid, err)
		}
	}
}
