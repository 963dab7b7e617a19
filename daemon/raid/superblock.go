package raid

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"tier0/daemon/blockdev"
)

const (
	sbMagic      = "T0RAIDSB"
	sbVersion    = 1
	sbSlotSize   = 4096
	metaBlock    = 4096 // metadata I/O unit
	maxMembers   = 64
	bitmapOffset = 2 * sbSlotSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Member states in the superblock's role table.
const (
	roleEmpty      uint8 = 0
	roleActive     uint8 = 1
	roleFailed     uint8 = 2
	roleRebuilding uint8 = 3
	// roleDown: failed when or after the array failed, so no write was
	// acknowledged after it left; Recovery holds the event counter of its
	// last superblock. Assemble takes it back as active when its own
	// superblock is that recent.
	roleDown uint8 = 4
	// roleMissing: it left because it could not be reached, not because
	// its device failed; every write since is in the write-intent bitmap
	// (never cleared while degraded). Assemble takes it back under a
	// resync of the bitmap's regions (a full rebuild when RoleFull is
	// set: it was under one when it left).
	roleMissing uint8 = 5
)

// Superblock flags.
const (
	flagClean       uint32 = 1 << 0
	flagLogDisabled uint32 = 1 << 1
)

// superblock is the on-member metadata header (little-endian, fixed size).
type superblock struct {
	Magic         [8]byte
	Version       uint32
	Flags         uint32
	ArrayUUID     [16]byte
	Level         uint32
	Members       uint32
	Role          uint32
	BlockSize     uint32
	ChunkSize     uint64
	DataOffset    uint64
	Stripes       uint64
	Events        uint64
	Epoch         uint64
	BitmapBytes   uint64
	RegionStripes uint64
	EventsCleared uint64
	LogOffset     uint64
	LogSlots      uint32
	LogSlotSize   uint32
	LogTail       uint64
	LogSeq        uint64 // next log sequence number at the time of writing
	RoleState     [maxMembers]uint8
	RoleFull      [maxMembers]uint8 // rebuilding role needs a full rebuild
	Recovery      [maxMembers]uint64
	CRC           uint32
}

func (sb *superblock) marshal() []byte {
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, sb); err != nil {
		panic(err)
	}
	b := buf.Bytes()
	crc := crc32.Checksum(b[:len(b)-4], castagnoli)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc)
	out := make([]byte, sbSlotSize)
	copy(out, b)
	return out
}

func unmarshalSB(p []byte) (*superblock, error) {
	sb := new(superblock)
	n := binary.Size(sb)
	if len(p) < n || string(p[:8]) != sbMagic {
		return nil, ErrNoSuperblock
	}
	if crc32.Checksum(p[:n-4], castagnoli) != binary.LittleEndian.Uint32(p[n-4:n]) {
		return nil, fmt.Errorf("superblock checksum mismatch: %w", ErrNoSuperblock)
	}
	if err := binary.Read(bytes.NewReader(p[:n]), binary.LittleEndian, sb); err != nil {
		return nil, err
	}
	if sb.Version != sbVersion {
		return nil, fmt.Errorf("superblock version %d, this build reads %d: %w", sb.Version, sbVersion, ErrNoSuperblock)
	}
	if sb.Members < 1 || sb.Members > maxMembers || sb.Role >= sb.Members || sb.ChunkSize < metaBlock ||
		sb.ChunkSize&(sb.ChunkSize-1) != 0 || sb.BlockSize < 512 || sb.BlockSize > metaBlock ||
		sb.RegionStripes < 1 || sb.DataOffset%sb.ChunkSize != 0 {
		return nil, fmt.Errorf("superblock fields out of range (members %d, role %d, chunk %d, block %d): %w", sb.Members, sb.Role, sb.ChunkSize, sb.BlockSize, ErrNoSuperblock)
	}
	switch Level(sb.Level) {
	case RAID0, RAID1, RAID5, RAID6:
	default:
		return nil, fmt.Errorf("superblock level %d unknown: %w", sb.Level, ErrNoSuperblock)
	}
	if why := sb.checkLayout(); why != "" {
		return nil, fmt.Errorf("superblock metadata layout out of range: %s: %w", why, ErrNoSuperblock)
	}
	return sb, nil
}

// maxStripes bounds a superblock's stripe count so that member offsets
// fit an int64 (the device size check in Assemble bounds it further).
const maxStripes = 1 << 40

