package nvme

import (
	"encoding/binary"
	"fmt"
)

// SQELen and CQELen are the sizes of a submission and a completion queue
// entry.
const (
	SQELen = 64
	CQELen = 16
)

// Admin command opcodes.
const (
	AdminDeleteSQ      uint8 = 0x00
	AdminCreateSQ      uint8 = 0x01
	AdminGetLogPage    uint8 = 0x02
	AdminDeleteCQ      uint8 = 0x04
	AdminCreateCQ      uint8 = 0x05
	AdminIdentify      uint8 = 0x06
	AdminAbort         uint8 = 0x08
	AdminSetFeatures   uint8 = 0x09
	AdminGetFeatures   uint8 = 0x0A
	AdminAsyncEvent    uint8 = 0x0C
	AdminNSMgmt        uint8 = 0x0D
	AdminFWCommit      uint8 = 0x10
	AdminFWDownload    uint8 = 0x11
	AdminNSAttach      uint8 = 0x15
	AdminKeepAlive     uint8 = 0x18
	AdminDirectiveSend uint8 = 0x19
	AdminDirectiveRecv uint8 = 0x1A
	AdminFabrics       uint8 = 0x7F // fabrics commands, on admin and I/O queues
	AdminFormatNVM     uint8 = 0x80
	AdminSecuritySend  uint8 = 0x81
	AdminSecurityRecv  uint8 = 0x82
	AdminSanitize      uint8 = 0x84
)

// NVM command set (I/O) opcodes.
const (
	CmdFlush           uint8  = 0x00
	CmdWrite           uint8  = 0x01
	CmdRead            uint8  = 0x02
	CmdWriteUncor      uint8  = 0x04
	CmdCompare         uint8  = 0x05
	CmdWriteZeroes     uint8  = 0x08
	CmdDSM             uint8  = 0x09
	CmdVerify          uint8  = 0x0C
	CmdResvRegister    uint8  = 0x0D
	CmdResvReport      uint8  = 0x0E
	CmdResvAcquire     uint8  = 0x11
	CmdResvRelease     uint8  = 0x15
	CmdFabrics         uint8  = 0x7F
	CmdWriteFUABit     uint32 = 1 << 30 // Read/Write cdw12 FUA
	CmdWriteZeroesDeac uint32 = 1 << 25 // Write Zeroes cdw12 DEAC
)

// Fabrics command types (SQE byte 4 when the opcode is 0x7F).
const (
	FabricsPropertySet uint8 = 0x00
	FabricsConnect     uint8 = 0x01
	FabricsPropertyGet uint8 = 0x04
	FabricsAuthSend    uint8 = 0x05
	FabricsAuthRecv    uint8 = 0x06
	FabricsDisconnect  uint8 = 0x08
)

// SQE flag bits (byte 1).
const (
	SQEFlagFusedMask uint8 = 0x03
	SQEFlagPSDTMask  uint8 = 0xC0
	// SQEFlagSGLMeta is PSDT 01b: SGLs for data, metadata in one buffer.
	// Fabrics require SGLs; the Linux host sets this on every command.
	SQEFlagSGLMeta uint8 = 0x40
)

// SGL descriptor type bytes as NVMe/TCP uses them.
const (
	// SGLTypeInCapsule is a Data Block descriptor with the Offset subtype:
	// the data is in the capsule, at Addr bytes from its start.
	SGLTypeInCapsule uint8 = 0x01
	// SGLTypeTransport is a Transport SGL Data Block descriptor (type 5,
	// subtype A): data moves by R2T/H2CData or C2HData. Length 0 with this
	// type is the null descriptor of a command without data.
	SGLTypeTransport uint8 = 0x5A
)

// SGL is a 16-byte SGL data descriptor (the SQE's DPTR).
type SGL struct {
	Addr   uint64
	Length uint32
	Type   uint8 // SGLTypeInCapsule or SGLTypeTransport
}

