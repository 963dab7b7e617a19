package bench

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"hash/fnv"
)

// Verify blocks. In verify mode every VerifyUnit bytes of data written carry
// a 32-byte header followed by a pattern derived from the header:
//
//	off len field
//	  0   4 magic "T0VB"
//	  4   4 CRC32C (Castagnoli) of the whole unit with this field as zero
//	  8   8 device id (FNV-1a 64 of Target.ID)
//	 16   8 LBA: byte offset of the unit / the device's block size
//	 24   8 generation (Config.Generation of the run that wrote it)
//	 32   …  pattern: xorshift64 stream seeded from the three fields above
//
// A verify read checks the magic, the CRC, that the device id and LBA are
// the ones being read (a block that landed on the wrong device or offset is
// "misplaced", not merely corrupt), and that the generation is not older
// than Config.MinGeneration ("stale": a lost write).
const (
	// VerifyUnit is the size of one self-describing block. Every I/O size
	// used in verify mode is a multiple of it.
	VerifyUnit = 4096
	verifyHdr  = 32
)

var verifyMagic = [4]byte{'T', '0', 'V', 'B'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Sentinel outcomes of checking one unit. CheckUnit wraps nothing; it returns
// these values directly so callers compare with errors.Is or ==.
var (
	// ErrVerifyCorrupt: the magic or the CRC32C does not match — the data
	// in the unit is not what any writer of this tool put there.
	ErrVerifyCorrupt = errors.New("verify: block corrupt (bad magic or CRC32C)")
	// ErrVerifyMisplaced: a valid block, but written for another device or
	// LBA than the one it was read from.
	ErrVerifyMisplaced = errors.New("verify: block belongs to another device or LBA")
	// ErrVerifyStale: a valid block whose generation is older than required
	// (a write that was acknowledged but lost).
	ErrVerifyStale = errors.New("verify: block generation older than expected")
	// ErrVerifyUnwritten: the unit reads back as all zeroes (never written,
	// or discarded).
	ErrVerifyUnwritten = errors.New("verify: block never written (all zeroes)")
)

// DeviceHash is the 64-bit device id stored in verify headers for a target
// id.
func DeviceHash(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// FillUnit writes a verify block for (dev, lba, gen) into u, which must be
// exactly VerifyUnit bytes long.
func FillUnit(u []byte, dev, lba, gen uint64) {
	_ = u[VerifyUnit-1]
	copy(u[0:4], verifyMagic[:])
	binary.LittleEndian.PutUint32(u[4:8], 0)
	binary.LittleEndian.PutUint64(u[8:16], dev)
	binary.LittleEndian.PutUint64(u[16:24], lba)
	binary.LittleEndian.PutUint64(u[24:32], gen)
	x := dev ^ (lba * 0x9E3779B97F4A7C15) ^ (gen << 17) ^ 0x2545F4914F6CDD1D
	if x == 0 {
		x = 1
	}
	for i := verifyHdr; i < VerifyUnit; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(u[i:i+8], x)
	}
	binary.LittleEndian.PutUint32(u[4:8], unitCRC(u))
}

func unitCRC(u []byte) uint32 {
	var zero [4]byte
	c := crc32.Update(0, castagnoli, u[0:4])
	c = crc32.Update(c, castagnoli, zero[:])
	return crc32.Update(c, castagnoli, u[8:VerifyUnit])
}

// CheckUnit checks one VerifyUnit-sized block read from device dev at lba.
// It returns nil when the block is intact, for that device and LBA, and of
// generation minGen or newer; otherwise one of the ErrVerify sentinels.
func CheckUnit(u []byte, dev, lba, minGen uint64) error {
	_ = u[VerifyUnit-1]
	if [4]byte(u[0:4]) != verifyMagic {
		if allZero(u) {
			return ErrVerifyUnwritten
		}
		return ErrVerifyCorrupt
	}
	if binary.LittleEndian.Uint32(u[4:8]) != unitCRC(u) {
		return ErrVerifyCorrupt
	}
	if binary.LittleEndian.Uint64(u[8:16]) != dev || binary.LittleEndian.Uint64(u[16:24]) != lba {
		return ErrVerifyMisplaced
	}
	if binary.LittleEndian.Uint64(u[24:32]) < minGen {
		return ErrVerifyStale
	}
	return nil
}

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// VerifyCounts counts the outcome of every unit a verify read checked.
type VerifyCounts struct {
	Checked   int64 `json:"checked"`
	OK        int64 `json:"ok"`
	Corrupt   int64 `json:"corrupt"`
	Misplaced int64 `json:"misplaced"`
	Stale     int64 `json:"stale"`
	Unwritten int64 `json:"unwritten"`
}

// Bad is the number of units that failed verification. Unwritten units count
// only when allowUnwritten is false.
func (v VerifyCounts) Bad(allowUnwritten bool) int64 {
	n := v.Corrupt + v.Misplaced + v.Stale
	if !allowUnwritten {
		n += v.Unwritten
	}
	return n
}

func (v *VerifyCounts) add(o VerifyCounts) {
	v.Checked += o.Checked
	v.OK += o.OK
	v.Corrupt += o.Corrupt
	v.Misplaced += o.Misplaced
	v.Stale += o.Stale
	v.Unwritten += o.Unwritten
}
