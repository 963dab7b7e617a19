package nvme

import (
	"encoding/binary"
	"fmt"
)

// NVMe in-band authentication (NVMe Base 2.0 §8.13, DH-HMAC-CHAP) travels in
// the Fabrics Authentication Send (fctype 0x05) and Authentication Receive
// (fctype 0x06) commands. This file holds their SQE fields and the codecs of
// the DH-HMAC-CHAP messages; auth_dhchap.go holds the secrets, the hash
// computations and the FFDHE groups.

// Security protocol fields of Authentication Send/Receive for DH-HMAC-CHAP.
const (
	AuthSECP  uint8 = 0xE9 // NVMe security protocol
	AuthSPSP0 uint8 = 0x01
	AuthSPSP1 uint8 = 0x01
)

// ConnectAuthReqATR is the Connect response bit (DW0 bit 17, AUTHREQ bit 1)
// that tells the host it must authenticate the queue before using it.
// ConnectAuthReqASCR (bit 18) asks for a secure channel as well; tier0
// never sets it.
const (
	ConnectAuthReqATR  uint32 = 1 << 17
	ConnectAuthReqASCR uint32 = 1 << 18
)

// AuthCmd holds the SQE fields of Authentication Send (Send true; Len is the
// transfer length TL) and Authentication Receive (Len is the allocation
// length AL).
type AuthCmd struct {
	Send               bool
	SECP, SPSP0, SPSP1 uint8
	Len                uint32
}

// DHCHAPAuthCmd returns the command for a DH-HMAC-CHAP message of n bytes.
func DHCHAPAuthCmd(send bool, n int) AuthCmd {
	return AuthCmd{Send: send, SECP: AuthSECP, SPSP0: AuthSPSP0, SPSP1: AuthSPSP1, Len: uint32(n)}
}

// SQE encodes the command; the caller's transport fills DPTR.
func (a AuthCmd) SQE(cid uint16) SQE {
	ft := FabricsAuthRecv
	if a.Send {
		ft = FabricsAuthSend
	}
	return SQE{Opcode: AdminFabrics, Flags: SQEFlagSGLMeta, CID: cid, NSID: uint32(ft),
		CDW10: uint32(a.SPSP0)<<8 | uint32(a.SPSP1)<<16 | uint32(a.SECP)<<24, CDW11: a.Len}
}

// ParseAuthCmd extracts the Authentication Send/Receive fields of s.
func ParseAuthCmd(s *SQE) AuthCmd {
	return AuthCmd{Send: s.FCType() == FabricsAuthSend, SPSP0: uint8(s.CDW10 >> 8), SPSP1: uint8(s.CDW10 >> 16),
		SECP: uint8(s.CDW10 >> 24), Len: s.CDW11}
}

// Authentication message types (AUTH-TYPE) and identifiers (AUTH-ID).
const (
	AuthTypeCommon uint8 = 0x00 // AUTH_Negotiate, _Failure1, _Failure2
	AuthTypeDHCHAP uint8 = 0x01

	AuthIDNegotiate uint8 = 0x00
	AuthIDChallenge uint8 = 0x01
	AuthIDReply     uint8 = 0x02
	AuthIDSuccess1  uint8 = 0x03
	AuthIDSuccess2  uint8 = 0x04
	AuthIDFailure2  uint8 = 0xF0
	AuthIDFailure1  uint8 = 0xF1
)

// AuthProtocolDHCHAP is the AUTHID of the DH-HMAC-CHAP protocol descriptor.
const AuthProtocolDHCHAP uint8 = 0x01

// Failure reason code (always "authentication failed") and explanations.
const (
	AuthReasonFailed uint8 = 0x01

	AuthFailFailed           uint8 = 0x01 // authentication failed (wrong response)
	AuthFailNotUsable        uint8 = 0x02 // protocol not usable
	AuthFailConcatMismatch   uint8 = 0x03 // secure channel concatenation mismatch
	AuthFailHashUnusable     uint8 = 0x04 // no common hash function
	AuthFailDHGroupUnusable  uint8 = 0x05 // no common DH group
	AuthFailIncorrectPayload uint8 = 0x06
	AuthFailIncorrectMessage uint8 = 0x07
)

// AuthFailName names a failure explanation code for messages.
func AuthFailName(code uint8) string {
	switch code {
	case AuthFailFailed:
		return "authentication failed"
	case AuthFailNotUsable:
		return "authentication protocol not usable"
	case AuthFailConcatMismatch:
		return "secure channel concatenation mismatch"
	case AuthFailHashUnusable:
		return "no common hash function"
	case AuthFailDHGroupUnusable:
		return "no common DH group"
	case AuthFailIncorrectPayload:
		return "incorrect payload"
	case AuthFailIncorrectMessage:
		return "incorrect protocol message"
	}
	return fmt.Sprintf("failure code %#x", code)
}