// SQE is a 64-byte submission queue entry. Fabrics commands keep their
// command type in FCType (byte 4, which overlaps the low byte of NSID):
// for opcode 0x7F, NSID is not meaningful and FCType is what is encoded.
type SQE struct {
	Opcode uint8
	Flags  uint8
	CID    uint16
	NSID   uint32
	CDW2   uint32
	CDW3   uint32
	MPTR   uint64
	DPTR   SGL
	CDW10  uint32
	CDW11  uint32
	CDW12  uint32
	CDW13  uint32
	CDW14  uint32
	CDW15  uint32
}

// FCType returns the fabrics command type (byte 4).
func (s *SQE) FCType() uint8 { return uint8(s.NSID) }

// Append appends the 64-byte encoding of s to b.
func (s *SQE) Append(b []byte) []byte {
	b = append(b, s.Opcode, s.Flags)
	b = binary.LittleEndian.AppendUint16(b, s.CID)
	b = binary.LittleEndian.AppendUint32(b, s.NSID)
	b = binary.LittleEndian.AppendUint32(b, s.CDW2)
	b = binary.LittleEndian.AppendUint32(b, s.CDW3)
	b = binary.LittleEndian.AppendUint64(b, s.MPTR)
	b = binary.LittleEndian.AppendUint64(b, s.DPTR.Addr)
	b = binary.LittleEndian.AppendUint32(b, s.DPTR.Length)
	b = append(b, 0, 0, 0, s.DPTR.Type)
	for _, v := range [...]uint32{s.CDW10, s.CDW11, s.CDW12, s.CDW13, s.CDW14, s.CDW15} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// ParseSQE decodes a 64-byte SQE from the start of b.
func ParseSQE(b []byte) (SQE, error) {
	if len(b) < SQELen {
		return SQE{}, fmt.Errorf("SQE: have %d bytes, need %d: %w", len(b), SQELen, ErrShort)
	}
	le := binary.LittleEndian
	return SQE{
		Opcode: b[0], Flags: b[1], CID: le.Uint16(b[2:]), NSID: le.Uint32(b[4:]),
		CDW2: le.Uint32(b[8:]), CDW3: le.Uint32(b[12:]), MPTR: le.Uint64(b[16:]),
		DPTR:  SGL{Addr: le.Uint64(b[24:]), Length: le.Uint32(b[32:]), Type: b[39]},
		CDW10: le.Uint32(b[40:]), CDW11: le.Uint32(b[44:]), CDW12: le.Uint32(b[48:]),
		CDW13: le.Uint32(b[52:]), CDW14: le.Uint32(b[56:]), CDW15: le.Uint32(b[60:]),
	}, nil
}

// SLBA returns the starting LBA of a Read/Write/Write Zeroes/Compare
// command (cdw10-11).
func (s *SQE) SLBA() uint64 { return uint64(s.CDW10) | uint64(s.CDW11)<<32 }

// NLB returns the number of logical blocks of a Read/Write/Write Zeroes
// command (cdw12 bits 15:0 are 0's based; this returns the real count).
func (s *SQE) NLB() uint32 { return s.CDW12&0xFFFF + 1 }

// SetRW fills the SLBA and NLB fields (nlb is the real count, >= 1).
func (s *SQE) SetRW(slba uint64, nlb uint32) {
	s.CDW10, s.CDW11 = uint32(slba), uint32(slba>>32)
	s.CDW12 = s.CDW12&^0xFFFF | (nlb-1)&0xFFFF
}

// CQE is a 16-byte completion queue entry. Status holds the 15-bit status
// field (without the phase bit, which NVMe/TCP does not use).
type CQE struct {
	Result uint64 // DW0 (low 32 bits) and DW1
	SQHead uint16
	SQID   uint16
	CID    uint16
	Status Status
}

// DW0 returns the command-specific result dword 0.
func (c CQE) DW0() uint32 { return uint32(c.Result) }

// Append appends the 16-byte encoding of c to b.
func (c *CQE) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, c.Result)
	b = binary.LittleEndian.AppendUint16(b, c.SQHead)
	b = binary.LittleEndian.AppendUint16(b, c.SQID)
	b = binary.LittleEndian.AppendUint16(b, c.CID)
	return binary.LittleEndian.AppendUint16(b, uint16(c.Status)<<1)
}

