package drain

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/slurm"
	"tier0/internal/fakescontrol"
)

type rig struct {
	fake   *fakescontrol.Fake
	d      *Drainer
	mu     sync.Mutex
	events []Event
}

func newRig(t *testing.T, p Policy, redundant func(context.Context, string) (bool, error)) *rig {
	t.Helper()
	r := &rig{fake: fakescontrol.New(t, "nodeA", "nodeB", "nodeC")}
	if p.ResumePoll == 0 {
		p.ResumePoll = 5 * time.Millisecond
	}
	if p.RetryAfter == 0 {
		p.RetryAfter = 5 * time.Millisecond
	}
	r.d = New(Config{
		Slurm:     slurm.New(slurm.Options{Path: r.fake.Path, Timeout: 2 * time.Second, Attempts: 2, Backoff: time.Millisecond}),
		Policy:    p,
		Redundant: redundant,
		SlurmName: func(n string) string { return "node" + n },
		OnEvent: func(e Event) {
			r.mu.Lock()
			r.events = append(r.events, e)
			r.mu.Unlock()
		},
	})
	t.Cleanup(r.d.Close)
	return r
}

func (r *rig) wait(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.d.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) want(t *testing.T, node, state, reason string) {
	t.Helper()
	st, re := r.fake.Get(node)
	if st != state || re != reason {
		t.Fatalf("%s: state %q reason %q, want %q %q", node, st, re, state, reason)
	}
}

func TestDrainAndResume(t *testing.T) {
	var redundant atomic.Bool
	var asked atomic.Int32
	r := newRig(t, Policy{}, func(ctx context.Context, node string) (bool, error) {
		asked.Add(1)
		return redundant.Load(), nil
	})
	r.d.DrainFailedNode("B", "daemon down")
	r.wait(t)
	r.want(t, "nodeB", "IDLE+DRAIN", "tier0: daemon down")

	// The same request again changes nothing in Slurm.
	n := len(r.fake.Updates())
	r.d.DrainFailedNode("B", "daemon down")
	r.wait(t)
	if got := len(r.fake.Updates()); got != n {
		t.Errorf("repeated drain ran %d more updates, want 0", got-n)
	}

	r.d.ResumeWhenRedundant("B")
	for asked.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	r.want(t, "nodeB", "IDLE+DRAIN", "tier0: daemon down")
	redundant.Store(true)
	r.wait(t)
	r.want(t, "nodeB", "IDLE", "")
	r.want(t, "nodeA", "IDLE", "")
}

func TestNeverUndoAdministratorDrain(t *testing.T) {
	r := newRig(t, Policy{OnFailure: ActionDown}, nil)
	r.fake.Set("nodeC", "IDLE+DRAIN", "maintenance: swap C2")
	r.d.DrainFailedNode("C", "fenced")
	r.wait(t)
	r.d.ResumeWhenRedundant("C")
	r.wait(t)
	r.want(t, "nodeC", "IDLE+DRAIN", "maintenance: swap C2")
	if u := r.fake.Updates(); len(u) != 0 {
		t.Errorf("updates on an administrator's node: %q", u)
	}
	r.fake.Set("nodeC", "DOWN", "Not responding")
	r.d.ResumeWhenRedundant("C")
	r.wait(t)
	r.want(t, "nodeC", "DOWN", "Not responding")
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Op != "keep" {
			t.Errorf("event %+v, want only keep", e)
		}
	}
}

func TestDownPolicy(t *testing.T) {
	r := newRig(t, Policy{OnFailure: ActionDown}, nil)
	r.d.DrainFailedNode("A", "lease lost")
	r.wait(t)
	r.want(t, "nodeA", "DOWN", "tier0: lease lost")
	r.d.ResumeWhenRedundant("A")
	r.wait(t)
	r.want(t, "nodeA", "IDLE", "")
}

func TestNoFailurePolicy(t *testing.T) {
	r := newRig(t, Policy{OnFailure: ActionNone}, nil)
	r.d.DrainFailedNode("A", "lease lost")
	r.wait(t)
	r.want(t, "nodeA", "IDLE", "")
}

func TestNewFailureCancelsResumeWait(t *testing.T) {
	r := newRig(t, Policy{}, func(context.Context, string) (bool, error) { return false, nil })
	r.d.DrainFailedNode("B", "daemon down")
	r.d.ResumeWhenRedundant("B")
	time.Sleep(20 * time.Millisecond)
	r.d.DrainFailedNode("B", "fenced")
	r.wait(t)
	r.want(t, "nodeB", "IDLE+DRAIN", "tier0: fenced")
}

func TestExtraArraysPolicy(t *testing.T) {
	r := newRig(t, Policy{ExtraArrays: ActionDrain}, nil)
	r.d.ExtraArrays("A", []string{"b", "c"})
	r.wait(t)
	r.want(t, "nodeA", "IDLE+DRAIN", "tier0: carries extra arrays b,c")
	r.d.ExtraArrays("A", nil)
	r.wait(t)
	r.want(t, "nodeA", "IDLE", "")

	// A failure outranks the extra arrays and survives their release.
	r.d.ExtraArrays("B", []string{"a"})
	r.d.DrainFailedNode("B", "drives missing B1")
	r.d.ExtraArrays("B", nil)
	r.wait(t)
	r.want(t, "nodeB", "IDLE+DRAIN", "tier0: drives missing B1")

	none := newRig(t, Policy{}, nil)
	none.d.ExtraArrays("A", []string{"b"})
	none.wait(t)
	none.d.ExtraArrays("A", nil)
	none.wait(t)
	if u := none.fake.Updates(); len(u) != 0 {
		t.Errorf("policy none made updates %q", u)
	}
}

func TestRetriesWhileSlurmAway(t *testing.T) {
	r := newRig(t, Policy{}, nil)
	r.fake.FailNext(5) // more than one op's 2 attempts
	r.d.DrainFailedNode("B", "daemon down")
	r.wait(t)
	r.want(t, "nodeB", "IDLE+DRAIN", "tier0: daemon down")
	r.mu.Lock()
	defer r.mu.Unlock()
	var failed int
	for _, e := range r.events {
		if e.Err != nil {
			failed++
			if !strings.Contains(e.Err.Error(), "slurmctld unavailable") {
				t.Errorf("event error %v, want slurmctld unavailable", e.Err)
			}
		}
	}
	if failed == 0 {
		t.Error("no failed attempt reported while slurmctld was away")
	}
}

func TestUnknownNodeIsDropped(t *testing.T) {
	r := newRig(t, Policy{}, nil)
	r.d.DrainFailedNode("Z", "daemon down")
	r.wait(t) // must not retry forever
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) != 1 || r.events[0].Err == nil {
		t.Errorf("events %+v, want one failed event", r.events)
	}
}

func TestParseAction(t *testing.T) {
	if a, err := ParseAction("Drain", ActionNone, ActionDrain); err != nil || a != ActionDrain {
		t.Errorf("ParseAction(Drain) = %v, %v", a, err)
	}
	if _, err := ParseAction("down", ActionNone, ActionDrain); err == nil {
		t.Error("ParseAction accepted a value outside the allowed list")
	}
}
