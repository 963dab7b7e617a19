package checker

import (
	"context"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/raid"
)

// TestTakeoverWithMissingMember is the in-process form of the stale
// reads the RAID-6 kill-two campaign found (docs/RELIABILITY.md): two
// acknowledged partial-stripe writes to one stripe, to different data
// chunks, with no flush in between (both partial parity log entries stay
// live); the owner dies (Abort: nothing more written, nothing lost — the
// members are files behind a killed process); a new owner assembles with
// the member holding the second write's chunk missing. Reading that chunk
// (reconstructed from parity) must return the second write.
func TestTakeoverWithMissingMember(t *testing.T) {
	for _, tc := range []struct {
		name   string
		level  raid.Level
		n      int
		chunks []int // data chunks of stripe 5 written, in order; the last one's member is lost
	}{
		{"raid6/two-writes", raid.RAID6, 5, []int{0, 2}},
		{"raid6/one-write", raid.RAID6, 5, []int{2}},
		{"raid5/two-writes", raid.RAID5, 4, []int{0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) { takeoverCase(t, tc.level, tc.n, tc.chunks) })
	}
}

func takeoverCase(t *testing.T, level raid.Level, n int, chunks []int) {
	mems := make([]blockdev.Device, n)
	for i := range mems {
		mems[i] = blockdev.NewMem(16<<20, 4096)
	}
	uuid := [16]byte{1, 2, 3}
	a, err := raid.Create(mems, raid.Config{Level: level, ChunkSize: 64 << 10, UUID: uuid, Epoch: 1, AssumeClean: true, LogSlots: 16})
	if err != nil {
		t.Fatal(err)
	}
	g := a.Geometry()
	c, err := New([]Target{{Name: "r", Dev: a, Units: int(8 * g.StripeSize / UnitSize)}}, Options{Workers: 1, MaxRun: 1})
	if err != nil {
		t.Fatal(err)
	}
	tg := c.targets[0]
	// Every unit of stripes 0..7 written once, flushed: the old state.
	for i := 0; i < tg.Units; i++ {
		if err := c.write(tg, i, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	// Stripe 5: one acknowledged 4 KiB write per listed data chunk, no
	// flush in between, then the owner dies.
	const s = 5
	perChunk := int(g.ChunkSize / UnitSize)
	first := s * int(g.StripeSize/UnitSize)
	for _, ch := range chunks {
		if err := c.write(tg, first+ch*perChunk, 1, blockdev.AlignedBuffer(UnitSize)); err != nil {
			t.Fatal(err)
		}
	}
	a.Abort()
	// The member holding the last written chunk (md left-symmetric: P on
	// n-1-s%n, data i on (P+parity+i)%n) is gone with the old owner.
	parity := 1
	if level == raid.RAID6 {
		parity = 2
	}
	lost := (n - 1 - s%n + parity + chunks[len(chunks)-1]) % n
	devs := append([]blockdev.Device(nil), mems...)
	devs[lost] = nil
	a2, _, err := raid.Assemble(devs, raid.AssembleOptions{UUID: uuid, Epoch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Abort()
	tg.Dev, tg.fua = a2, a2
	r, err := c.Verify(context.Background(), VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Fatalf("after a takeover without member %d: %v; %v", lost, r, r.Problems)
	}
}
