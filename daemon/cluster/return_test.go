package cluster

import (
	"strings"
	"testing"
)

// returnedMachine is TestRestore's cluster reduced to one array: b, at home
// on B, moved to A under epoch 2 when B's lease expired. B then returns
// (registration started=1, fences=1) and the failback begins: A releases b,
// B is asked to fence it under epoch 3.
func returnedMachine(t *testing.T) *Machine {
	t.Helper()
	m := movedMachine(t)
	mustStep(t, m, NodeReturned{Node: "B", Started: 1, Fences: 1})
	if acts := m.Ready(); !hasAction(acts, "resync b on=A member=B1") {
		t.Fatalf("B's member of b not resynced after B returned: %s", actionList(acts))
	}
	mustStep(t, m, ResyncDone{Array: "b", Member: "B1", Epoch: 2})
	if acts := m.Ready(); !hasAction(acts, "release b on=A") {
		t.Fatalf("no failback of b after B returned: %s", actionList(acts))
	}
	mustStep(t, m, Released{Array: "b", Node: "A", Epoch: 2})
	if acts := m.Ready(); !hasAction(acts, "fence b by=B old=A epoch=2->3") {
		t.Fatalf("B not asked to fence b under epoch 3 after A released it: %s", actionList(acts))
	}
	return m
}