// Message sizes.
const (
	AuthNegotiateHLen   = 8
	AuthProtocolDescLen = 64
	AuthChallengeHLen   = 16
	AuthReplyHLen       = 16
	AuthSuccess1HLen    = 16
	AuthSuccess2Len     = 16
	AuthFailureLen      = 8
	// authIDListHashes and authIDListDH split the 60-byte ID list of a
	// protocol descriptor: hash IDs first, DH group IDs from byte 30.
	authIDListHashes = 30
	authIDListDH     = 30
)

// AuthHeader is the part every authentication message starts with.
type AuthHeader struct {
	Type, ID uint8
	TID      uint16
}

// ParseAuthHeader decodes the type, identifier and transaction ID.
func ParseAuthHeader(b []byte) (AuthHeader, error) {
	if len(b) < 6 {
		return AuthHeader{}, fmt.Errorf("auth message: have %d bytes, need 6: %w", len(b), ErrShort)
	}
	return AuthHeader{Type: b[0], ID: b[1], TID: binary.LittleEndian.Uint16(b[4:])}, nil
}

func appendAuthHeader(b []byte, typ, id uint8, tid uint16) []byte {
	b = append(b, typ, id, 0, 0)
	return binary.LittleEndian.AppendUint16(b, tid)
}

// DHCHAPProtocol is one DH-HMAC-CHAP protocol descriptor of AUTH_Negotiate:
// the hash functions and DH groups the host can use, in its preference
// order.
type DHCHAPProtocol struct {
	AuthID   uint8 // AuthProtocolDHCHAP
	Hashes   []uint8
	DHGroups []uint8
}

// AuthNegotiate is the host's AUTH_Negotiate message.
type AuthNegotiate struct {
	TID       uint16
	SCC       uint8 // secure channel concatenation; 0 none
	Protocols []DHCHAPProtocol
}

// Append encodes m.
func (m AuthNegotiate) Append(b []byte) []byte {
	b = appendAuthHeader(b, AuthTypeCommon, AuthIDNegotiate, m.TID)
	b = append(b, m.SCC, uint8(len(m.Protocols)))
	for _, p := range m.Protocols {
		var d [AuthProtocolDescLen]byte
		d[0] = p.AuthID
		d[2] = uint8(min(len(p.Hashes), authIDListHashes))
		d[3] = uint8(min(len(p.DHGroups), authIDListDH))
		copy(d[4:4+authIDListHashes], p.Hashes)
		copy(d[4+authIDListHashes:], p.DHGroups)
		b = append(b, d[:]...)
	}
	return b
}

// ParseAuthNegotiate decodes an AUTH_Negotiate message.
func ParseAuthNegotiate(b []byte) (AuthNegotiate, error) {
	if len(b) < AuthNegotiateHLen {
		return AuthNegotiate{}, fmt.Errorf("AUTH_Negotiate: have %d bytes, need %d: %w", len(b), AuthNegotiateHLen, ErrShort)
	}
	h, _ := ParseAuthHeader(b)
	if h.Type != AuthTypeCommon || h.ID != AuthIDNegotiate {
		return AuthNegotiate{}, fmt.Errorf("AUTH_Negotiate: message type %#x id %#x: %w", h.Type, h.ID, ErrMalformed)
	}
	m := AuthNegotiate{TID: h.TID, SCC: b[6]}
	n := int(b[7])
	if len(b) < AuthNegotiateHLen+n*AuthProtocolDescLen {
		return AuthNegotiate{}, fmt.Errorf("AUTH_Negotiate: %d protocol descriptors need %d bytes, have %d: %w",
			n, AuthNegotiateHLen+n*AuthProtocolDescLen, len(b), ErrShort)
	}
	for i := 0; i < n; i++ {
		d := b[AuthNegotiateHLen+i*AuthProtocolDescLen:][:AuthProtocolDescLen]
		halen, dhlen := int(d[2]), int(d[3])
		if halen > authIDListHashes || dhlen > authIDListDH {
			return AuthNegotiate{}, fmt.Errorf("AUTH_Negotiate: descriptor %d lists %d hashes and %d DH groups, at most 30 each: %w", i, halen, dhlen, ErrMalformed)
		}
		m.Protocols = append(m.Protocols, DHCHAPProtocol{AuthID: d[0],
			Hashes:   append([]uint8{}, d[4:4+halen]...),
			DHGroups: append([]uint8{}, d[4+authIDListHashes:4+authIDListHashes+dhlen]...)})
	}
	return m, nil
}

