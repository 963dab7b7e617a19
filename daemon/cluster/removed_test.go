package cluster

import (
	"errors"
	"testing"
)

// TestArrayDefinedAndRemovedWhileRunning: an array defined on a running
// machine (tier0 array create) is fenced at its home at once; removed, it
// is forgotten, and a later report about it is refused as unknown.
func TestArrayDefinedAndRemovedWhileRunning(t *testing.T) {
	m, err := New(Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var members []MemberSpec
	for _, n := range []string{"A", "B", "C", "D"} {
		if err := m.Step(NodeJoined{Node: n, Drives: []string{n + "1"}}); err != nil {
			t.Fatal(err)
		}
		if err := m.Step(Heartbeat{Node: n}); err != nil {
			t.Fatal(err)
		}
		if n != "A" {
			members = append(members, MemberSpec{Drive: n + "1"})
		}
	}
	m.Ready()
	if err := m.Step(ArrayDefined{Name: "p", Level: RAID5, Home: "A", Members: members}); err != nil {
		t.Fatal(err)
	}
	fenced := false
	for _, a := range m.Ready() {
		if f, ok := a.(Fence); ok && f.Array == "p" && f.Node == "A" {
			fenced = true
		}
	}
	if !fenced {
		t.Fatal("array defined while running: no Fence at its home A")
	}
	if err := m.Step(ArrayRemoved{Name: "p"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Array("p"); ok || len(m.Arrays()) != 0 {
		t.Fatalf("removed array still in the machine: %+v", m.Arrays())
	}
	if err := m.Step(FenceDone{Array: "p", Node: "A", Epoch: 1}); !errors.Is(err, ErrUnknownArray) {
		t.Fatalf("report about a removed array: %v, want ErrUnknownArray", err)
	}
	if err := m.Step(ArrayRemoved{Name: "p"}); !errors.Is(err, ErrUnknownArray) {
		t.Fatalf("removed twice: %v, want ErrUnknownArray", err)
	}
}