// ParseCQE decodes a 16-byte CQE from the start of b.
func ParseCQE(b []byte) (CQE, error) {
	if len(b) < CQELen {
		return CQE{}, fmt.Errorf("CQE: have %d bytes, need %d: %w", len(b), CQELen, ErrShort)
	}
	le := binary.LittleEndian
	return CQE{Result: le.Uint64(b), SQHead: le.Uint16(b[8:]), SQID: le.Uint16(b[10:]), CID: le.Uint16(b[12:]),
		Status: Status(le.Uint16(b[14:]) >> 1)}, nil
}

// ConnectCmd holds the SQE fields of a Fabrics Connect command.
type ConnectCmd struct {
	RecFmt uint16 // record format, 0
	QID    uint16 // 0 admin queue, >0 I/O queue
	SQSize uint16 // submission queue size, 0's based
	CAttr  uint8  // connect attributes (bit 2: SQ flow control disable)
	KATO   uint32 // keep-alive timeout in milliseconds (admin queue)
}

// SQE returns the Connect command as an SQE with a transport SGL for its
// 1024-byte data.
func (c ConnectCmd) SQE(cid uint16) SQE {
	return SQE{Opcode: AdminFabrics, Flags: SQEFlagSGLMeta, CID: cid, NSID: uint32(FabricsConnect),
		DPTR:  SGL{Length: ConnectDataLen, Type: SGLTypeInCapsule},
		CDW10: uint32(c.RecFmt) | uint32(c.QID)<<16, CDW11: uint32(c.SQSize) | uint32(c.CAttr)<<16, CDW12: c.KATO}
}

// ParseConnectCmd extracts the Connect fields of s.
func ParseConnectCmd(s *SQE) ConnectCmd {
	return ConnectCmd{RecFmt: uint16(s.CDW10), QID: uint16(s.CDW10 >> 16), SQSize: uint16(s.CDW11),
		CAttr: uint8(s.CDW11 >> 16), KATO: s.CDW12}
}

// ConnectDataLen is the size of the Connect command's data.
const ConnectDataLen = 1024

// NQNLen is the size of an NQN field; NQNs are at most 223 bytes.
const (
	NQNLen    = 256
	MaxNQNLen = 223
)

// DiscoveryNQN is the well-known NQN of the discovery subsystem.
const DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"

// CntlIDDynamic in Connect data asks the subsystem to allocate a
// controller ID (dynamic controller model).
const CntlIDDynamic uint16 = 0xFFFF

// ConnectData is the 1024-byte data of a Fabrics Connect command.
type ConnectData struct {
	HostID  [16]byte // host identifier (a UUID on Linux)
	CntlID  uint16   // 0xFFFF on the admin queue; the assigned ID on I/O queues
	SubNQN  string
	HostNQN string
}

// Append appends the 1024-byte encoding of d to b.
func (d *ConnectData) Append(b []byte) []byte {
	start := len(b)
	b = append(b, make([]byte, ConnectDataLen)...)
	out := b[start:]
	copy(out[0:16], d.HostID[:])
	binary.LittleEndian.PutUint16(out[16:], d.CntlID)
	copy(out[256:256+NQNLen-1], d.SubNQN)
	copy(out[512:512+NQNLen-1], d.HostNQN)
	return b
}

