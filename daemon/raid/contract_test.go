package raid_test

import (
	"io"
	"log/slog"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/blockdevtest"
	"tier0/daemon/raid"
)

// TestContract runs the blockdev.Device contract suite against arrays of
// each level over memory members, healthy and (RAID-5/6) degraded.
func TestContract(t *testing.T) {
	quiet := raid.Policy{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, c := range []struct {
		name    string
		level   raid.Level
		members int
		fail    []int
	}{
		{"raid0", raid.RAID0, 3, nil},
		{"raid1", raid.RAID1, 2, nil},
		{"raid5", raid.RAID5, 4, nil},
		{"raid5-degraded", raid.RAID5, 4, []int{2}},
		{"raid6", raid.RAID6, 5, nil},
		{"raid6-two-missing", raid.RAID6, 5, []int{0, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			blockdevtest.Run(t, func(t *testing.T) blockdev.Device {
				devs := make([]blockdev.Device, c.members)
				for i := range devs {
					devs[i] = blockdev.NewMem(8<<20, 4096)
				}
				a, err := raid.Create(devs, raid.Config{Level: c.level, ChunkSize: 16 << 10, AssumeClean: true, Policy: quiet})
				if err != nil {
					t.Fatalf("Create %s over %d members: %v", c.level, c.members, err)
				}
				for _, m := range c.fail {
					if err := a.FailMember(m, "contract test"); err != nil {
						t.Fatalf("FailMember(%d): %v", m, err)
					}
				}
				return a
			}, blockdevtest.Options{})
		})
	}
}