// AuthChallenge is the controller's DH-HMAC-CHAP_Challenge: challenge C1
// (hash-length bytes), sequence number S1 and, unless the DH group is null,
// the controller's DH public value.
type AuthChallenge struct {
	TID     uint16
	HashID  uint8
	DHGroup uint8
	Seq     uint32
	C       []byte
	DHV     []byte
}

// Append encodes m.
func (m AuthChallenge) Append(b []byte) []byte {
	b = appendAuthHeader(b, AuthTypeDHCHAP, AuthIDChallenge, m.TID)
	b = append(b, uint8(len(m.C)), 0, m.HashID, m.DHGroup)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.DHV)))
	b = binary.LittleEndian.AppendUint32(b, m.Seq)
	b = append(b, m.C...)
	return append(b, m.DHV...)
}

// ParseAuthChallenge decodes a DH-HMAC-CHAP_Challenge message.
func ParseAuthChallenge(b []byte) (AuthChallenge, error) {
	if len(b) < AuthChallengeHLen {
		return AuthChallenge{}, fmt.Errorf("DH-HMAC-CHAP_Challenge: have %d bytes, need %d: %w", len(b), AuthChallengeHLen, ErrShort)
	}
	h, _ := ParseAuthHeader(b)
	if h.Type != AuthTypeDHCHAP || h.ID != AuthIDChallenge {
		return AuthChallenge{}, fmt.Errorf("DH-HMAC-CHAP_Challenge: message type %#x id %#x: %w", h.Type, h.ID, ErrMalformed)
	}
	hl := int(b[6])
	dhvlen := int(binary.LittleEndian.Uint16(b[10:]))
	if len(b) < AuthChallengeHLen+hl+dhvlen {
		return AuthChallenge{}, fmt.Errorf("DH-HMAC-CHAP_Challenge: HL %d and DHVLEN %d need %d bytes, have %d: %w",
			hl, dhvlen, AuthChallengeHLen+hl+dhvlen, len(b), ErrShort)
	}
	p := b[AuthChallengeHLen:]
	return AuthChallenge{TID: h.TID, HashID: b[8], DHGroup: b[9], Seq: binary.LittleEndian.Uint32(b[12:]),
		C: append([]byte{}, p[:hl]...), DHV: append([]byte{}, p[hl:hl+dhvlen]...)}, nil
}

// AuthReply is the host's DH-HMAC-CHAP_Reply: response R1, and for
// bidirectional authentication (CValid) challenge C2 with sequence number
// S2 (S2 0: no controller authentication), then the host's DH public value.
// C2 occupies HL bytes on the wire even when not valid.
type AuthReply struct {
	TID    uint16
	CValid bool
	Seq    uint32
	R      []byte
	C2     []byte // len(R) bytes when CValid; ignored otherwise
	DHV    []byte
}

// Append encodes m.
func (m AuthReply) Append(b []byte) []byte {
	hl := len(m.R)
	b = appendAuthHeader(b, AuthTypeDHCHAP, AuthIDReply, m.TID)
	cv := uint8(0)
	if m.CValid {
		cv = 1
	}
	b = append(b, uint8(hl), 0, cv, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.DHV)))
	b = binary.LittleEndian.AppendUint32(b, m.Seq)
	b = append(b, m.R...)
	c2 := make([]byte, hl)
	if m.CValid {
		copy(c2, m.C2)
	}
	b = append(b, c2...)
	return append(b, m.DHV...)
}

// ParseAuthReply decodes a DH-HMAC-CHAP_Reply message.
func ParseAuthReply(b []byte) (AuthReply, error) {
	if len(b) < AuthReplyHLen {
		return AuthReply{}, fmt.Errorf("DH-HMAC-CHAP_Reply: have %d bytes, need %d: %w", len(b), AuthReplyHLen, ErrShort)
	}
	h, _ := ParseAuthHeader(b)
	if h.Type != AuthTypeDHCHAP || h.ID != AuthIDReply {
		return AuthReply{}, fmt.Errorf("DH-HMAC-CHAP_Reply: message type %#x id %#x: %w", h.Type, h.ID, ErrMalformed)
	}
	hl := int(b[6])
	dhvlen := int(binary.LittleEndian.Uint16(b[10:]))
	if len(b) < AuthReplyHLen+2*hl+dhvlen {
		return AuthReply{}, fmt.Errorf("DH-HMAC-CHAP_Reply: HL %d and DHVLEN %d need %d bytes, have %d: %w",
			hl, dhvlen, AuthReplyHLen+2*hl+dhvlen, len(b), ErrShort)
	}
	p := b[AuthReplyHLen:]
	m := AuthReply{TID: h.TID, CValid: b[8]&1 != 0, Seq: binary.LittleEndian.Uint32(b[12:]),
		R: append([]byte{}, p[:hl]...), DHV: append([]byte{}, p[2*hl:2*hl+dhvlen]...)}
	if m.CValid {
		m.C2 = append([]byte{}, p[hl:2*hl]...)
	}
	return m, nil
}

