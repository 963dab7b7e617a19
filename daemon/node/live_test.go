package node

import (
	"context"
	"testing"
	"time"

	"tier0/daemon/clock"
)

// The liveness loop fences on its own timer at the lease's local deadline
// minus the margin, even when the store never says the lease is lost (a
// hung etcd client).
func TestLeaseWatchdogFiresWithoutTheStore(t *testing.T) {
	l := &stuckLease{deadline: time.Now().Add(200 * time.Millisecond), lost: make(chan struct{})}
	got := make(chan string, 1)
	go func() { got <- awaitLeaseLoss(t.Context(), clock.Real, l, 50*time.Millisecond) }()
	select {
	case why := <-got:
		if why == "" {
			t.Fatal("awaitLeaseLoss returned without a reason")
		}
		if now := time.Now(); now.Before(l.deadline.Add(-50 * time.Millisecond)) {
			t.Fatalf("fenced at %s, before the deadline minus margin %s", now, l.deadline.Add(-50*time.Millisecond))
		}
	case <-time.After(notReturning):
		t.Fatal("the lease's local deadline passed without the watchdog firing")
	}
	// A renewal that moves the deadline on keeps the lease.
	l2 := &stuckLease{deadline: time.Now().Add(time.Hour), lost: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if why := awaitLeaseLoss(ctx, clock.Real, l2, time.Second); why != "" {
		t.Fatalf("a lease an hour from its deadline was declared lost: %s", why)
	}
}

type stuckLease struct {
	deadline time.Time
	lost     chan struct{}
}

func (l *stuckLease) Lost() <-chan struct{} { return l.lost }
func (l *stuckLease) Err() error            { return nil }
func (l *stuckLease) Deadline() time.Time   { return l.deadline }
