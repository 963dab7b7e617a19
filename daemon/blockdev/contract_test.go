package blockdev_test

import (
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/blockdevtest"
)

func TestContractMem(t *testing.T) {
	for _, bs := range []int{512, 4096} {
		blockdevtest.Run(t, func(t *testing.T) blockdev.Device { return blockdev.NewMem(4<<20, bs) }, blockdevtest.Options{})
	}
}

func TestContractFault(t *testing.T) {
	blockdevtest.Run(t, func(t *testing.T) blockdev.Device { return blockdev.NewFault(blockdev.NewMem(4<<20, 4096)) }, blockdevtest.Options{})
}

func TestContractRecorder(t *testing.T) {
	blockdevtest.Run(t, func(t *testing.T) blockdev.Device { return blockdev.NewRecorder(blockdev.NewMem(4<<20, 512)) }, blockdevtest.Options{})
}
