package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotLeader: a guarded write was refused because the writer no longer
// holds the coordinator election.
var ErrNotLeader = errors.New("store: not the coordinator any more")

// Guard is a condition a write is made under; nil means unconditional.
type Guard *clientv3.Cmp

// Guard returns a condition that holds only while this candidate is the
// coordinator (its election key still exists at the revision it won). Use
// it after Campaign returned.
func (c *Coordinator) Guard() Guard {
	cmp := clientv3.Compare(clientv3.CreateRevision(c.elec.Key()), "=", c.elec.Rev())
	return &cmp
}

// Message is one queue entry.
type Message struct {
	Queue    string
	Key      string
	Revision int64 // create revision: the queue's order
	Payload  []byte
}

// Queues carry the failover machine's decisions to their performers and
// the performers' reports back (see docs/CONTROL-PLANE.md): by convention
// "intents.<node>" (actions for a node, written by the coordinator under
// its Guard) and "reports" (events from every node). A queue is ordered
// by revision; a consumer deletes (Done) what it has handled, so a
// restarted consumer sees what it had not finished.

func queueName(q string) error {
	if q == "" || strings.ContainsAny(q, "/\x00") {
		return fmt.Errorf("queue name %q: must be non-empty without '/': %w", q, ErrBadOptions)
	}
	return nil
}

// Enqueue appends payload to queue if guard holds (nil: always) and
// returns its revision; a failed guard gives ErrNotLeader.
func (s *Store) Enqueue(ctx context.Context, guard Guard, queue string, payload []byte) (int64, error) {
	if err := queueName(queue); err != nil {
		return 0, err
	}
	k := s.key("queues", queue, fmt.Sprintf("%019d-%s", s.clk.Now().UnixNano(), uuid.NewString()))
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)}
	if guard != nil {
		cmps = append(cmps, *guard)
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(clientv3.OpPut(k, string(payload))).Commit()
	if err != nil {
		return 0, fmt.Errorf("enqueue on %s: %w", queue, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("enqueue on %s refused: %w", queue, ErrNotLeader)
	}
	return resp.Header.Revision, nil
}

// Pending returns the queue's entries in order.
func (s *Store) Pending(ctx context.Context, queue string) ([]Message, error) {
	if err := queueName(queue); err != nil {
		return nil, err
	}
	resp, err := s.cli.Get(ctx, s.key("queues", queue)+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("read queue %s: %w", queue, err)
	}
	out := make([]Message, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, Message{Queue: queue, Key: string(kv.Key), Revision: kv.CreateRevision, Payload: kv.Value})
	}
	return out, nil
}

// WatchQueue reports entries added to queue from revision rev (0: now).
//
// The channel closes when ctx ends or when the watch breaks (the member
// lost its leader, or rev was compacted away); the caller then re-reads
// the state and watches again from the last revision it handled + 1.
func (s *Store) WatchQueue(ctx context.Context, queue string, rev int64) <-chan Message {
	o := WatchOptions{Rev: rev, Ops: []clientv3.OpOption{clientv3.WithFilterDelete()}}
	return WatchPrefix(ctx, s.cli, s.key("queues", queue)+"/", o, func(ev *clientv3.Event) (Message, bool) {
		if ev.Kv.Version != 1 {
			return Message{}, false
		}
		return Message{Queue: queue, Key: string(ev.Kv.Key), Revision: ev.Kv.CreateRevision, Payload: ev.Kv.Value}, true
	})
}

// Done removes a handled entry.
func (s *Store) Done(ctx context.Context, m Message) error {
	if _, err := s.cli.Delete(ctx, m.Key); err != nil {
		return fmt.Errorf("remove %s from queue %s: %w", m.Key, m.Queue, err)
	}
	return nil
}
