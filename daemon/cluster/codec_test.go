package cluster

import (
	"errors"
	"reflect"
	"testing"
)

var sampleActions = []Action{
	Fence{Array: "b", Node: "A", OldOwner: "B", OldEpoch: 1, NewEpoch: 2, Members: []string{"A1", "C2"}},
	Assemble{Array: "b", Node: "A", Epoch: 2, Degraded: []string{"B1"}, Stale: []string{"C2"}},
	Release{Array: "b", Node: "A", Epoch: 2, To: "B"},
	SetANA{Array: "b", Node: "A", State: ANAOptimized, Epoch: 2},
	Export{Node: "B", Drives: []string{"B1"}},
	Resync{Array: "a", Node: "A", Member: "B1", Epoch: 4},
	Rebuild{Array: "a", Node: "A", Member: "C1", Epoch: 4},
	SelfFence{Node: "C"},
	SlurmDrain{Node: "B", Reason: "r"},
	SlurmResume{Node: "B", Reason: "r"},
	RecordEvent{Kind: "failover", Array: "b", From: "B", To: "A", Epoch: 2, Ticks: 10},
}

var sampleEvents = []Event{
	NodeJoined{Node: "A", Domain: "r1", Drives: []string{"A1"}},
	Heartbeat{Node: "A"}, LeaseExpired{Node: "A"}, NodeReturned{Node: "A", Started: 1764633600123456789, Fences: 2}, SelfLeaseLost{Node: "A"},
	PartitionSuspected{Node: "A"}, PartitionCleared{Node: "A"},
	ArrayDefined{Name: "a", Level: RAID6, Home: "A", Members: []MemberSpec{{Drive: "B1", Node: "B"}}, Failback: FailbackManual},
	ArrayRemoved{Name: "a"},
	FenceDone{Array: "a", Node: "A", Epoch: 3}, FenceFailed{Array: "a", Node: "A", Epoch: 3, Reason: "x"},
	OwnershipAcquired{Array: "a", Node: "A", Epoch: 3}, OwnershipLost{Array: "a", Node: "A", Epoch: 3, Winner: "B", WinnerEpoch: 3},
	ArrayAssembled{Array: "a", Node: "A", Epoch: 3}, AssembleFailed{Array: "a", Node: "A", Epoch: 3, Reason: "y"},
	Released{Array: "a", Node: "A", Epoch: 3}, ResyncDone{Array: "a", Member: "B1", Epoch: 4},
	RebuildProgress{Array: "a", Member: "B1", Percent: 40, Epoch: 4}, RebuildDone{Array: "a", Member: "B1", Epoch: 4},
	MemberFailed{Array: "a", Member: "B1"}, DriveReplaced{Drive: "B1"}, DrainRequested{Node: "A"},
	UndrainRequested{Node: "A"}, FailbackRequested{Array: "a"},
	ArrayObserved{Array: "a", Owner: "A", Epoch: 3, Serving: true, Members: map[string]MemberState{"B1": MemberStale}},
	ArrayFailed{Array: "a", Node: "A", Epoch: 3, Reason: "2 of 4 members failed"},
	RepairFailed{Array: "a", Member: "B1", Epoch: 3, Reason: "too many failed members"},
}

func TestCodecRoundTrip(t *testing.T) {
	if len(sampleActions) != len(actionTypes) || len(sampleEvents) != len(eventTypes) {
		t.Fatalf("samples cover %d/%d actions and %d/%d events", len(sampleActions), len(actionTypes), len(sampleEvents), len(eventTypes))
	}
	for _, a := range sampleActions {
		b, err := MarshalAction(a)
		if err != nil {
			t.Fatal(err)
		}
		got, err := UnmarshalAction(b)
		if err != nil || !reflect.DeepEqual(got, a) {
			t.Fatalf("%s: round trip gave %#v, %v", b, got, err)
		}
	}
	for _, e := range sampleEvents {
		b, err := MarshalEvent(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := UnmarshalEvent(b)
		if err != nil || !reflect.DeepEqual(got, e) {
			t.Fatalf("%s: round trip gave %#v, %v", b, got, err)
		}
	}
	// A NodeReturned of before the registration's identity decodes without
	// one (and so takes the node's arrays over as it did), and one without
	// an identity encodes as it did.
	if got, err := UnmarshalEvent([]byte(`{"type":"node-returned","body":{"Node":"A"}}`)); err != nil || got != (NodeReturned{Node: "A"}) {
		t.Fatalf("an old node-returned decoded as %#v, %v; want NodeReturned{Node: \"A\"}", got, err)
	}
	if b, err := MarshalEvent(NodeReturned{Node: "A"}); err != nil || string(b) != `{"type":"node-returned","body":{"Node":"A"}}` {
		t.Fatalf("NodeReturned without an identity encoded as %s, %v; want the old encoding", b, err)
	}
	for _, bad := range []string{``, `{`, `{"type":"nope"}`, `{"type":"fence","body":[1]}`, `{"type":"heartbeat"}`} {
		_, errA := UnmarshalAction([]byte(bad))
		_, errE := UnmarshalEvent([]byte(bad))
		if bad == `{"type":"heartbeat"}` {
			errA = errE // a bodiless event is a valid zero event
			if errE != nil {
				t.Fatalf("%q: %v", bad, errE)
			}
			continue
		}
		if !errors.Is(errA, ErrBadConfig) || !errors.Is(errE, ErrBadConfig) {
			t.Fatalf("%q accepted: %v / %v", bad, errA, errE)
		}
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, a := range sampleActions {
		b, _ := MarshalAction(a)
		f.Add(b)
	}
	for _, e := range sampleEvents {
		b, _ := MarshalEvent(e)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if a, err := UnmarshalAction(b); err == nil {
			if _, err := MarshalAction(a); err != nil {
				t.Fatalf("decoded action %#v does not encode: %v", a, err)
			}
		}
		if e, err := UnmarshalEvent(b); err == nil {
			if _, err := MarshalEvent(e); err != nil {
				t.Fatalf("decoded event %#v does not encode: %v", e, err)
			}
		}
	})
}