// movedMachine is the cluster of returnedMachine before B returns: b, at
// home on B, served by A under epoch 2 since B's lease expired.
func movedMachine(t *testing.T) *Machine {
	t.Helper()
	m, err := New(Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for _, n := range "ABCD" {
		s := string(n)
		evs = append(evs, NodeJoined{Node: s, Drives: []string{s + "1"}})
	}
	evs = append(evs, LeaseExpired{Node: "B"},
		ArrayDefined{Name: "b", Level: RAID5, Home: "B", Members: []MemberSpec{{Drive: "A1"}, {Drive: "B1"}, {Drive: "C1"}, {Drive: "D1"}}},
		ArrayObserved{Array: "b", Owner: "A", Epoch: 2, Serving: true})
	if err := m.Restore(evs); err != nil {
		t.Fatal(err)
	}
	m.Ready()
	return m
}

func mustStep(t *testing.T, m *Machine, ev Event) {
	t.Helper()
	if err := m.Step(ev); err != nil {
		t.Fatalf("step %T %+v: %v", ev, ev, err)
	}
}

func hasAction(acts []Action, prefix string) bool {
	for _, a := range acts {
		if strings.HasPrefix(a.String(), prefix) {
			return true
		}
	}
	return false
}

func actionList(acts []Action) string {
	var s []string
	for _, a := range acts {
		s = append(s, a.String())
	}
	return strings.Join(s, "; ")
}

// TestDuplicateReturnIsOneReturn: a thawed node's return reaches the
// coordinator twice, from the store's watch and from the node's own
// "returned" report, about half a second apart. If the failback began in
// between, the second must not restart it under another epoch (the strict
// campaign freeze-etcd-voter saw "array C: epoch 1 -> 4").
func TestDuplicateReturnIsOneReturn(t *testing.T) {
	m := returnedMachine(t)
	mustStep(t, m, NodeReturned{Node: "B", Started: 1, Fences: 1})
	acts := m.Ready()
	for _, a := range acts {
		if r, ok := a.(RecordEvent); ok && r.Kind == string(kindNodeRestarted) {
			t.Fatalf("the same registration of B reported twice counted as a restart: %s", actionList(acts))
		}
	}
	mustStep(t, m, FenceDone{Array: "b", Node: "B", Epoch: 3})
	mustStep(t, m, OwnershipAcquired{Array: "b", Node: "B", Epoch: 3})
	m.Ready()
	mustStep(t, m, ArrayAssembled{Array: "b", Node: "B", Epoch: 3})
	m.Ready()
	if a, _ := m.Array("b"); a.Owner != "B" || a.Epoch != 3 {
		t.Fatalf("b after B's duplicate return and the failback: owner %s epoch %d, want owner B epoch 3 (one bump for the failback)", a.Owner, a.Epoch)
	}
}

// TestReturnOfANewRegistrationTakesOver: during the failback, a return
// with another Started (the daemon restarted) or more Fences (it fenced
// itself again and stopped serving) takes b over again; one with no
// identity does as before.
func TestReturnOfANewRegistrationTakesOver(t *testing.T) {
	for _, ev := range []NodeReturned{
		{Node: "B", Started: 2, Fences: 0},
		{Node: "B", Started: 1, Fences: 2},
		{Node: "B"},
	} {
		m := returnedMachine(t)
		mustStep(t, m, ev)
		acts := m.Ready()
		restarted := false
		for _, a := range acts {
			if r, ok := a.(RecordEvent); ok && r.Kind == string(kindNodeRestarted) && r.Node == "B" {
				restarted = true
			}
		}
		if !restarted {
			t.Errorf("%+v after B's return (started=1 fences=1): no node-restarted record: %s", ev, actionList(acts))
			continue
		}
		// Taken over again: b is placed anew, under an epoch above 3.
		for i := 0; i < 3 && !hasAction(acts, "fence b"); i++ {
			m.Tick()
			acts = m.Ready()
		}
		if !hasAction(acts, "fence b") || hasAction(acts, "fence b by=B old=A epoch=2->3") {
			t.Errorf("%+v: b not fenced anew after B's new registration: %s", ev, actionList(acts))
		}
	}
}

// TestResyncDoneOfAStaleMemberCounts: the owner re-adds a member whose
// node answers again on its own, and reports its resync done while the
// machine still holds the member stale (no resync ordered yet, or backing
// off after a refusal). The report counts: the member is in sync and the
// array's failback goes on. Before, it was ignored and the member stayed
// stale until the machine ordered a resync itself (the nemesis saw an
// array degraded for 120 s with a member "stale").
func TestResyncDoneOfAStaleMemberCounts(t *testing.T) {
	m := movedMachine(t)
	mustStep(t, m, NodeReturned{Node: "B", Started: 1, Fences: 1})
	if acts := m.Ready(); !hasAction(acts, "resync b on=A member=B1") {
		t.Fatalf("B's member of b not resynced after B returned: %s", actionList(acts))
	}
	// The owner refuses (B1 does not answer yet): the machine backs off.
	mustStep(t, m, RepairFailed{Array: "b", Member: "B1", Epoch: 2, Reason: "member not reachable"})
	if acts := m.Ready(); hasAction(acts, "resync b") {
		t.Fatalf("resync ordered again at once after a refusal, want a back-off: %s", actionList(acts))
	}
	// The owner's own re-add of B1, once it answers, finishes meanwhile.
	mustStep(t, m, ResyncDone{Array: "b", Member: "B1", Epoch: 2})
	acts := m.Ready()
	if hasAction(acts, "resync b on=A member=B1") {
		t.Fatalf("B1 reported in sync by the owner, yet a resync is ordered again: %s", actionList(acts))
	}
	if !hasAction(acts, "release b on=A") {
		t.Fatalf("no failback of b after the owner reported B1 in sync: %s", actionList(acts))
	}
}

// TestMemberFailedFromASupersededOwnerIsDropped: the owner reports a
// drive its array's engine failed (a media error) under its epoch; the
// report of an owner superseded since (it ran b under epoch 1, A runs
// it under 2) changes nothing, the current owner's holds the drive
// failed, and the operator's (epoch 0) is taken as before.
func TestMemberFailedFromASupersededOwnerIsDropped(t *testing.T) {
	m := movedMachine(t)
	state := func(drive string) MemberState {
		a, _ := m.Array("b")
		for _, mb := range a.Members {
			if mb.Drive == drive {
				return mb.State
			}
		}
		t.Fatalf("no member %s in b", drive)
		return ""
	}
	mustStep(t, m, MemberFailed{Array: "b", Member: "C1", Epoch: 1})
	if st := state("C1"); st != MemberOK {
		t.Fatalf("C1 after a superseded owner's report: %q, want %q", st, MemberOK)
	}
	mustStep(t, m, MemberFailed{Array: "b", Member: "C1", Epoch: 2})
	if st := state("C1"); st != MemberDriveFailed {
		t.Fatalf("C1 after its owner's report: %q, want %q", st, MemberDriveFailed)
	}
	mustStep(t, m, MemberFailed{Array: "b", Member: "D1"})
	if st := state("D1"); st != MemberDriveFailed {
		t.Fatalf("D1 after the operator's word: %q, want %q", st, MemberDriveFailed)
	}
}
