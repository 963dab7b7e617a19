package nvme

import (
	"encoding/binary"
	"fmt"
)

// CMIC bits (Identify Controller byte 76).
const (
	CMICMultiPort uint8 = 1 << 0
	CMICMultiCtrl uint8 = 1 << 1
	CMICANA       uint8 = 1 << 3
)

// ANACAP bits (Identify Controller byte 343).
const (
	ANACAPOptimized      uint8 = 1 << 0
	ANACAPNonOptimized   uint8 = 1 << 1
	ANACAPInaccessible   uint8 = 1 << 2
	ANACAPPersistentLoss uint8 = 1 << 3
	ANACAPChange         uint8 = 1 << 4
	ANACAPGrpIDNotChange uint8 = 1 << 6 // ANAGRPID does not change while attached
	ANACAPGrpIDMgmt      uint8 = 1 << 7
)

// ONCS bits (optional NVM commands supported).
const (
	ONCSCompare      uint16 = 1 << 0
	ONCSWriteUncor   uint16 = 1 << 1
	ONCSDSM          uint16 = 1 << 2
	ONCSWriteZeroes  uint16 = 1 << 3
	ONCSSaveFeatures uint16 = 1 << 4
	ONCSReservations uint16 = 1 << 5
	// ONCSSaveSelect is ONCSSaveFeatures: the bit also says that Get
	// Features honours its Select field (current, default, saved,
	// supported capabilities).
	ONCSSaveSelect = ONCSSaveFeatures
)

// LPA bits (log page attributes).
const (
	LPASMARTPerNS  uint8 = 1 << 0
	LPACmdEffects  uint8 = 1 << 1 // commands supported and effects log
	LPAExtendedLog uint8 = 1 << 2 // NUMDU, offsets: extended Get Log Page data
)

// FeatNSWriteProtect is the Namespace Write Protection Config feature
// (0x84, namespace specific).
const FeatNSWriteProtect uint8 = 0x84

// Get Features Select values (cdw10 bits 10:8) and the supported
// capabilities bits returned in Dword 0 for FeatSelSupported.
const (
	FeatSelCurrent   uint8 = 0
	FeatSelDefault   uint8 = 1
	FeatSelSaved     uint8 = 2
	FeatSelSupported uint8 = 3

	FeatCapSaveable   uint32 = 1 << 0
	FeatCapNSSpecific uint32 = 1 << 1
	FeatCapChangeable uint32 = 1 << 2
)

// Controller types (CNTRLTYPE).
const (
	CtrlTypeIO        uint8 = 1
	CtrlTypeDiscovery uint8 = 2
	CtrlTypeAdmin     uint8 = 3
)

// IdentifyController holds the Identify Controller fields tier0 sets or
// reads; every other byte of the 4096-byte structure is zero.
type IdentifyController struct {
	VID, SSVID uint16
	SN         string // 20 bytes, space padded
	MN         string // 40 bytes
	FR         string // 8 bytes
	RAB        uint8
	IEEE       [3]byte
	CMIC       uint8
	MDTS       uint8 // max data transfer: 2^MDTS pages of 4 KiB, 0 = unlimited
	CntlID     uint16
	Ver        uint32
	OAES       uint32
	CTRATT     uint32
	CntrlType  uint8
	OACS       uint16
	ACL        uint8
	AERL       uint8
	FRMW       uint8
	LPA        uint8
	ELPE       uint8
	NPSS       uint8
	KAS        uint16 // keep-alive granularity, 100 ms units
	ANATT      uint8  // ANA transition time, seconds
	ANACAP     uint8
	ANAGRPMAX  uint32
	NANAGRPID  uint32
	// CQT is the Command Quiesce Time (bytes 386:387, NVMe 2.1, TP4129):
	// the worst-case time in milliseconds the controller needs, after a
	// keep-alive timeout or another loss of communication, until no
	// command of the lost association can run any more; 0: not reported.
	CQT        uint16
	SQES, CQES uint8
	MaxCmd     uint16
	NN         uint32
	ONCS       uint16
	FUSES      uint16
	FNA        uint8
	VWC        uint8
	AWUN       uint16
	AWUPF      uint16
	SGLS       uint32
	MNAN       uint32
	SubNQN     string
	IOCCSZ     uint32 // I/O queue command capsule size, 16-byte units
	IORCSZ     uint32 // I/O queue response capsule size, 16-byte units
	ICDOFF     uint16
	CtrAttr    uint8
	MSDBD      uint8
	// Incarnation is tier0's boot incarnation of the target's node, in
	// the vendor-specific area (IncarnationOff); 0: not reported (another
	// target, or an older tier0).
	Incarnation uint64
}

