package raid

import (
	"errors"
	"math/rand"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// A RAID-6 stripe with two data members missing and a third data member
// rebuilding (past this stripe, so the stripe still has its data) takes a
// partial write that modifies all three chunks: the partial-parity log
// entry would have to carry the new content of three chunks, and its
// header holds two. The write is refused with ErrUnavailable (fence and
// refuse rather than guess), the array keeps serving reads, and a write
// that modifies two of the chunks lands. Before, encoding the entry indexed
// past the header's two slots and panicked (tier0d would have died).
func TestRAID6WriteToThreeFragileChunksRefused(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	ms := newMems(6, 2<<20)
	cfg := testCfg(RAID6, nil)
	cfg.Policy.RebuildRate = 0.25 // MiB/s: the rebuild takes seconds
	a, err := Create(devs(ms), cfg)
	if err != nil {
		t.Fatal(err)
	}
	checked(t, a)
	g := a.Geometry()
	model := randBuf(rng, int(4*g.StripeSize))
	mustWrite(t, a, 0, model)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	const s = 0
	reb := a.dataRole(s, 2)
	a.FailMember(reb, "replaced")
	if err := a.Replace(reb, blockdev.NewMem(2<<20, 512)); err != nil {
		t.Fatal(err)
	}
	// wait until the rebuild is past stripe s but not finished
	for deadline := time.Now().Add(30 * time.Second); ; {
		st := a.Status()
		m := st.Members[reb]
		if m.State == "rebuilding" && m.Recovery > s+1 {
			break
		}
		if m.State != "rebuilding" || time.Now().After(deadline) {
			t.Fatalf("member %d: state %s recovery %d; want it rebuilding past stripe %d", reb, m.State, m.Recovery, s)
		}
		time.Sleep(time.Millisecond)
	}
	a.FailMember(a.dataRole(s, 0), "lost")
	a.FailMember(a.dataRole(s, 1), "lost")
	// 4 KiB into chunk 0, all of chunk 1, 4 KiB of chunk 2
	off := s*g.StripeSize + g.ChunkSize/2
	upd := randBuf(rng, int(2*g.ChunkSize))
	_, err = a.WriteAt(upd, off)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("write to 3 missing or rebuilding chunks of a RAID-6 stripe: %v; want ErrUnavailable", err)
	}
	if got := mustRead(t, a, 0, int(g.StripeSize)); string(got) != string(model[:g.StripeSize]) {
		t.Fatalf("stripe %d reads back changed after a refused write", s)
	}
	// A write that modifies two of those chunks fits the log and lands.
	small := upd[:g.ChunkSize]
	mustWrite(t, a, off, small)
	copy(model[off:], small)
	if got := mustRead(t, a, 0, int(g.StripeSize)); string(got) != string(model[:g.StripeSize]) {
		t.Fatal("a write to two of the chunks did not read back")
	}
}
