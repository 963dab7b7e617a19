package node

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"tier0/daemon/cluster"
	"tier0/daemon/config"
)

// The coordinator's retries must back off: a store that refuses sessions
// or campaigns, or a coordinator that stops at once (its restore failed),
// is retried after a doubling wait, not in a tight loop.
func TestElectionLoopBacksOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"campaign-error", errors.New("campaign for coordinator: etcdserver: request timed out")},
		{"no-session", errNoSession},
		{"coordinator-stopped", errors.New("rebuild the state machine from the store: context deadline exceeded")},
		{"term-ended-at-once", nil}, // the session was lost as soon as it was won
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			now := time.Unix(0, 0)
			terms := 0
			var waits []time.Duration
			term := func(context.Context) error {
				terms++
				if terms == 12 {
					cancel()
				}
				return tc.err
			}
			wait := func(_ context.Context, d time.Duration) bool {
				waits = append(waits, d)
				now = now.Add(d)
				return true
			}
			electionLoop(ctx, slog.New(slog.DiscardHandler), term, wait, func() time.Time { return now })
			if len(waits) < terms-1 {
				t.Fatalf("%d terms failed (%v) and the loop waited only %d times (%v): it spins", terms, tc.err, len(waits), waits)
			}
			for i := 1; i < len(waits); i++ {
				if waits[i] < waits[i-1] {
					t.Fatalf("waits shrink: %v", waits)
				}
			}
			if waits[0] < coordRetryMin || waits[len(waits)-1] != coordRetryMax {
				t.Fatalf("waits %v: want from %v doubling up to %v", waits, coordRetryMin, coordRetryMax)
			}
		})
	}
	// A long, healthy term resets the backoff: the next campaign is at once.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	now := time.Unix(0, 0)
	terms := 0
	var waits []time.Duration
	term := func(context.Context) error {
		terms++
		switch terms {
		case 1, 2, 3:
			return errors.New("campaign failed")
		case 4:
			now = now.Add(time.Hour) // coordinated for an hour, then lost the session
			return nil
		}
		cancel()
		return nil
	}
	electionLoop(ctx, slog.New(slog.DiscardHandler), term, func(_ context.Context, d time.Duration) bool {
		waits = append(waits, d)
		now = now.Add(d)
		return true
	}, func() time.Time { return now })
	if len(waits) != 3 {
		t.Fatalf("waits %v: want three (after the failed campaigns), none after the long term", waits)
	}
}

// A view the store refused is published again on the next try even though
// the machine's decisions did not change since.
func TestPublishViewRetriesAfterFailedPut(t *testing.T) {
	n := &Node{me: &config.Node{Name: "A"}, log: slog.New(slog.DiscardHandler)}
	m, err := cluster.New(cluster.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Step(cluster.NodeJoined{Node: "A", Drives: []string{"A1"}}); err != nil {
		t.Fatal(err)
	}
	n.publishViewTo(m, func(clusterView) error { return errors.New("etcdserver: request timed out") })
	put := 0
	n.publishViewTo(m, func(clusterView) error { put++; return nil })
	if put != 1 {
		t.Fatalf("view put %d times after the store refused it once; want it published again", put)
	}
	n.publishViewTo(m, func(clusterView) error { put++; return nil })
	if put != 1 {
		t.Fatalf("unchanged view put again (%d puts)", put)
	}
}

// An intent that could not be handed to its node is not silently lost:
// a takeover or a repair that was never delivered is reported to the
// machine as failed (it retries with backoff and says why), an idempotent
// intent (ANA state, export) is sent again at the next dispatch.
func TestCourierUndeliveredTasks(t *testing.T) {
	m, err := cluster.New(cluster.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"A", "B", "C"} {
		if err := m.Step(cluster.NodeJoined{Node: n, Drives: []string{n + "1"}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Step(cluster.ArrayDefined{Name: "a", Level: cluster.RAID5, Home: "A",
		Members: []cluster.MemberSpec{{Drive: "A1"}, {Drive: "B1"}, {Drive: "C1"}}}); err != nil {
		t.Fatal(err)
	}
	fail := map[string]bool{} // action kinds whose delivery fails
	var sent []string
	c := &courier{
		send: func(_ context.Context, a cluster.Action) error {
			k, _, _ := strings.Cut(a.String(), " ")
			if fail[k] {
				return errors.New("etcdserver: request timed out")
			}
			sent = append(sent, a.String())
			return nil
		},
		local: func(context.Context, cluster.Action) {},
		log:   slog.New(slog.DiscardHandler),
	}
	ctx := t.Context()

	fail["fence"] = true
	c.dispatch(ctx, m)
	v, _ := m.Array("a")
	if v.Phase == "fencing" || !strings.Contains(v.LastError, "not delivered") {
		t.Fatalf("fence never delivered: array a phase %s, last error %q; want the takeover failed, with why", v.Phase, v.LastError)
	}
	fail["fence"] = false
	m.Tick()
	c.dispatch(ctx, m)
	v, _ = m.Array("a")
	if v.Phase != "fencing" || v.Owner != "A" {
		t.Fatalf("after a tick: %+v, want the home fencing again", v)
	}
	if err := m.Step(cluster.FenceDone{Array: "a", Node: "A", Epoch: v.Epoch}); err != nil {
		t.Fatal(err)
	}
	c.dispatch(ctx, m)
	if err := m.Step(cluster.ArrayAssembled{Array: "a", Node: "A", Epoch: v.Epoch}); err != nil {
		t.Fatal(err)
	}
	fail["ana"] = true
	c.dispatch(ctx, m)
	fail["ana"] = false
	sent = nil
	c.dispatch(ctx, m) // nothing new from the machine
	if len(sent) != 1 || !strings.HasPrefix(sent[0], "ana a on=A optimized") {
		t.Fatalf("after the ANA intent failed to send, the next dispatch sent %v; want it sent again", sent)
	}

	// B's daemon restarts: its member is resynced, but the task is lost.
	if err := m.Step(cluster.NodeReturned{Node: "B"}); err != nil {
		t.Fatal(err)
	}
	fail["resync"] = true
	c.dispatch(ctx, m)
	v, _ = m.Array("a")
	for _, mb := range v.Members {
		if mb.Drive == "B1" && (mb.State != cluster.MemberStale || !strings.Contains(v.LastError, "not delivered")) {
			t.Fatalf("resync never delivered: B1 %s, last error %q; want it stale again, with why", mb.State, v.LastError)
		}
	}
}