// ParseConnectData decodes Connect data. NQNs must be NUL-terminated
// within their 256-byte fields.
func ParseConnectData(b []byte) (ConnectData, error) {
	if len(b) < ConnectDataLen {
		return ConnectData{}, fmt.Errorf("connect data: have %d bytes, need %d: %w", len(b), ConnectDataLen, ErrShort)
	}
	var d ConnectData
	copy(d.HostID[:], b[0:16])
	d.CntlID = binary.LittleEndian.Uint16(b[16:])
	var ok bool
	if d.SubNQN, ok = cString(b[256:512]); !ok {
		return d, fmt.Errorf("connect data: subsystem NQN is not NUL-terminated: %w", ErrMalformed)
	}
	if d.HostNQN, ok = cString(b[512:768]); !ok {
		return d, fmt.Errorf("connect data: host NQN is not NUL-terminated: %w", ErrMalformed)
	}
	return d, nil
}

// cString returns the NUL-terminated string at the start of b, and whether
// a NUL was found.
func cString(b []byte) (string, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), true
		}
	}
	return string(b), false
}

// paddedString returns b with trailing NULs and spaces removed (for
// fixed-width ASCII fields such as SN, MN, TRADDR).
func paddedString(b []byte) string {
	n := len(b)
	for n > 0 && (b[n-1] == 0 || b[n-1] == ' ') {
		n--
	}
	for i := 0; i < n; i++ {
		if b[i] == 0 {
			n = i
		}
	}
	return string(b[:n])
}

// putSpacePadded copies s into b and fills the rest with spaces.
func putSpacePadded(b []byte, s string) {
	n := copy(b, s)
	for i := n; i < len(b); i++ {
		b[i] = ' '
	}
}

// Controller properties (Property Get/Set offsets).
const (
	PropCAP   uint32 = 0x00 // 8 bytes
	PropVS    uint32 = 0x08
	PropINTMS uint32 = 0x0C
	PropINTMC uint32 = 0x10
	PropCC    uint32 = 0x14
	PropCSTS  uint32 = 0x1C
	PropNSSR  uint32 = 0x20
	PropAQA   uint32 = 0x24
	PropASQ   uint32 = 0x28 // 8 bytes
	PropACQ   uint32 = 0x30 // 8 bytes
)

// CC and CSTS bits.
const (
	CCEnable         uint32 = 1 << 0
	CCShutdownMask   uint32 = 3 << 14
	CSTSReady        uint32 = 1 << 0
	CSTSFatal        uint32 = 1 << 1
	CSTSShutdownDone uint32 = 2 << 2
)

// CCIOSQES and CCIOCQES extract the queue entry sizes (log2) from CC.
func CCIOSQES(cc uint32) uint32 { return cc >> 16 & 0xF }
func CCIOCQES(cc uint32) uint32 { return cc >> 20 & 0xF }

// PropertyCmd holds a Property Get or Set command's fields.
type PropertyCmd struct {
	Size8  bool   // attrib bit 0: 8-byte property
	Offset uint32 // property offset
	Value  uint64 // Set only
}

// SQE encodes p as a Property Get (set=false) or Set command.
func (p PropertyCmd) SQE(cid uint16, set bool) SQE {
	s := SQE{Opcode: AdminFabrics, Flags: SQEFlagSGLMeta, CID: cid, NSID: uint32(FabricsPropertyGet), CDW11: p.Offset,
		DPTR: SGL{Type: SGLTypeTransport}}
	if set {
		s.NSID = uint32(FabricsPropertySet)
		s.CDW12, s.CDW13 = uint32(p.Value), uint32(p.Value>>32)
	}
	if p.Size8 {
		s.CDW10 = 1
	}
	return s
}

// ParsePropertyCmd extracts Property Get/Set fields from s.
func ParsePropertyCmd(s *SQE) PropertyCmd {
	return PropertyCmd{Size8: s.CDW10&1 != 0, Offset: s.CDW11, Value: uint64(s.CDW12) | uint64(s.CDW13)<<32}
}

