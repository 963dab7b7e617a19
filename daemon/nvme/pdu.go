package nvme

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Sentinel errors returned (wrapped) by the decoders.
var (
	// ErrShort: the buffer is shorter than the structure being decoded.
	ErrShort = errors.New("nvme: buffer too short")
	// ErrMalformed: a field holds a value the specification does not allow
	// (wrong PDU type, header length, offsets that do not fit...).
	ErrMalformed = errors.New("nvme: malformed data")
)

// PDUType is the NVMe/TCP PDU type (common header byte 0).
type PDUType uint8

// NVMe/TCP PDU types.
const (
	PDUICReq       PDUType = 0x00
	PDUICResp      PDUType = 0x01
	PDUH2CTermReq  PDUType = 0x02
	PDUC2HTermReq  PDUType = 0x03
	PDUCapsuleCmd  PDUType = 0x04
	PDUCapsuleResp PDUType = 0x05
	PDUH2CData     PDUType = 0x06
	PDUC2HData     PDUType = 0x07
	PDUR2T         PDUType = 0x09
)

func (t PDUType) String() string {
	switch t {
	case PDUICReq:
		return "ICReq"
	case PDUICResp:
		return "ICResp"
	case PDUH2CTermReq:
		return "H2CTermReq"
	case PDUC2HTermReq:
		return "C2HTermReq"
	case PDUCapsuleCmd:
		return "CapsuleCmd"
	case PDUCapsuleResp:
		return "CapsuleResp"
	case PDUH2CData:
		return "H2CData"
	case PDUC2HData:
		return "C2HData"
	case PDUR2T:
		return "R2T"
	}
	return fmt.Sprintf("PDUType(%#x)", uint8(t))
}

// Header lengths (HLEN) of each PDU type, common header included.
const (
	CommonHeaderLen = 8
	ICReqLen        = 128
	ICRespLen       = 128
	TermReqHLen     = 24
	CapsuleCmdHLen  = 72 // 8 + 64-byte SQE
	CapsuleRespHLen = 24 // 8 + 16-byte CQE
	DataHLen        = 24 // H2CData and C2HData
	R2THLen         = 24
	DigestLen       = 4
	// MaxTermReqData is the most bytes of the offending PDU header that a
	// TermReq carries.
	MaxTermReqData = 152
)

// HLen returns the header length the specification fixes for t, or 0 for
// an unknown type.
func (t PDUType) HLen() int {
	switch t {
	case PDUICReq, PDUICResp:
		return ICReqLen
	case PDUH2CTermReq, PDUC2HTermReq:
		return TermReqHLen
	case PDUCapsuleCmd:
		return CapsuleCmdHLen
	case PDUCapsuleResp:
		return CapsuleRespHLen
	case PDUH2CData, PDUC2HData:
		return DataHLen
	case PDUR2T:
		return R2THLen
	}
	return 0
}

// Common header flags.
const (
	FlagHDGST       uint8 = 0x01 // a header digest follows the header
	FlagDDGST       uint8 = 0x02 // a data digest follows the data
	FlagDataLast    uint8 = 0x04 // last data PDU of the command (H2C/C2H data)
	FlagDataSuccess uint8 = 0x08 // C2HData: command succeeded, no CapsuleResp follows
)

// ICReq/ICResp digest bits (byte 11).
const (
	DigestHeader uint8 = 0x01
	DigestData   uint8 = 0x02
)

// Header is the 8-byte NVMe/TCP common header.
type Header struct {
	Type  PDUType
	Flags uint8
	HLen  uint8
	PDO   uint8  // PDU data offset from the start of the PDU, 0 if no data
	PLen  uint32 // total PDU length: header, digests, padding and data
}

