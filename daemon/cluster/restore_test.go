package cluster

import (
	"slices"
	"strings"
	"testing"
)

// TestRestore rebuilds a machine from what the store would hold after the
// seed's "kill B" (b owned by A at epoch 2, B's lease gone, B's members
// missing) and checks that it decides nothing new for arrays that are
// served, and takes over an array whose owner does not report serving it.
func TestRestore(t *testing.T) {
	m, err := New(Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for _, n := range "ABCDE" {
		s := string(n)
		evs = append(evs, NodeJoined{Node: s, Drives: []string{s + "1", s + "2", s + "3", s + "4"}})
	}
	evs = append(evs, LeaseExpired{Node: "B"})
	members := map[string]string{"a": "B1,C1,D1,E1", "b": "A1,C2,D2,E2", "c": "A2,B2,D3,E3", "d": "A3,B3,C3,E4", "e": "A4,B4,C4,D4"}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		var ms []MemberSpec
		for _, d := range strings.Split(members[name], ",") {
			ms = append(ms, MemberSpec{Drive: d})
		}
		evs = append(evs, ArrayDefined{Name: name, Level: RAID5, Home: strings.ToUpper(name), Members: ms})
		owner, epoch, serving := strings.ToUpper(name), uint64(1), true
		switch name {
		case "b":
			owner, epoch = "A", 2
		case "e":
			serving = false // E crashed mid-assemble and restarted
		}
		evs = append(evs, ArrayObserved{Array: name, Owner: owner, Epoch: epoch, Serving: serving})
	}
	if err := m.Restore(evs); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range m.Ready() {
		got = append(got, a.String())
	}
	// B is down: it is drained again (the coordinator that saw it die may
	// have died with it), then E, which crashed mid-assemble, is re-fenced.
	want := []string{`slurm-drain B reason="tier0: storage lease expired"`, "fence e by=E old=E epoch=1->2 members=A4,C4,D4"}
	if !slices.Equal(got, want) {
		t.Fatalf("actions after restore:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, a := range m.Arrays() {
		wantState := StateDegraded
		switch a.Name {
		case "b":
			wantState = StateOptimal
		case "e":
			wantState = StateOffline
		}
		if a.State != wantState {
			t.Errorf("array %s: %s, want %s", a.Name, a.State, wantState)
		}
	}
	if a, _ := m.Array("b"); a.Owner != "A" || a.Epoch != 2 {
		t.Fatalf("b restored as %+v", a)
	}
	// B returns: b fails back under epoch 3, exactly as without a restore.
	if err := m.Step(NodeReturned{Node: "B"}); err != nil {
		t.Fatal(err)
	}
	var release bool
	for _, a := range m.Ready() {
		if r, ok := a.(Release); ok && r.Array == "b" && r.Node == "A" && r.To == "B" {
			release = true
		}
	}
	if !release {
		t.Fatal("no failback of b after B returned")
	}
	if err := m.Restore([]Event{ArrayObserved{Array: "zz"}}); err == nil {
		t.Fatal("restore of an unknown array accepted")
	}
}

// A coordinator replaced in the middle of a move (a thawed etcd leader's
// revoke ends its term) restores an array whose new owner has claimed the
// epoch but not reported serving yet. The machine resumes that takeover at
// the claimed epoch — the owner fences and assembles again at an epoch it
// holds, both idempotent — instead of assigning the array again under the
// next epoch. Found by the freeze-etcd-voter campaign in CI: the frozen
// coordinator's own array went epoch 1 -> 4 over one failover and one
// failback. An owner whose claim predates its registration (it restarted
// or fenced itself since) is re-taken under a new epoch, as before.
func TestRestoreResumesClaimedTakeover(t *testing.T) {
	restore := func(claimed bool) (*Machine, []string) {
		m, err := New(Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
		if err != nil {
			t.Fatal(err)
		}
		evs := []Event{
			NodeJoined{Node: "A", Drives: []string{"A1"}}, NodeJoined{Node: "B", Drives: []string{"B1"}},
			NodeJoined{Node: "C", Drives: []string{"C1"}}, NodeJoined{Node: "D", Drives: []string{"D1"}},
			ArrayDefined{Name: "c", Level: RAID5, Home: "C", Members: []MemberSpec{{Drive: "A1"}, {Drive: "B1"}, {Drive: "D1"}}},
			// C claimed epoch 3 for its failback from A; no record says it serves yet.
			ArrayObserved{Array: "c", Owner: "C", Epoch: 3, Serving: false, Claimed: claimed},
		}
		if err := m.Restore(evs); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range m.Ready() {
			got = append(got, a.String())
		}
		return m, got
	}
	m, got := restore(true)
	want := []string{"fence c by=C old=C epoch=3->3 members=A1,B1,D1"}
	if !slices.Equal(got, want) {
		t.Fatalf("actions after restoring a claimed takeover:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	steps := []Event{FenceDone{Array: "c", Node: "C", Epoch: 3}, ArrayAssembled{Array: "c", Node: "C", Epoch: 3}}
	for _, ev := range steps {
		if err := m.Step(ev); err != nil {
			t.Fatal(err)
		}
	}
	if a, _ := m.Array("c"); a.Owner != "C" || a.Epoch != 3 || a.State != StateOptimal {
		t.Fatalf("after the resumed takeover: %+v, want served by C at epoch 3", a)
	}
	var ana bool
	for _, a := range m.Ready() {
		if s, ok := a.(SetANA); ok && s.Node == "C" && s.Epoch == 3 && s.State == ANAOptimized {
			ana = true
		}
	}
	if !ana {
		t.Fatal("no optimized ANA state for C at epoch 3 after the resumed takeover")
	}
	// A resumed takeover that reports nothing is given up as any other.
	m, _ = restore(true)
	for range m.cfg.ReleaseTimeoutTicks + 1 {
		for _, n := range []string{"A", "B", "C", "D"} {
			if err := m.Step(Heartbeat{Node: n}); err != nil {
				t.Fatal(err)
			}
		}
		m.Tick()
	}
	if a, _ := m.Array("c"); a.Epoch <= 3 {
		t.Fatalf("a resumed takeover that never answered still holds the array at epoch %d", a.Epoch)
	}
	// Not claimed under the owner's live registration: taken again.
	_, got = restore(false)
	want = []string{"fence c by=C old=C epoch=3->4 members=A1,B1,D1"}
	if !slices.Equal(got, want) {
		t.Fatalf("actions after restoring an unclaimed record:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
