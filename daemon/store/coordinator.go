package store

import (
	"context"
	"errors"
	"fmt"
	"time"

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