// The boot incarnation of a tier0 target's node, in Identify Controller's
// vendor-specific area (bytes 3072-4095): IncarnationMagic (8 bytes, its
// last byte the layout's version) at IncarnationOff, then the incarnation
// (little endian, never 0). A target that does not write the magic (the
// Linux nvmet target, SPDK, an older tier0: zeroes there) reports none.
// docs/FABRIC.md "Identify Controller: boot incarnation".
const (
	IncarnationOff   = 3072
	IncarnationMagic = "T0BOOT\x00\x01"
)

// Append appends the 4096-byte Identify Controller structure to b.
// InCapsuleData is the most write data an I/O queue command capsule may
// carry after its SQE (IOCCSZ x 16 - 64 bytes; 0 when IOCCSZ is the bare
// SQE or less).
func (c *IdentifyController) InCapsuleData() int {
	return max(0, int(c.IOCCSZ)*16-SQELen)
}

func (c *IdentifyController) Append(b []byte) []byte {
	start := len(b)
	b = append(b, make([]byte, IdentifyLen)...)
	o := b[start:]
	le := binary.LittleEndian
	le.PutUint16(o[0:], c.VID)
	le.PutUint16(o[2:], c.SSVID)
	putSpacePadded(o[4:24], c.SN)
	putSpacePadded(o[24:64], c.MN)
	putSpacePadded(o[64:72], c.FR)
	o[72] = c.RAB
	copy(o[73:76], c.IEEE[:])
	o[76] = c.CMIC
	o[77] = c.MDTS
	le.PutUint16(o[78:], c.CntlID)
	le.PutUint32(o[80:], c.Ver)
	le.PutUint32(o[92:], c.OAES)
	le.PutUint32(o[96:], c.CTRATT)
	o[111] = c.CntrlType
	le.PutUint16(o[256:], c.OACS)
	o[258], o[259], o[260], o[261], o[262], o[263] = c.ACL, c.AERL, c.FRMW, c.LPA, c.ELPE, c.NPSS
	le.PutUint16(o[320:], c.KAS)
	o[342], o[343] = c.ANATT, c.ANACAP
	le.PutUint32(o[344:], c.ANAGRPMAX)
	le.PutUint32(o[348:], c.NANAGRPID)
	le.PutUint16(o[386:], c.CQT)
	o[512], o[513] = c.SQES, c.CQES
	le.PutUint16(o[514:], c.MaxCmd)
	le.PutUint32(o[516:], c.NN)
	le.PutUint16(o[520:], c.ONCS)
	le.PutUint16(o[522:], c.FUSES)
	o[524], o[525] = c.FNA, c.VWC
	le.PutUint16(o[526:], c.AWUN)
	le.PutUint16(o[528:], c.AWUPF)
	le.PutUint32(o[536:], c.SGLS)
	le.PutUint32(o[540:], c.MNAN)
	copy(o[768:768+NQNLen-1], c.SubNQN)
	le.PutUint32(o[1792:], c.IOCCSZ)
	le.PutUint32(o[1796:], c.IORCSZ)
	le.PutUint16(o[1800:], c.ICDOFF)
	o[1802], o[1803] = c.CtrAttr, c.MSDBD
	if c.Incarnation != 0 {
		copy(o[IncarnationOff:], IncarnationMagic)
		le.PutUint64(o[IncarnationOff+len(IncarnationMagic):], c.Incarnation)
	}
	return b
}