// AuthSuccess1 is the controller's DH-HMAC-CHAP_Success1; with RValid it
// carries the controller's response R2 to the host's challenge C2.
type AuthSuccess1 struct {
	TID    uint16
	HL     uint8
	RValid bool
	R      []byte // HL bytes when RValid
}

// Append encodes m.
func (m AuthSuccess1) Append(b []byte) []byte {
	b = appendAuthHeader(b, AuthTypeDHCHAP, AuthIDSuccess1, m.TID)
	rv := uint8(0)
	if m.RValid {
		rv = 1
	}
	b = append(b, m.HL, 0, rv, 0, 0, 0, 0, 0, 0, 0)
	if m.RValid {
		r := make([]byte, m.HL)
		copy(r, m.R)
		b = append(b, r...)
	}
	return b
}

// ParseAuthSuccess1 decodes a DH-HMAC-CHAP_Success1 message.
func ParseAuthSuccess1(b []byte) (AuthSuccess1, error) {
	if len(b) < AuthSuccess1HLen {
		return AuthSuccess1{}, fmt.Errorf("DH-HMAC-CHAP_Success1: have %d bytes, need %d: %w", len(b), AuthSuccess1HLen, ErrShort)
	}
	h, _ := ParseAuthHeader(b)
	if h.Type != AuthTypeDHCHAP || h.ID != AuthIDSuccess1 {
		return AuthSuccess1{}, fmt.Errorf("DH-HMAC-CHAP_Success1: message type %#x id %#x: %w", h.Type, h.ID, ErrMalformed)
	}
	m := AuthSuccess1{TID: h.TID, HL: b[6], RValid: b[8]&1 != 0}
	if m.RValid {
		if len(b) < AuthSuccess1HLen+int(m.HL) {
			return AuthSuccess1{}, fmt.Errorf("DH-HMAC-CHAP_Success1: HL %d needs %d bytes, have %d: %w", m.HL, AuthSuccess1HLen+int(m.HL), len(b), ErrShort)
		}
		m.R = append([]byte{}, b[AuthSuccess1HLen:AuthSuccess1HLen+int(m.HL)]...)
	}
	return m, nil
}

// AppendAuthSuccess2 encodes a DH-HMAC-CHAP_Success2 message.
func AppendAuthSuccess2(b []byte, tid uint16) []byte {
	b = appendAuthHeader(b, AuthTypeDHCHAP, AuthIDSuccess2, tid)
	return append(b, make([]byte, AuthSuccess2Len-6)...)
}

// AuthFailure is AUTH_Failure1 (controller to host) or AUTH_Failure2 (host
// to controller).
type AuthFailure struct {
	ID          uint8 // AuthIDFailure1 or AuthIDFailure2
	TID         uint16
	Reason      uint8 // AuthReasonFailed
	Explanation uint8 // AuthFail*
}

// Append encodes m.
func (m AuthFailure) Append(b []byte) []byte {
	b = appendAuthHeader(b, AuthTypeCommon, m.ID, m.TID)
	return append(b, m.Reason, m.Explanation)
}

// ParseAuthFailure decodes an AUTH_Failure1 or AUTH_Failure2 message.
func ParseAuthFailure(b []byte) (AuthFailure, error) {
	if len(b) < AuthFailureLen {
		return AuthFailure{}, fmt.Errorf("AUTH_Failure: have %d bytes, need %d: %w", len(b), AuthFailureLen, ErrShort)
	}
	h, _ := ParseAuthHeader(b)
	if h.Type != AuthTypeCommon || (h.ID != AuthIDFailure1 && h.ID != AuthIDFailure2) {
		return AuthFailure{}, fmt.Errorf("AUTH_Failure: message type %#x id %#x: %w", h.Type, h.ID, ErrMalformed)
	}
	return AuthFailure{ID: h.ID, TID: h.TID, Reason: b[6], Explanation: b[7]}, nil
}