// Append appends the 8-byte encoding of h to b.
func (h Header) Append(b []byte) []byte {
	b = append(b, byte(h.Type), h.Flags, h.HLen, h.PDO, 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(b[len(b)-4:], h.PLen)
	return b
}

// ParseHeader decodes the common header at the start of b and checks that
// HLEN matches the type and that PLEN covers the header. An unknown type is
// reported as ErrMalformed.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < CommonHeaderLen {
		return Header{}, fmt.Errorf("common header: have %d bytes, need %d: %w", len(b), CommonHeaderLen, ErrShort)
	}
	h := Header{Type: PDUType(b[0]), Flags: b[1], HLen: b[2], PDO: b[3], PLen: binary.LittleEndian.Uint32(b[4:8])}
	want := h.Type.HLen()
	if want == 0 {
		return h, fmt.Errorf("PDU type %#x is unknown: %w", b[0], ErrMalformed)
	}
	if int(h.HLen) != want {
		return h, fmt.Errorf("%v PDU: hlen %d, the specification fixes %d: %w", h.Type, h.HLen, want, ErrMalformed)
	}
	if h.PLen < uint32(h.HLen) {
		return h, fmt.Errorf("%v PDU: plen %d is smaller than hlen %d: %w", h.Type, h.PLen, h.HLen, ErrMalformed)
	}
	if h.PDO != 0 && (uint32(h.PDO) < uint32(h.HLen) || uint32(h.PDO) > h.PLen) {
		return h, fmt.Errorf("%v PDU: pdo %d outside [hlen %d, plen %d]: %w", h.Type, h.PDO, h.HLen, h.PLen, ErrMalformed)
	}
	return h, nil
}

// HeaderDigestLen is DigestLen when h carries a header digest, else 0.
func (h Header) HeaderDigestLen() int {
	if h.Flags&FlagHDGST != 0 {
		return DigestLen
	}
	return 0
}

// DataDigestLen is DigestLen when h carries a data digest, else 0.
func (h Header) DataDigestLen() int {
	if h.Flags&FlagDDGST != 0 {
		return DigestLen
	}
	return 0
}

