package cluster

import (
	"errors"
	"reflect"
	"testing"
)

// TestOwnershipReportNamesUnknownNode: the store's word on who holds an
// array (OwnershipAcquired, OwnershipLost's winner) may name a node this
// machine has not seen join (a registration not stepped yet, a corrupt
// record). Step refuses it with ErrUnknownNode and leaves the state as it
// was; adopting it made the next reconcile dereference a node that does
// not exist, and the coordinator panicked.
func TestOwnershipReportNamesUnknownNode(t *testing.T) {
	for _, ev := range []Event{
		OwnershipAcquired{Array: "a", Node: "Z", Epoch: 7},
		OwnershipLost{Array: "a", Node: "A", Epoch: 1, Winner: "Z", WinnerEpoch: 7},
	} {
		t.Run(reflect.TypeOf(ev).Name(), func(t *testing.T) {
			m, err := New(Config{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var members []MemberSpec
			for _, n := range []string{"A", "B", "C", "D"} {
				if err := m.Step(NodeJoined{Node: n, Drives: []string{n + "1"}}); err != nil {
					t.Fatal(err)
				}
				members = append(members, MemberSpec{Drive: n + "1"})
			}
			if err := m.Step(ArrayDefined{Name: "a", Level: RAID5, Home: "A", Members: members}); err != nil {
				t.Fatal(err)
			}
			before, _ := m.Array("a")
			m.Ready()
			err = m.Step(ev)
			if !errors.Is(err, ErrUnknownNode) {
				t.Errorf("Step(%+v) = %v, want an error wrapping ErrUnknownNode", ev, err)
			}
			m.Tick()
			if after, _ := m.Array("a"); !reflect.DeepEqual(after, before) {
				t.Errorf("array a changed by a report naming an unknown node:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}
