package node

import (
	"testing"
	"time"

	"tier0/daemon/cluster"
	"tier0/daemon/config"
)

// scrubTakes bounds waiting for a scrub (a read of every stripe over the
// loopback fabric, on a shared machine): a guard, not a speed goal.
const scrubTakes = 3 * time.Minute

// awaitScrub waits for the array's scrub record to show a finished run.
func awaitScrub(t *testing.T, x *served) scrubRecord {
	t.Helper()
	for deadline := time.Now().Add(scrubTakes); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r := x.scrub.Load(); r != nil && !r.Running && !r.Finished.IsZero() {
			return *r
		}
	}
	t.Fatalf("no scrub finished within %s (record %+v)", scrubTakes, x.scrub.Load())
	return scrubRecord{}
}

// `tier0 array scrub` reaches the owner as a task under its epoch; the
// scrub's findings land in the array's record, which the owner publishes.
func TestScrubTaskFindsMismatch(t *testing.T) {
	s := newTestSite(t)
	a := s.node("A")
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: []string{"C1", "D1", "E1"}})
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	x := a.served("x")

	// A task of another epoch is refused.
	s.do("A", "scrubarray", scrubArray{Array: "x", Node: "A", Epoch: 7})
	if r := x.scrub.Load(); r != nil {
		t.Fatalf("a scrub ordered at epoch 7 ran on the array of epoch 1: %+v", r)
	}

	s.do("A", "scrubarray", scrubArray{Array: "x", Node: "A", Epoch: 1})
	if r := awaitScrub(t, x); r.Mismatches != 0 || r.Error != "" {
		t.Fatalf("scrub of a consistent array: %+v, want no mismatches", r)
	}
	// A latent bad block on C1 (in its data area): found by the next scrub.
	bad := make([]byte, 4096)
	for i := range bad {
		bad[i] = 0xee
	}
	off := x.array.Geometry().DataOffset
	if _, err := s.mems["C1"].WriteAt(bad, off); err != nil {
		t.Fatal(err)
	}
	x.scrub.Store(nil)
	s.do("A", "scrubarray", scrubArray{Array: "x", Node: "A", Epoch: 1})
	r := awaitScrub(t, x)
	if r.Mismatches != 1 || len(r.Stripes) != 1 || r.Stripes[0] != 0 {
		t.Fatalf("scrub after corrupting stripe 0 on C1: %+v, want 1 mismatch at stripe 0", r)
	}
	if o := x.observed(1, true, x.array.Status()); o.Scrub == nil || o.Scrub.Mismatches != 1 {
		t.Fatalf("the published record lacks the scrub's findings: %+v", o.Scrub)
	}
}

// policies.scrub_interval scrubs each running array that long after the
// last scrub (counted from when the node started running it).
func TestPeriodicScrub(t *testing.T) {
	s := newTestSite(t)
	a := s.node("A")
	a.cfg.Policies.ScrubInterval = config.Duration(time.Hour)
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: []string{"C1", "D1", "E1"}})
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	x := a.served("x")
	now := time.Now()
	a.scrubDue(now)
	a.scrubDue(now.Add(59 * time.Minute))
	if r := x.scrub.Load(); r != nil {
		t.Fatalf("scrubbed before the interval passed: %+v", r)
	}
	a.scrubDue(now.Add(61 * time.Minute))
	if r := awaitScrub(t, x); r.Mismatches != 0 {
		t.Fatalf("periodic scrub: %+v", r)
	}
}