// IdentifyCmd holds an Identify command's fields.
type IdentifyCmd struct {
	CNS    uint8
	CntID  uint16
	CSI    uint8
	NSID   uint32
	CNSSub uint16 // cdw11 bits 15:0 (CNS specific identifier)
}

// Identify CNS values.
const (
	CNSNamespace      uint8 = 0x00
	CNSController     uint8 = 0x01
	CNSActiveNSList   uint8 = 0x02
	CNSNSDescList     uint8 = 0x03
	CNSCSNamespace    uint8 = 0x05 // I/O command set specific namespace
	CNSCSController   uint8 = 0x06 // I/O command set specific controller
	CNSCSActiveNSList uint8 = 0x07
	CNSCSIndepNS      uint8 = 0x08 // I/O command set independent namespace
)

// IdentifyLen is the size of every Identify data structure.
const IdentifyLen = 4096

// SQE encodes c as an Identify command with a transport SGL for 4096 bytes.
func (c IdentifyCmd) SQE(cid uint16) SQE {
	return SQE{Opcode: AdminIdentify, Flags: SQEFlagSGLMeta, CID: cid, NSID: c.NSID,
		DPTR:  SGL{Length: IdentifyLen, Type: SGLTypeTransport},
		CDW10: uint32(c.CNS) | uint32(c.CntID)<<16, CDW11: uint32(c.CNSSub) | uint32(c.CSI)<<24}
}

// ParseIdentifyCmd extracts the Identify fields of s.
func ParseIdentifyCmd(s *SQE) IdentifyCmd {
	return IdentifyCmd{CNS: uint8(s.CDW10), CntID: uint16(s.CDW10 >> 16), CSI: uint8(s.CDW11 >> 24), NSID: s.NSID, CNSSub: uint16(s.CDW11)}
}

// Log page identifiers.
const (
	LogSupportedPages    uint8 = 0x00
	LogError             uint8 = 0x01
	LogSMART             uint8 = 0x02
	LogFWSlot            uint8 = 0x03
	LogChangedNSList     uint8 = 0x04
	LogCmdEffects        uint8 = 0x05
	LogANA               uint8 = 0x0C
	LogDiscovery         uint8 = 0x70
	LogResvNotification  uint8 = 0x80
	LogANALSPGroupsOnly  uint8 = 0x01 // LSP bit 0 of the ANA log: RGO
	LogDiscoveryLSPAllSS uint8 = 0x02 // discovery LSP bit 1 (ignored by tier0)
)

// GetLogPageCmd holds a Get Log Page command's fields.
type GetLogPageCmd struct {
	LID    uint8
	LSP    uint8
	RAE    bool   // retain asynchronous event
	Len    uint32 // bytes requested (a multiple of 4; NUMD+1 dwords)
	LSI    uint16
	Offset uint64 // byte offset into the log page
	NSID   uint32
}

// SQE encodes c as a Get Log Page command with a transport SGL of Len bytes.
func (c GetLogPageCmd) SQE(cid uint16) SQE {
	numd := c.Len/4 - 1
	cdw10 := uint32(c.LID) | uint32(c.LSP&0x7F)<<8 | (numd&0xFFFF)<<16
	if c.RAE {
		cdw10 |= 1 << 15
	}
	return SQE{Opcode: AdminGetLogPage, Flags: SQEFlagSGLMeta, CID: cid, NSID: c.NSID,
		DPTR:  SGL{Length: c.Len, Type: SGLTypeTransport},
		CDW10: cdw10, CDW11: numd>>16 | uint32(c.LSI)<<16, CDW12: uint32(c.Offset), CDW13: uint32(c.Offset >> 32)}
}

