package raid

import (
	"encoding/binary"
	"hash/crc32"

	"tier0/daemon/blockdev"
)

// Incarnated is implemented by a member device that knows the power cycle
// of the drive behind it: Incarnation is a number that changes whenever
// the drive's node restarted in a way that may have lost the drive's
// volatile cache (a boot of its machine), as seen when the device was
// connected; 0 when unknown. A connection does not outlive the
// incarnation it was made to.
//
// Every superblock write records the member's incarnation in the
// superblock slot (after the CRC-checked header; older superblocks have
// none). A member whose recorded incarnation differs from its device's
// at an unclean assembly restarted since its last superblock write, so
// it may have lost writes it had completed: Assemble takes it back under
// a resync of the write-intent bitmap's dirty regions (which cover every
// write not yet flushed) instead of as current (docs/RELIABILITY.md known
// problem 8: a cache lost while the array had failed on every member).
type Incarnated interface {
	Incarnation() uint64
}

func incarnationOf(dev blockdev.Device) uint64 {
	if d, ok := dev.(Incarnated); ok {
		return d.Incarnation()
	}
	return 0
}

// The incarnation record at the end of a superblock slot: magic, the
// incarnation, CRC32C of both.
const (
	sbIncMagic = "T0SBINC1"
	sbIncOff   = sbSlotSize - 20
)

// putIncarnation records inc in a marshalled superblock slot (nothing
// when 0: unknown).
func putIncarnation(slot []byte, inc uint64) {
	if inc == 0 {
		return
	}
	b := slot[sbIncOff : sbIncOff+20]
	copy(b, sbIncMagic)
	binary.LittleEndian.PutUint64(b[8:], inc)
	binary.LittleEndian.PutUint32(b[16:], crc32.Checksum(b[:16], castagnoli))
}

// slotIncarnation is the incarnation recorded in a superblock slot, 0
// when none.
func slotIncarnation(slot []byte) uint64 {
	b := slot[sbIncOff : sbIncOff+20]
	if string(b[:8]) != sbIncMagic || crc32.Checksum(b[:16], castagnoli) != binary.LittleEndian.Uint32(b[16:]) {
		return 0
	}
	return binary.LittleEndian.Uint64(b[8:])
}

// restarted reports whether c's device restarted since its superblock was
// written (both incarnations known and different).
func (c *candidate) restarted() bool { return restartedSince(c.inc, c.dev) }

// restartedSince reports whether dev's incarnation differs from inc, the
// one its superblock recorded (both known).
func restartedSince(inc uint64, dev blockdev.Device) bool {
	now := incarnationOf(dev)
	return inc != 0 && now != 0 && now != inc
}