// parseIncarnation reads the vendor-specific incarnation (0 when the
// magic is not there).
func parseIncarnation(o []byte) uint64 {
	v := o[IncarnationOff:]
	if string(v[:len(IncarnationMagic)]) != IncarnationMagic {
		return 0
	}
	return binary.LittleEndian.Uint64(v[len(IncarnationMagic):])
}

// ParseIdentifyController decodes a 4096-byte Identify Controller structure.
func ParseIdentifyController(o []byte) (IdentifyController, error) {
	if len(o) < IdentifyLen {
		return IdentifyController{}, fmt.Errorf("identify controller: have %d bytes, need %d: %w", len(o), IdentifyLen, ErrShort)
	}
	le := binary.LittleEndian
	c := IdentifyController{
		VID: le.Uint16(o[0:]), SSVID: le.Uint16(o[2:]),
		SN: paddedString(o[4:24]), MN: paddedString(o[24:64]), FR: paddedString(o[64:72]),
		RAB: o[72], CMIC: o[76], MDTS: o[77], CntlID: le.Uint16(o[78:]), Ver: le.Uint32(o[80:]),
		OAES: le.Uint32(o[92:]), CTRATT: le.Uint32(o[96:]), CntrlType: o[111], OACS: le.Uint16(o[256:]),
		ACL: o[258], AERL: o[259], FRMW: o[260], LPA: o[261], ELPE: o[262], NPSS: o[263],
		KAS: le.Uint16(o[320:]), ANATT: o[342], ANACAP: o[343], ANAGRPMAX: le.Uint32(o[344:]), NANAGRPID: le.Uint32(o[348:]),
		CQT: le.Uint16(o[386:]), SQES: o[512], CQES: o[513], MaxCmd: le.Uint16(o[514:]), NN: le.Uint32(o[516:]), ONCS: le.Uint16(o[520:]),
		FUSES: le.Uint16(o[522:]), FNA: o[524], VWC: o[525], AWUN: le.Uint16(o[526:]), AWUPF: le.Uint16(o[528:]),
		SGLS: le.Uint32(o[536:]), MNAN: le.Uint32(o[540:]),
		IOCCSZ: le.Uint32(o[1792:]), IORCSZ: le.Uint32(o[1796:]), ICDOFF: le.Uint16(o[1800:]), CtrAttr: o[1802], MSDBD: o[1803],
	}
	copy(c.IEEE[:], o[73:76])
	c.SubNQN, _ = cString(o[768 : 768+NQNLen])
	c.Incarnation = parseIncarnation(o)
	return c, nil
}

// NMIC bit 0: the namespace may be attached to several controllers.
const NMICShared uint8 = 1 << 0

// RESCAP bits (reservation capabilities).
const (
	RescapPTPL         uint8 = 1 << 0
	RescapWriteExcl    uint8 = 1 << 1
	RescapExclAccess   uint8 = 1 << 2
	RescapWriteExclRO  uint8 = 1 << 3
	RescapExclAccessRO uint8 = 1 << 4
	RescapWriteExclAR  uint8 = 1 << 5
	RescapExclAccessAR uint8 = 1 << 6
	RescapIEKey        uint8 = 1 << 7
)

// NSFEAT bit 0: NAWUN etc. are valid; bit 2 (DAE): deallocated error.
// DLFEAT 0x01 | 0x08: deallocated blocks read back as zeroes and Write
// Zeroes with DEAC deallocates.
const (
	DLFEATReadZeroes uint8 = 0x01
	DLFEATWZDeac     uint8 = 0x08
)

// LBAFormat is one LBA format descriptor.
type LBAFormat struct {
	MS    uint16 // metadata bytes per block
	LBADS uint8  // log2 of the data size
	RP    uint8  // relative performance
}