// checkLayout validates the metadata layout against the geometry before
// anything is allocated from it (the bitmap is BitmapBytes long, the
// in-memory region table has one entry per region): the bitmap must be
// exactly what the stripe count needs, rounded to metadata blocks (with
// the slack layout leaves), and bitmap, log and data area must follow
// each other.
func (sb *superblock) checkLayout() string {
	if sb.Stripes < 1 || sb.Stripes > maxStripes {
		return fmt.Sprintf("%d stripes, want 1 to %d", sb.Stripes, uint64(maxStripes))
	}
	if sb.DataOffset > 1<<50 {
		return fmt.Sprintf("data offset %d is beyond any device", sb.DataOffset)
	}
	bytesFor := func(stripes uint64) uint64 {
		regions := (stripes + sb.RegionStripes - 1) / sb.RegionStripes
		return uint64(roundUp(int64((regions+7)/8), metaBlock))
	}
	// layout sizes the bitmap for a stripe count between the final one
	// and what the whole member would hold (< DataOffset/chunk + Stripes + 1).
	need, most := bytesFor(sb.Stripes), bytesFor(sb.DataOffset/sb.ChunkSize+sb.Stripes+1)
	if sb.BitmapBytes < need || sb.BitmapBytes > most || sb.BitmapBytes%metaBlock != 0 {
		return fmt.Sprintf("bitmap of %d bytes: %d stripes in regions of %d stripes need %d to %d bytes, a multiple of %d",
			sb.BitmapBytes, sb.Stripes, sb.RegionStripes, need, most, metaBlock)
	}
	if sb.LogOffset != bitmapOffset+sb.BitmapBytes {
		return fmt.Sprintf("log at %d, want right after the %d-byte bitmap at %d", sb.LogOffset, sb.BitmapBytes, bitmapOffset+sb.BitmapBytes)
	}
	if sb.LogOffset+uint64(sb.LogSlots)*uint64(sb.LogSlotSize) > sb.DataOffset {
		return fmt.Sprintf("log of %d slots of %d bytes at %d overlaps the data area at %d", sb.LogSlots, sb.LogSlotSize, sb.LogOffset, sb.DataOffset)
	}
	return ""
}

// readSB returns the newer valid copy of a member's two superblock slots.
func readSB(dev blockdev.Device) (*superblock, error) {
	sb, _, err := readSBInc(dev)
	return sb, err
}

// readSBInc is readSB with the member incarnation recorded in that copy's
// slot (0 when none; incarnation.go).
func readSBInc(dev blockdev.Device) (*superblock, uint64, error) {
	buf := blockdev.AlignedBuffer(2 * sbSlotSize)
	if _, err := dev.ReadAt(buf, 0); err != nil {
		return nil, 0, fmt.Errorf("reading superblock: %w", err)
	}
	var best *superblock
	var inc uint64
	var firstErr error
	for i := 0; i < 2; i++ {
		slot := buf[i*sbSlotSize : (i+1)*sbSlotSize]
		sb, err := unmarshalSB(slot)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if best == nil || sb.Events > best.Events {
			best, inc = sb, slotIncarnation(slot)
		}
	}
	if best == nil {
		return nil, 0, firstErr
	}
	return best, inc, nil
}

// writeSB writes sb into the slot chosen by its event counter, durably,
// with the member's incarnation (incarnation.go).
func writeSB(dev blockdev.Device, sb *superblock) error {
	off := int64(sb.Events%2) * sbSlotSize
	b := sb.marshal()
	putIncarnation(b, incarnationOf(dev))
	return writeDurable(dev, b, off)
}

// writeDurable writes p at off and makes it durable (FUA when the device
// has it, else write + flush).
func writeDurable(dev blockdev.Device, p []byte, off int64) error {
	if f, ok := dev.(blockdev.FUAWriter); ok {
		_, err := f.WriteAtFUA(p, off)
		return err
	}
	if _, err := dev.WriteAt(p, off); err != nil {
		return err
	}
	return dev.Flush()
}

