package node

import (
	"bytes"
	"errors"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/raid"
)

func TestSliceWindows(t *testing.T) {
	dev := blockdev.NewMem(1<<20, 4096)
	a, b := slice(dev, 0, 2), slice(dev, 1, 2)
	if a.Size() != 512<<10 || b.Size() != 512<<10 {
		t.Fatalf("sizes %d %d, want 512 KiB each", a.Size(), b.Size())
	}
	if slice(dev, 0, 1) != blockdev.Device(dev) {
		t.Fatal("a drive used by one array must be passed through whole")
	}
	buf := bytes.Repeat([]byte{7}, 4096)
	if _, err := b.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if _, err := dev.ReadAt(got, 512<<10); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("part 1 offset 0 must land at byte 512 KiB of the drive: %v", err)
	}
	if _, err := a.ReadAt(got, 0); err != nil || bytes.Equal(got, buf) {
		t.Fatalf("part 0 must not see part 1's data: %v", err)
	}
	if _, err := b.WriteAt(buf, 512<<10); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Fatalf("write past the window: %v, want ErrOutOfRange", err)
	}
	if err := a.WriteZeroes(4096, 1); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Fatalf("misaligned zeroes: %v, want ErrMisaligned", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := dev.ReadAt(got, 0); err != nil {
		t.Fatalf("closing a part must leave the drive open: %v", err)
	}
}

func TestGateRefusesWhenNotOwner(t *testing.T) {
	g := &gate{size: 1 << 20, bs: 4096}
	buf := make([]byte, 4096)
	if _, err := g.ReadAt(buf, 0); !errors.Is(err, blockdev.ErrNoPath) {
		t.Fatalf("read without an array: %v, want ErrNoPath (the target answers ANA inaccessible)", err)
	}
	if _, err := g.WriteAtFUA(buf, 0); !errors.Is(err, blockdev.ErrNoPath) {
		t.Fatalf("FUA write without an array: %v", err)
	}
	if err := g.Flush(); !errors.Is(err, blockdev.ErrNoPath) {
		t.Fatalf("flush without an array: %v", err)
	}
	members := []blockdev.Device{blockdev.NewMem(16<<20, 4096), blockdev.NewMem(16<<20, 4096), blockdev.NewMem(16<<20, 4096)}
	arr, err := raid.Create(members, raid.Config{Level: raid.RAID5, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	g.set(arr)
	copy(buf, "tier0")
	if _, err := g.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if _, err := g.ReadAt(got, 0); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read through the gate: %v", err)
	}
	g.set(nil)
	if _, err := g.WriteAt(buf, 0); !errors.Is(err, blockdev.ErrNoPath) {
		t.Fatalf("write after release: %v", err)
	}
}

func TestPlannedSizeMatchesCreate(t *testing.T) {
	const member = 64 << 20
	g, err := raid.Plan(raid.Config{Level: raid.RAID5, ChunkSize: 64 << 10}, 4, member, 4096)
	if err != nil {
		t.Fatal(err)
	}
	var ms []blockdev.Device
	for i := 0; i < 4; i++ {
		ms = append(ms, blockdev.NewMem(member, 4096))
	}
	arr, err := raid.Create(ms, raid.Config{Level: raid.RAID5, ChunkSize: 64 << 10, AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	if arr.Size() != g.Capacity {
		t.Fatalf("planned capacity %d, created %d: every node must size the frontend namespace like the owner's RAID", g.Capacity, arr.Size())
	}
}

func TestReportsBecomeEvents(t *testing.T) {
	cases := map[string]cluster.Event{
		"fence-done":      cluster.FenceDone{Array: "a", Node: "B", Epoch: 3},
		"fence-failed":    cluster.FenceFailed{Array: "a", Node: "B", Epoch: 3, Reason: "r"},
		"ownership-lost":  cluster.OwnershipLost{Array: "a", Node: "B", Epoch: 3, Winner: "C", WinnerEpoch: 4},
		"assembled":       cluster.ArrayAssembled{Array: "a", Node: "B", Epoch: 3},
		"assemble-failed": cluster.AssembleFailed{Array: "a", Node: "B", Epoch: 3, Reason: "r"},
		"released":        cluster.Released{Array: "a", Node: "B", Epoch: 3},
		"resync-done":     cluster.ResyncDone{Array: "a", Member: "C1", Epoch: 3},
		"rebuild-done":    cluster.RebuildDone{Array: "a", Member: "C1", Epoch: 3},
		"progress":        cluster.RebuildProgress{Array: "a", Member: "C1", Percent: 40, Epoch: 3},
		"member-failed":   cluster.MemberFailed{Array: "a", Member: "C1", Epoch: 3},
		"drain":           cluster.DrainRequested{Node: "B"},
		"undrain":         cluster.UndrainRequested{Node: "B"},
		"failback":        cluster.FailbackRequested{Array: "a"},
		"drive-replaced":  cluster.DriveReplaced{Drive: "C1"},
		"array-failed":    cluster.ArrayFailed{Array: "a", Node: "B", Epoch: 3, Reason: "r"},
		"repair-failed":   cluster.RepairFailed{Array: "a", Member: "C1", Epoch: 3, Reason: "r"},
	}
	for kind, want := range cases {
		r := report{Kind: kind, Array: "a", Node: "B", Epoch: 3, Member: "C1", Percent: 40, Reason: "r", Winner: "C", WinnerEpoch: 4}
		got, err := r.event()
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if got != want {
			t.Errorf("%s: got %#v, want %#v", kind, got, want)
		}
	}
	if _, err := (report{Kind: "bogus"}).event(); err == nil {
		t.Fatal("an unknown report kind must be refused")
	}
}

func TestDerivedIDsAreStable(t *testing.T) {
	a, b := derive16("array", "c1", "A"), derive16("array", "c1", "A")
	if a != b {
		t.Fatal("the same name must give the same NGUID on every node")
	}
	if a == derive16("array", "c1", "B") || a == derive16("array", "c2", "A") {
		t.Fatal("different arrays or clusters must not share an NGUID")
	}
	if a[6]>>4 != 5 || a[8]>>6 != 2 {
		t.Fatalf("%x is not a version-5 RFC 4122 UUID", a)
	}
}
