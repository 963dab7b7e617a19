package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Coordinator is this node's candidacy in the cluster-wide coordinator
// election. The coordinator performs the cluster-level actions of the
// failover machine (Slurm drain/resume, event log). Leadership is tied to a
// session lease: if the node cannot renew it, Done closes and another
// candidate takes over.
type Coordinator struct {
	node string
	sess *concurrency.Session
	elec *concurrency.Election
}

// NewCoordinator opens a session with the given TTL (whole seconds, at
// least 1s) for node's candidacy.
func (s *Store) NewCoordinator(ctx context.Context, node string, ttl time.Duration) (*Coordinator, error) {
	if ttl < time.Second {
		return nil, fmt.Errorf("coordinator session TTL %s is below 1s: %w", ttl, ErrBadOptions)
	}
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(int(ttl/time.Second)), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, fmt.Errorf("coordinator session for %q: %w", node, err)
	}
	return &Coordinator{node: node, sess: sess, elec: concurrency.NewElection(sess, s.key("coordinator"))}, nil
}

// Campaign blocks until this node is the coordinator or ctx ends.
func (c *Coordinator) Campaign(ctx context.Context) error {
	if err := c.elec.Campaign(ctx, c.node); err != nil {
		return fmt.Errorf("campaign of %q for coordinator: %w", c.node, err)
	}
	return nil
}

// Leader returns the current coordinator's node name, or an error wrapping
// ErrNotFound when there is none.
func (c *Coordinator) Leader(ctx context.Context) (string, error) {
	resp, err := c.elec.Leader(ctx)
	if errors.Is(err, concurrency.ErrElectionNoLeader) {
		return "", fmt.Errorf("no coordinator elected: %w", ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("read coordinator: %w", err)
	}
	return string(resp.Kvs[0].Value), nil
}

// Resign gives up leadership (if held) so another candidate can lead.
func (c *Coordinator) Resign(ctx context.Context) error { return c.elec.Resign(ctx) }

// Done closes when the session's lease is lost: this node is no longer
// coordinator (nor a candidate).
func (c *Coordinator) Done() <-chan struct{} { return c.sess.Done() }

// Close ends the candidacy and revokes the session.
func (c *Coordinator) Close() error { return c.sess.Close() }

// ElectionGuard is the Guard of a candidate that won the election whose
// key is key, created at revision rev (concurrency.Election Key and Rev):
// it holds while that candidacy leads. A write made under it by a
// coordinator that was superseded — one frozen past its session, whose
// request the store applies late — is refused.
func ElectionGuard(key string, rev int64) Guard {
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
	return &cmp
}

// PutGuarded is Put made only while guard holds (nil: always); a failed
// guard gives an error wrapping ErrNotLeader and writes nothing.
func (s *Store) PutGuarded(ctx context.Context, guard Guard, sec Section, kind, name string, v any) (int64, error) {
	if guard == nil {
		return s.Put(ctx, sec, kind, name, v)
	}
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
	resp, err := s.cli.Txn(ctx).If(*guard).Then(clientv3.OpPut(s.key(string(sec), kind, name), string(b))).Commit()
	if err != nil {
		return 0, fmt.Errorf("write %s/%s/%s: %w", sec, kind, name, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("write %s/%s/%s refused: the writer's election key changed (another coordinator leads): %w", sec, kind, name, ErrNotLeader)
	}
	return resp.Header.Revision, nil
}