// DataLen is the length of the PDU data implied by PLEN, PDO and the digest
// flags, or -1 when the fields are inconsistent.
func (h Header) DataLen() int {
	if h.PDO == 0 {
		if int64(h.PLen) != int64(h.HLen)+int64(h.HeaderDigestLen()) {
			return -1
		}
		return 0
	}
	if int(h.PDO) < int(h.HLen)+h.HeaderDigestLen() {
		return -1
	}
	n := int64(h.PLen) - int64(h.PDO) - int64(h.DataDigestLen())
	if n < 0 {
		return -1
	}
	return int(n)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the CRC-32C (Castagnoli) of p, the NVMe/TCP digest.
func CRC32C(p []byte) uint32 { return crc32.Checksum(p, castagnoli) }

// UpdateCRC32C continues a CRC-32C over more data (for data split over
// several buffers): crc = UpdateCRC32C(UpdateCRC32C(0, a), b).
func UpdateCRC32C(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// AppendDigest appends the 4-byte little-endian digest of p to b.
func AppendDigest(b, p []byte) []byte {
	return binary.LittleEndian.AppendUint32(b, CRC32C(p))
}

// CheckDigest reports whether the 4 bytes at d are the digest of p.
func CheckDigest(p, d []byte) bool {
	return len(d) >= DigestLen && binary.LittleEndian.Uint32(d) == CRC32C(p)
}

// ICReq is the host's connection initialization request.
type ICReq struct {
	PFV    uint16 // PDU format version, 0
	HPDA   uint8  // host PDU data alignment, (HPDA+1)*4 bytes
	Digest uint8  // DigestHeader | DigestData
	MaxR2T uint32 // maximum outstanding R2Ts per command, 0's based
}

// Append appends the 128-byte ICReq PDU to b.
func (p ICReq) Append(b []byte) []byte {
	b = Header{Type: PDUICReq, HLen: ICReqLen, PLen: ICReqLen}.Append(b)
	b = binary.LittleEndian.AppendUint16(b, p.PFV)
	b = append(b, p.HPDA, p.Digest)
	b = binary.LittleEndian.AppendUint32(b, p.MaxR2T)
	return append(b, make([]byte, ICReqLen-16)...)
}

// ParseICReq decodes a whole ICReq PDU (128 bytes, common header included).
func ParseICReq(b []byte) (ICReq, error) {
	if err := checkFixed(b, PDUICReq, ICReqLen); err != nil {
		return ICReq{}, err
	}
	return ICReq{PFV: binary.LittleEndian.Uint16(b[8:]), HPDA: b[10], Digest: b[11], MaxR2T: binary.LittleEndian.Uint32(b[12:])}, nil
}

// ICResp is the controller's answer to ICReq.
type ICResp struct {
	PFV     uint16 // 0
	CPDA    uint8  // controller PDU data alignment, 0's based dwords
	Digest  uint8  // digests enabled: exactly what the host asked for
	MaxData uint32 // MAXH2CDATA: most bytes in one H2CData PDU, >= 4096
}

// Append appends the 128-byte ICResp PDU to b.
func (p ICResp) Append(b []byte) []byte {
	b = Header{Type: PDUICResp, HLen: ICRespLen, PLen: ICRespLen}.Append(b)
	b = binary.LittleEndian.AppendUint16(b, p.PFV)
	b = append(b, p.CPDA, p.Digest)
	b = binary.LittleEndian.AppendUint32(b, p.MaxData)
	return append(b, make([]byte, ICRespLen-16)...)
}

// ParseICResp decodes a whole ICResp PDU.
func ParseICResp(b []byte) (ICResp, error) {
	if err := checkFixed(b, PDUICResp, ICRespLen); err != nil {
		return ICResp{}, err
	}
	return ICResp{PFV: binary.LittleEndian.Uint16(b[8:]), CPDA: b[10], Digest: b[11], MaxData: binary.LittleEndian.Uint32(b[12:])}, nil
}

func checkFixed(b []byte, t PDUType, n int) error {
	if len(b) < n {
		return fmt.Errorf("%v PDU: have %d bytes, need %d: %w", t, len(b), n, ErrShort)
	}
	if PDUType(b[0]) != t {
		return fmt.Errorf("expected a %v PDU, got %v: %w", t, PDUType(b[0]), ErrMalformed)
	}
	if int(b[2]) != n {
		return fmt.Errorf("%v PDU: hlen %d, want %d: %w", t, b[2], n, ErrMalformed)
	}
	return nil
}

// Fatal error status (FES) codes carried by TermReq PDUs.
const (
	FESInvalidHeader     uint16 = 0x01 // invalid PDU header field (FEI: byte offset)
	FESPDUSequence       uint16 = 0x02 // PDU sequence error
	FESHeaderDigest      uint16 = 0x03 // header digest error
	FESDataOutOfRange    uint16 = 0x04 // data transfer out of range
	FESDataLimitExceeded uint16 = 0x05 // H2C data over MAXH2CDATA / R2T limit
	FESUnsupportedParam  uint16 = 0x06 // unsupported parameter (FEI: byte offset)
)

// TermReq is an H2CTermReq or C2HTermReq: the sender is closing the
// connection after a fatal transport error.
type TermReq struct {
	Type PDUType // PDUH2CTermReq or PDUC2HTermReq
	FES  uint16
	FEI  uint32 // fatal error information, e.g. the offending byte offset
	Data []byte // the offending PDU header, at most MaxTermReqData bytes
}

// Append appends the TermReq PDU (header and data) to b.
func (p TermReq) Append(b []byte) []byte {
	d := p.Data
	if len(d) > MaxTermReqData {
		d = d[:MaxTermReqData]
	}
	b = Header{Type: p.Type, HLen: TermReqHLen, PLen: uint32(TermReqHLen + len(d))}.Append(b)
	b = binary.LittleEndian.AppendUint16(b, p.FES)
	b = binary.LittleEndian.AppendUint32(b, p.FEI)
	b = append(b, make([]byte, 10)...)
	return append(b, d...)
}

// ParseTermReq decodes a TermReq PDU; Data aliases b.
func ParseTermReq(b []byte) (TermReq, error) {
	if len(b) < TermReqHLen {
		return TermReq{}, fmt.Errorf("TermReq PDU: have %d bytes, need %d: %w", len(b), TermReqHLen, ErrShort)
	}
	t := PDUType(b[0])
	if t != PDUH2CTermReq && t != PDUC2HTermReq {
		return TermReq{}, fmt.Errorf("expected a TermReq PDU, got %v: %w", t, ErrMalformed)
	}
	plen := binary.LittleEndian.Uint32(b[4:])
	if plen < TermReqHLen || plen > TermReqHLen+MaxTermReqData {
		return TermReq{}, fmt.Errorf("TermReq PDU: plen %d outside [%d, %d]: %w", plen, TermReqHLen, TermReqHLen+MaxTermReqData, ErrMalformed)
	}
	if uint32(len(b)) < plen {
		return TermReq{}, fmt.Errorf("TermReq PDU: have %d bytes, plen %d: %w", len(b), plen, ErrShort)
	}
	return TermReq{Type: t, FES: binary.LittleEndian.Uint16(b[8:]), FEI: binary.LittleEndian.Uint32(b[10:]), Data: b[TermReqHLen:plen]}, nil
}

// AppendCapsuleCmd appends a CapsuleCmd PDU header for sqe with dataLen
// bytes of in-capsule data to b, and its header digest when digest has
// DigestHeader. The caller then appends the data and, when digest has
// DigestData and dataLen > 0, its digest (AppendDigest).
func AppendCapsuleCmd(b []byte, sqe *SQE, dataLen int, digest uint8) []byte {
	h := Header{Type: PDUCapsuleCmd, HLen: CapsuleCmdHLen}
	h.PLen, h.PDO = dataLayout(&h, dataLen, digest)
	start := len(b)
	b = h.Append(b)
	b = sqe.Append(b)
	if digest&DigestHeader != 0 {
		b = AppendDigest(b, b[start:])
	}
	return b
}

// dataLayout sets the digest flags of h and returns PLEN and PDO for a PDU
// carrying dataLen bytes with cpda 0.
func dataLayout(h *Header, dataLen int, digest uint8) (uint32, uint8) {
	plen := uint32(h.HLen)
	if digest&DigestHeader != 0 {
		h.Flags |= FlagHDGST
		plen += DigestLen
	}
	if dataLen == 0 {
		return plen, 0
	}
	pdo := uint8(plen)
	plen += uint32(dataLen)
	if digest&DigestData != 0 {
		h.Flags |= FlagDDGST
		plen += DigestLen
	}
	return plen, pdo
}

// ParseCapsuleCmd decodes the SQE of a CapsuleCmd PDU whose header (at
// least CapsuleCmdHLen bytes) is in b.
func ParseCapsuleCmd(b []byte) (SQE, error) {
	if err := checkFixed(b, PDUCapsuleCmd, CapsuleCmdHLen); err != nil {
		return SQE{}, err
	}
	return ParseSQE(b[CommonHeaderLen:])
}

// AppendCapsuleResp appends a CapsuleResp PDU for cqe to b, with a header
// digest when digest has DigestHeader.
func AppendCapsuleResp(b []byte, cqe *CQE, digest uint8) []byte {
	h := Header{Type: PDUCapsuleResp, HLen: CapsuleRespHLen}
	h.PLen, h.PDO = dataLayout(&h, 0, digest)
	start := len(b)
	b = h.Append(b)
	b = cqe.Append(b)
	if digest&DigestHeader != 0 {
		b = AppendDigest(b, b[start:])
	}
	return b
}

// ParseCapsuleResp decodes the CQE of a CapsuleResp PDU header in b.
func ParseCapsuleResp(b []byte) (CQE, error) {
	if err := checkFixed(b, PDUCapsuleResp, CapsuleRespHLen); err != nil {
		return CQE{}, err
	}
	return ParseCQE(b[CommonHeaderLen:])
}

// DataPDU is the header of an H2CData or C2HData PDU.
type DataPDU struct {
	Type   PDUType // PDUH2CData or PDUC2HData
	Flags  uint8   // FlagDataLast, FlagDataSuccess (digest flags are set by Append)
	CID    uint16  // command identifier
	TTag   uint16  // H2CData: transfer tag from the R2T
	Offset uint32  // byte offset of this data in the command's transfer
	Length uint32  // bytes of data in this PDU
}

// Append appends the data PDU header (and its header digest) to b; the
// caller appends Length bytes of data and, with DigestData, their digest.
func (p DataPDU) Append(b []byte, digest uint8) []byte {
	h := Header{Type: p.Type, Flags: p.Flags &^ (FlagHDGST | FlagDDGST), HLen: DataHLen}
	h.PLen, h.PDO = dataLayout(&h, int(p.Length), digest)
	return appendTransfer(b, h, p.CID, p.TTag, p.Offset, p.Length, digest)
}

// appendTransfer appends the header h and the fields that data PDUs and
// R2T share (CID, TTAG, offset, length, 4 reserved bytes), then the
// header digest when negotiated.
func appendTransfer(b []byte, h Header, cid, ttag uint16, off, n uint32, digest uint8) []byte {
	start := len(b)
	b = h.Append(b)
	b = binary.LittleEndian.AppendUint16(b, cid)
	b = binary.LittleEndian.AppendUint16(b, ttag)
	b = binary.LittleEndian.AppendUint32(b, off)
	b = binary.LittleEndian.AppendUint32(b, n)
	b = append(b, 0, 0, 0, 0)
	if digest&DigestHeader != 0 {
		b = AppendDigest(b, b[start:])
	}
	return b
}

// ParseDataPDU decodes an H2CData or C2HData header in b and checks that
// DATAL agrees with PLEN and PDO.
func ParseDataPDU(b []byte) (DataPDU, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return DataPDU{}, err
	}
	if h.Type != PDUH2CData && h.Type != PDUC2HData {
		return DataPDU{}, fmt.Errorf("expected a data PDU, got %v: %w", h.Type, ErrMalformed)
	}
	if len(b) < DataHLen {
		return DataPDU{}, fmt.Errorf("%v PDU: have %d bytes, need %d: %w", h.Type, len(b), DataHLen, ErrShort)
	}
	p := DataPDU{Type: h.Type, Flags: h.Flags, CID: binary.LittleEndian.Uint16(b[8:]), TTag: binary.LittleEndian.Uint16(b[10:]),
		Offset: binary.LittleEndian.Uint32(b[12:]), Length: binary.LittleEndian.Uint32(b[16:])}
	if p.Length == 0 {
		return p, fmt.Errorf("%v PDU carries no data (datal 0); a data PDU must carry at least one byte: %w", h.Type, ErrMalformed)
	}
	if h.PDO == 0 || h.DataLen() != int(p.Length) {
		return p, fmt.Errorf("%v PDU: datal %d disagrees with plen %d, pdo %d: %w", h.Type, p.Length, h.PLen, h.PDO, ErrMalformed)
	}
	return p, nil
}

// R2T is a Ready-to-Transfer PDU: the controller asks the host for Length
// bytes of the command's data starting at Offset.
type R2T struct {
	CID    uint16
	TTag   uint16
	Offset uint32
	Length uint32
}

// Append appends the R2T PDU (and its header digest) to b.
func (p R2T) Append(b []byte, digest uint8) []byte {
	h := Header{Type: PDUR2T, HLen: R2THLen}
	h.PLen, h.PDO = dataLayout(&h, 0, digest)
	return appendTransfer(b, h, p.CID, p.TTag, p.Offset, p.Length, digest)
}

// ParseR2T decodes an R2T PDU header in b.
func ParseR2T(b []byte) (R2T, error) {
	if err := checkFixed(b, PDUR2T, R2THLen); err != nil {
		return R2T{}, err
	}
	return R2T{CID: binary.LittleEndian.Uint16(b[8:]), TTag: binary.LittleEndian.Uint16(b[10:]),
		Offset: binary.LittleEndian.Uint32(b[12:]), Length: binary.LittleEndian.Uint32(b[16:])}, nil
}
