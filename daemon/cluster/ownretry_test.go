package cluster

import "testing"

// The owner of a failed array re-assembles it on its own once enough
// members answer again (daemon/node retryFailed) and reports ArrayAssembled
// at the epoch the machine already gave it. That report must turn the
// array active and its path optimized: members cut off on the backend
// alone (no lease lost, so no NodeReturned) bring nothing else, and the
// machine would leave the array unserved until its backoff ran out
// (simulation seed 117044: freeze E, linkcut D, kill B).
func TestOwnerReassemblyOfFailedArrayServes(t *testing.T) {
	s := seedSim(t, Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	a := s.m.arrays["c"]
	a.phase = phaseAssembling // the owner's assembly at a.epoch found too few members
	owner, epoch := a.owner, a.epoch
	for _, ev := range []Event{
		ArrayFailed{Array: "c", Node: owner, Epoch: epoch, Reason: "assembly found 2 of 4 members usable"},
		AssembleFailed{Array: "c", Node: owner, Epoch: epoch, Reason: "too many failed members"},
	} {
		if err := s.step(ev); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := s.m.Array("c"); v.State != StateFailed {
		t.Fatalf("c after its failed assembly: %s, want failed", v.State)
	}
	mark := len(s.acts)
	if err := s.step(ArrayAssembled{Array: "c", Node: owner, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	optimized := false
	for _, ta := range s.acts[mark:] {
		if x, ok := ta.act.(SetANA); ok && x.Array == "c" && x.Node == owner && x.Epoch == epoch && x.State == ANAOptimized {
			optimized = true
		}
	}
	v, _ := s.m.Array("c")
	if !optimized || v.Phase != "active" || v.State == StateFailed {
		t.Fatalf("c re-assembled by its owner %s at epoch %d: phase %s, state %s, path optimized ordered %v; want active, served, optimized", owner, epoch, v.Phase, v.State, optimized)
	}
	if len(s.violations) > 0 {
		t.Fatal(s.violations)
	}
}
