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
