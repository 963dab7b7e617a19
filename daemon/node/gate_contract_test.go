package node

import (
	"io"
	"log/slog"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/blockdevtest"
	"tier0/daemon/raid"
)

// TestGateContract runs the blockdev.Device contract suite against the
// frontend gate over a RAID-5 array, open (served by this node). Its
// Close is a no-op on purpose (the served array is closed by the node), so
// the after-Close checks are skipped.
func TestGateContract(t *testing.T) {
	quiet := raid.Policy{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	blockdevtest.Run(t, func(t *testing.T) blockdev.Device {
		devs := make([]blockdev.Device, 4)
		for i := range devs {
			devs[i] = blockdev.NewMem(8<<20, 4096)
		}
		a, err := raid.Create(devs, raid.Config{Level: raid.RAID5, ChunkSize: 16 << 10, AssumeClean: true, Policy: quiet})
		if err != nil {
			t.Fatalf("Create RAID-5 over 4 members: %v", err)
		}
		t.Cleanup(func() { a.Close() })
		g := &gate{size: a.Size(), bs: a.BlockSize()}
		g.set(a)
		return g
	}, blockdevtest.Options{NoClose: true})
}