// IdentifyNamespace holds the Identify Namespace fields tier0 uses.
type IdentifyNamespace struct {
	NSZE, NCAP, NUSE uint64 // in logical blocks
	NSFEAT           uint8
	NLBAF            uint8 // number of LBA formats, 0's based
	FLBAS            uint8
	MC, DPC, DPS     uint8
	NMIC             uint8
	RESCAP           uint8
	FPI              uint8
	DLFEAT           uint8
	NAWUN, NAWUPF    uint16
	NOIOB            uint16
	NPWG, NPWA       uint16 // preferred write granularity / alignment, 0's based blocks
	NPDG, NPDA       uint16
	NOWS             uint16
	ANAGRPID         uint32
	NSAttr           uint8
	NGUID            [16]byte
	EUI64            [8]byte
	LBAF             []LBAFormat // NLBAF+1 entries (at most 64)
}

// BlockSize returns the data size of the formatted LBA format, or 0.
func (n *IdentifyNamespace) BlockSize() int {
	i := int(n.FLBAS&0xF) | int(n.FLBAS>>5&3)<<4
	if i >= len(n.LBAF) || n.LBAF[i].LBADS < 9 || n.LBAF[i].LBADS > 30 {
		return 0
	}
	return 1 << n.LBAF[i].LBADS
}

// Append appends the 4096-byte Identify Namespace structure to b.
func (n *IdentifyNamespace) Append(b []byte) []byte {
	start := len(b)
	b = append(b, make([]byte, IdentifyLen)...)
	o := b[start:]
	le := binary.LittleEndian
	le.PutUint64(o[0:], n.NSZE)
	le.PutUint64(o[8:], n.NCAP)
	le.PutUint64(o[16:], n.NUSE)
	o[24], o[25], o[26], o[27], o[28], o[29], o[30], o[31], o[32], o[33] =
		n.NSFEAT, n.NLBAF, n.FLBAS, n.MC, n.DPC, n.DPS, n.NMIC, n.RESCAP, n.FPI, n.DLFEAT
	le.PutUint16(o[34:], n.NAWUN)
	le.PutUint16(o[36:], n.NAWUPF)
	le.PutUint16(o[46:], n.NOIOB)
	le.PutUint16(o[64:], n.NPWG)
	le.PutUint16(o[66:], n.NPWA)
	le.PutUint16(o[68:], n.NPDG)
	le.PutUint16(o[70:], n.NPDA)
	le.PutUint16(o[72:], n.NOWS)
	le.PutUint32(o[92:], n.ANAGRPID)
	o[99] = n.NSAttr
	copy(o[104:120], n.NGUID[:])
	copy(o[120:128], n.EUI64[:])
	for i, f := range n.LBAF {
		if i == 64 {
			break
		}
		p := o[128+4*i:]
		le.PutUint16(p, f.MS)
		p[2], p[3] = f.LBADS, f.RP&3
	}
	return b
}

// ParseIdentifyNamespace decodes a 4096-byte Identify Namespace structure.
func ParseIdentifyNamespace(o []byte) (IdentifyNamespace, error) {
	if len(o) < IdentifyLen {
		return IdentifyNamespace{}, fmt.Errorf("identify namespace: have %d bytes, need %d: %w", len(o), IdentifyLen, ErrShort)
	}
	le := binary.LittleEndian
	n := IdentifyNamespace{
		NSZE: le.Uint64(o[0:]), NCAP: le.Uint64(o[8:]), NUSE: le.Uint64(o[16:]),
		NSFEAT: o[24], NLBAF: o[25], FLBAS: o[26], MC: o[27], DPC: o[28], DPS: o[29], NMIC: o[30], RESCAP: o[31], FPI: o[32], DLFEAT: o[33],
		NAWUN: le.Uint16(o[34:]), NAWUPF: le.Uint16(o[36:]), NOIOB: le.Uint16(o[46:]),
		NPWG: le.Uint16(o[64:]), NPWA: le.Uint16(o[66:]), NPDG: le.Uint16(o[68:]), NPDA: le.Uint16(o[70:]), NOWS: le.Uint16(o[72:]),
		ANAGRPID: le.Uint32(o[92:]), NSAttr: o[99],
	}
	copy(n.NGUID[:], o[104:120])
	copy(n.EUI64[:], o[120:128])
	cnt := int(n.NLBAF) + 1
	if cnt > 64 {
		return n, fmt.Errorf("identify namespace: nlbaf %d exceeds 63: %w", n.NLBAF, ErrMalformed)
	}
	n.LBAF = make([]LBAFormat, cnt)
	for i := range n.LBAF {
		p := o[128+4*i:]
		n.LBAF[i] = LBAFormat{MS: le.Uint16(p), LBADS: p[2], RP: p[3] & 3}
	}
	return n, nil
}

