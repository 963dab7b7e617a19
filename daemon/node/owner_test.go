package node

import (
	"bytes"
	"testing"

	"tier0/daemon/cluster"
	"tier0/daemon/host"
)

// A stale ex-owner (epoch 1) runs a repair that was queued for it after a
// new owner (epoch 2) fenced the members: it must neither take the
// reservation back nor write the member (issue 12, hole 1).
func TestStaleOwnerRepairCannotRetakeReservation(t *testing.T) {
	s := newTestSite(t)
	members := []string{"C1", "D1", "E1"}

	// A owns x at epoch 1 and writes.
	s.do("A", "fence", cluster.Fence{Array: "x", Node: "A", NewEpoch: 1, Members: members})
	s.wantReport("A", "fence-done")
	s.do("A", "assemble", cluster.Assemble{Array: "x", Node: "A", Epoch: 1})
	s.wantReport("A", "assembled")
	old := bytes.Repeat([]byte{0x11}, 4096)
	if _, err := s.node("A").served("x").gate.WriteAt(old, 0); err != nil {
		t.Fatalf("write through A: %v", err)
	}
	// C1 fails under A; the coordinator queues a resync of C1 for A at
	// epoch 1. A freezes before it runs it.
	s.do("A", "failmember", map[string]any{"Array": "x", "Node": "A", "Member": "C1", "Epoch": 1})

	// B takes x over at epoch 2 (C1 left out) and takes writes.
	s.do("B", "fence", cluster.Fence{Array: "x", Node: "B", OldOwner: "A", OldEpoch: 1, NewEpoch: 2, Members: members})
	s.wantReport("B", "fence-done")
	s.do("B", "assemble", cluster.Assemble{Array: "x", Node: "B", Epoch: 2, Degraded: []string{"C1"}})
	s.wantReport("B", "assembled")
	b := s.node("B")
	newer := bytes.Repeat([]byte{0x22}, 4096)
	if _, err := b.served("x").gate.WriteAt(newer, 0); err != nil {
		t.Fatalf("write through B: %v", err)
	}
	bID := hostID(s.cfg, "B")
	if id, key := s.holder("C1"); id != bID || key != 2 {
		t.Fatalf("before the stale repair C1 is held by %x key %d, want B (%x) key 2", id, key, bID)
	}
	before := s.snapshot("C1")

	// A thaws and runs the queued resync of epoch 1.
	s.do("A", "resync", cluster.Resync{Array: "x", Node: "A", Member: "C1", Epoch: 1})

	if id, key := s.holder("C1"); id != bID || key != 2 {
		t.Errorf("the stale owner's repair took C1's reservation: now held by %x key %d, want B (%x) key 2", id, key, bID)
	}
	if after := s.snapshot("C1"); !bytes.Equal(before, after) {
		i := 0
		for i < len(before) && before[i] == after[i] {
			i++
		}
		t.Errorf("the stale owner's repair wrote member C1 under the new owner (first changed byte at offset %d)", i)
	}
	r := s.wantReport("A", "repair-failed")
	if r.Array != "x" || r.Member != "C1" || r.Epoch != 1 || r.Reason == "" {
		t.Errorf("repair-failed report %+v: want array x, member C1, epoch 1 and a reason", r)
	}
	if a := s.node("A").served("x"); a.array != nil {
		t.Errorf("A still runs x at epoch %d after learning that it lost it", a.epoch)
	}
	got := make([]byte, 4096)
	if _, err := b.served("x").gate.ReadAt(got, 0); err != nil || !bytes.Equal(got, newer) {
		t.Fatalf("B's read of block 0 after the stale repair: err %v, data %x..., want %x...", err, got[:4], newer[:4])
	}
}

// fenceNS never preempts a holder whose key is at least its own: the
// reservation key is the ownership epoch.
func TestFenceNeverPreemptsEqualOrNewerKey(t *testing.T) {
	s := newTestSite(t)
	a, b := s.node("A"), s.node("B")
	dial := func(n *Node) *host.Namespace {
		c, ns, err := n.dialMember(t.Context(), "x", "C1", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return ns
	}
	na, nb := dial(a), dial(b)
	if err := b.fenceNS(nb, 5); err != nil {
		t.Fatalf("B fences C1 under key 5: %v", err)
	}
	for _, key := range []uint64{4, 5} {
		if err := a.fenceNS(na, key); err == nil {
			t.Errorf("A with key %d preempted B's key 5", key)
		}
		if id, k := s.holder("C1"); id != hostID(s.cfg, "B") || k != 5 {
			t.Fatalf("after A's attempt with key %d C1 is held by %x key %d, want B key 5", key, id, k)
		}
	}
	if err := a.fenceNS(na, 6); err != nil {
		t.Fatalf("A with the newer key 6: %v", err)
	}
	if id, k := s.holder("C1"); id != hostID(s.cfg, "A") || k != 6 {
		t.Fatalf("after A's key 6 C1 is held by %x key %d, want A key 6", id, k)
	}
	// B, now stale, may not take it back with its old key.
	if err := b.fenceNS(nb, 5); err == nil {
		t.Error("B with the stale key 5 preempted A's key 6")
	}
	if id, k := s.holder("C1"); id != hostID(s.cfg, "A") || k != 6 {
		t.Fatalf("C1 is held by %x key %d, want A key 6", id, k)
	}
}