// ParseGetLogPageCmd extracts the Get Log Page fields of s. Len is
// computed from NUMDL/NUMDU and can be up to 16 GiB; check it.
func ParseGetLogPageCmd(s *SQE) GetLogPageCmd {
	numd := uint64(s.CDW10>>16) | uint64(s.CDW11&0xFFFF)<<16
	n := (numd + 1) * 4
	if n > 1<<32-4 {
		n = 1<<32 - 4
	}
	return GetLogPageCmd{LID: uint8(s.CDW10), LSP: uint8(s.CDW10>>8) & 0x7F, RAE: s.CDW10&(1<<15) != 0,
		Len: uint32(n), LSI: uint16(s.CDW11 >> 16), Offset: uint64(s.CDW12) | uint64(s.CDW13)<<32, NSID: s.NSID}
}

// Feature identifiers (Get/Set Features cdw10 bits 7:0).
const (
	FeatArbitration     uint8 = 0x01
	FeatPowerMgmt       uint8 = 0x02
	FeatTempThreshold   uint8 = 0x04
	FeatErrorRecovery   uint8 = 0x05
	FeatVolatileWC      uint8 = 0x06
	FeatNumQueues       uint8 = 0x07
	FeatIRQCoalesce     uint8 = 0x08
	FeatWriteAtomicity  uint8 = 0x0A
	FeatAsyncEventCfg   uint8 = 0x0B
	FeatKeepAlive       uint8 = 0x0F
	FeatHostID          uint8 = 0x81
	FeatResvNotifMask   uint8 = 0x82
	FeatResvPersistence uint8 = 0x83
)

// Asynchronous event types, notice information and OAES / Asynchronous
// Event Configuration bits.
const (
	AENTypeError     uint8 = 0x0
	AENTypeSMART     uint8 = 0x1
	AENTypeNotice    uint8 = 0x2
	AENTypeIOCmdSpec uint8 = 0x6

	AENNoticeNSChanged    uint8 = 0x00
	AENNoticeANAChange    uint8 = 0x03
	AENNoticeDiscoChanged uint8 = 0xF0
	AENIOResvLogAvailable uint8 = 0x00

	OAESNSAttr       uint32 = 1 << 8
	OAESANAChange    uint32 = 1 << 11
	OAESDiscoChanged uint32 = 1 << 31
)

// AENResult returns the CQE dword 0 of an Asynchronous Event Request
// completion: event type, event information and the log page to read.
func AENResult(typ, info, logPage uint8) uint32 {
	return uint32(typ) | uint32(info)<<8 | uint32(logPage)<<16
}

// Keep-alive: KAS (Identify Controller) is in units of 100 ms.
const KASUnitMillis = 100

// Dataset Management: cdw10 bits 7:0 hold the number of ranges (0's
// based); cdw11 bit 2 (AD) asks to deallocate them.
const (
	DSMRangeLen   = 16
	DSMDeallocate = 1 << 2
	DSMMaxRanges  = 256
)

// DSMRange is one Dataset Management range.
type DSMRange struct {
	CAttr uint32
	NLB   uint32 // logical blocks (a real count, not 0's based)
	SLBA  uint64
}

// Append appends the 16-byte range to b.
func (r DSMRange) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, r.CAttr)
	b = binary.LittleEndian.AppendUint32(b, r.NLB)
	return binary.LittleEndian.AppendUint64(b, r.SLBA)
}

// ParseDSMRanges decodes n ranges from b.
func ParseDSMRanges(b []byte, n int) ([]DSMRange, error) {
	if n < 0 || n > DSMMaxRanges {
		return nil, fmt.Errorf("DSM: %d ranges, at most %d allowed: %w", n, DSMMaxRanges, ErrMalformed)
	}
	if len(b) < n*DSMRangeLen {
		return nil, fmt.Errorf("DSM: %d ranges need %d bytes, have %d: %w", n, n*DSMRangeLen, len(b), ErrShort)
	}
	out := make([]DSMRange, n)
	for i := range out {
		p := b[i*DSMRangeLen:]
		out[i] = DSMRange{CAttr: binary.LittleEndian.Uint32(p), NLB: binary.LittleEndian.Uint32(p[4:]), SLBA: binary.LittleEndian.Uint64(p[8:])}
	}
	return out, nil
}
