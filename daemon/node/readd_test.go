package node

import (
	"bytes"
	"testing"
)

// A member missing in the RAID engine whose repair record outlived its
// repair (a resync started at assembly or by the owner, lost with its
// member) used to be skipped by the owner's periodic re-add as "busy":
// only a coordinator order could bring it back, and a coordinator that
// held the member stale or resyncing while its orders were refused or
// lost left the array degraded for good (nemesis seed 2 in CI, array B:
// "C2=stale" for 120 s after every fault healed). The owner now re-adds
// it on its own once it answers.
func TestOwnerReaddsMissingMemberWithALeftoverRepairRecord(t *testing.T) {
	s := newTestSite(t)
	x := startX(t, s)
	a := s.node("A")
	kept := bytes.Repeat([]byte{0x4b}, 64<<10)
	if _, err := x.gate.WriteAtFUA(kept, 0); err != nil {
		t.Fatal(err)
	}
	s.holds["D1"].hold()
	got := make([]byte, len(kept))
	if _, err := x.gate.ReadAt(got, 0); err != nil || !bytes.Equal(got, kept) {
		t.Fatalf("read around the stalled member: %v", err)
	}
	i := x.role("D1")
	if st := x.array.Status(); st.Members[i].State != "missing" {
		t.Fatalf("D1 after its reads stalled past the timeout: %+v, want missing", st.Members[i])
	}
	// What a resync lost with its member leaves behind: the record.
	x.mu.Lock()
	x.pending[i] = "resync"
	x.mu.Unlock()
	more := bytes.Repeat([]byte{0xb4}, 64<<10)
	if _, err := x.gate.WriteAtFUA(more, 1<<20); err != nil {
		t.Fatal(err)
	}
	s.holds["D1"].release()
	a.retryFailed(t.Context()) // the owner's periodic retry, once: D1 answers
	if st := x.array.Status(); st.Members[i].State == "missing" || st.Members[i].State == "failed" {
		t.Fatalf("D1 after the owner's retry with D1 answering again: %+v, want rebuilding or active (re-added)", st.Members[i])
	}
	for _, want := range []struct {
		off  int64
		data []byte
	}{{0, kept}, {1 << 20, more}} {
		if _, err := x.gate.ReadAt(got, want.off); err != nil || !bytes.Equal(got, want.data) {
			t.Fatalf("read at %d after D1 was re-added: %v", want.off, err)
		}
	}
}