// AppendNSList appends a 4096-byte namespace ID list (Identify CNS 0x02)
// holding the IDs in ids that are greater than after, ascending as given,
// at most 1024 of them.
func AppendNSList(b []byte, ids []uint32, after uint32) []byte {
	start := len(b)
	b = append(b, make([]byte, IdentifyLen)...)
	n := 0
	for _, id := range ids {
		if id <= after || id == 0 {
			continue
		}
		if n == IdentifyLen/4 {
			break
		}
		binary.LittleEndian.PutUint32(b[start+4*n:], id)
		n++
	}
	return b
}

// ParseNSList decodes a namespace ID list up to its first zero entry.
func ParseNSList(b []byte) ([]uint32, error) {
	if len(b) < IdentifyLen {
		return nil, fmt.Errorf("namespace list: have %d bytes, need %d: %w", len(b), IdentifyLen, ErrShort)
	}
	var ids []uint32
	for i := 0; i < IdentifyLen; i += 4 {
		id := binary.LittleEndian.Uint32(b[i:])
		if id == 0 {
			break
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Namespace identification descriptor types (CNS 0x03).
const (
	NIDTEUI64 uint8 = 0x1 // 8 bytes
	NIDTNGUID uint8 = 0x2 // 16 bytes
	NIDTUUID  uint8 = 0x3 // 16 bytes
	NIDTCSI   uint8 = 0x4 // 1 byte
)

// CSINVM is the NVM command set identifier.
const CSINVM uint8 = 0

// NSDescriptor is one namespace identification descriptor.
type NSDescriptor struct {
	Type uint8
	ID   []byte
}

func nidLen(t uint8) int {
	switch t {
	case NIDTEUI64:
		return 8
	case NIDTNGUID, NIDTUUID:
		return 16
	case NIDTCSI:
		return 1
	}
	return -1
}

// AppendNSDescList appends a 4096-byte namespace identification descriptor
// list (Identify CNS 0x03). Descriptors whose ID length does not match the
// type are skipped.
func AppendNSDescList(b []byte, descs []NSDescriptor) []byte {
	start := len(b)
	b = append(b, make([]byte, IdentifyLen)...)
	o := b[start:]
	p := 0
	for _, d := range descs {
		if nidLen(d.Type) != len(d.ID) || p+4+len(d.ID) > IdentifyLen {
			continue
		}
		o[p], o[p+1] = d.Type, uint8(len(d.ID))
		copy(o[p+4:], d.ID)
		p += 4 + len(d.ID)
	}
	return b
}

// ParseNSDescList decodes a namespace identification descriptor list up to
// its terminating zero descriptor. ID slices alias b.
func ParseNSDescList(b []byte) ([]NSDescriptor, error) {
	var out []NSDescriptor
	for p := 0; p+4 <= len(b); {
		t, l := b[p], int(b[p+1])
		if t == 0 && l == 0 {
			return out, nil
		}
		if want := nidLen(t); want >= 0 && want != l {
			return out, fmt.Errorf("NS descriptor type %d: length %d, want %d: %w", t, l, want, ErrMalformed)
		}
		if l == 0 || p+4+l > len(b) {
			return out, fmt.Errorf("NS descriptor at byte %d: length %d does not fit: %w", p, l, ErrMalformed)
		}
		out = append(out, NSDescriptor{Type: t, ID: b[p+4 : p+4+l]})
		p += 4 + l
	}
	return out, nil
}
