package local

import (
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/blockdevtest"
)

// TestContract runs the blockdev.Device contract suite against a file
// opened with O_DIRECT, with each I/O engine.
func TestContract(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(map[bool]string{false: "aio", true: "sync"}[sync], func(t *testing.T) {
			blockdevtest.Run(t, func(t *testing.T) blockdev.Device {
				return openFile(t, 4<<20, Options{SyncIO: sync})
			}, blockdevtest.Options{})
		})
	}
}

// TestContractMemory runs the contract suite against the memory device of
// `fabric serve --ns mem:SIZE`.
func TestContractMemory(t *testing.T) {
	blockdevtest.Run(t, func(t *testing.T) blockdev.Device {
		m, err := NewMemory(4<<20, 4096)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}, blockdevtest.Options{})
}