// layout computes the metadata layout and geometry for members of size
// minSize. regionBytes is the bitmap granularity.
func layout(level Level, n int, chunk int64, bs int, minSize int64, regionBytes int64, logSlots int) (Geometry, *superblock, error) {
	g := Geometry{Level: level, Members: n, ChunkSize: chunk, BlockSize: bs}
	switch level {
	case RAID0:
		g.DataDisks, g.ParityDisks = n, 0
	case RAID1:
		g.DataDisks, g.ParityDisks = 1, n-1
	case RAID5:
		g.DataDisks, g.ParityDisks = n-1, 1
	case RAID6:
		g.DataDisks, g.ParityDisks = n-2, 2
	}
	np := 0
	if level == RAID5 || level == RAID6 {
		np = g.ParityDisks
	}
	slotSize := int64(0)
	if np > 0 {
		// header + one partial parity + the new data of up to np
		// missing data chunks.
		slotSize = metaBlock + int64(1+np)*chunk
	}
	regionStripes := regionBytes / chunk
	if regionStripes < 1 {
		regionStripes = 1
	}
	// Iterate: the bitmap size depends on the stripe count, which depends
	// on the data offset.
	stripes := minSize / chunk
	var dataOff, bmBytes, logOff int64
	for i := 0; i < 4; i++ {
		regions := (stripes + regionStripes - 1) / regionStripes
		bmBytes = roundUp((regions+7)/8, metaBlock)
		logOff = bitmapOffset + bmBytes
		dataOff = roundUp(logOff+int64(logSlots)*slotSize, chunk)
		if minSize <= dataOff {
			return g, nil, fmt.Errorf("member size %d bytes leaves no data area after %d bytes of metadata (chunk %d, %d log slots); use larger members: %w", minSize, dataOff, chunk, logSlots, ErrInvalidConfig)
		}
		stripes = (minSize - dataOff) / chunk
	}
	if stripes < 1 {
		return g, nil, fmt.Errorf("member size %d bytes too small for one chunk of %d: %w", minSize, chunk, ErrInvalidConfig)
	}
	g.Stripes = stripes
	g.DataOffset = dataOff
	g.StripeSize = int64(g.DataDisks) * chunk
	g.Capacity = g.StripeSize * stripes
	sb := &superblock{
		Version:       sbVersion,
		Level:         uint32(level),
		Members:       uint32(n),
		BlockSize:     uint32(bs),
		ChunkSize:     uint64(chunk),
		DataOffset:    uint64(dataOff),
		Stripes:       uint64(stripes),
		BitmapBytes:   uint64(bmBytes),
		RegionStripes: uint64(regionStripes),
		LogOffset:     uint64(logOff),
		LogSlots:      uint32(logSlots),
		LogSlotSize:   uint32(slotSize),
	}
	copy(sb.Magic[:], sbMagic)
	return g, sb, nil
}

func roundUp(x, m int64) int64 { return (x + m - 1) / m * m }

// geometryFromSB rebuilds the geometry stored in a superblock.
func geometryFromSB(sb *superblock) Geometry {
	g := Geometry{Level: Level(sb.Level), Members: int(sb.Members), ChunkSize: int64(sb.ChunkSize),
		BlockSize: int(sb.BlockSize), DataOffset: int64(sb.DataOffset), Stripes: int64(sb.Stripes)}
	switch g.Level {
	case RAID0:
		g.DataDisks = g.Members
	case RAID1:
		g.DataDisks, g.ParityDisks = 1, g.Members-1
	case RAID5:
		g.DataDisks, g.ParityDisks = g.Members-1, 1
	case RAID6:
		g.DataDisks, g.ParityDisks = g.Members-2, 2
	}
	g.StripeSize = int64(g.DataDisks) * g.ChunkSize
	g.Capacity = g.StripeSize * g.Stripes
	return g
}

// sameGeometry reports why b's geometry differs from a's, or "".
func sameGeometry(a, b *superblock) string {
	switch {
	case a.Level != b.Level:
		return fmt.Sprintf("level raid%d, array is raid%d", b.Level, a.Level)
	case a.Members != b.Members:
		return fmt.Sprintf("%d members, array has %d", b.Members, a.Members)
	case a.ChunkSize != b.ChunkSize:
		return fmt.Sprintf("chunk %d, array uses %d", b.ChunkSize, a.ChunkSize)
	case a.DataOffset != b.DataOffset || a.Stripes != b.Stripes:
		return fmt.Sprintf("data area %d+%d chunks, array uses %d+%d", b.DataOffset, b.Stripes, a.DataOffset, a.Stripes)
	case a.BlockSize != b.BlockSize:
		return fmt.Sprintf("block size %d, array uses %d", b.BlockSize, a.BlockSize)
	case a.LogOffset != b.LogOffset || a.LogSlots != b.LogSlots || a.BitmapBytes != b.BitmapBytes:
		return "metadata layout differs"
	}
	return ""
}
