package nvme

import (
	"encoding/binary"
	"fmt"
)

// ResvType is a reservation type.
type ResvType uint8

// Reservation types.
const (
	ResvNone               ResvType = 0
	ResvWriteExclusive     ResvType = 1
	ResvExclusiveAccess    ResvType = 2
	ResvWriteExclusiveRO   ResvType = 3 // registrants only
	ResvExclusiveAccessRO  ResvType = 4
	ResvWriteExclusiveAll  ResvType = 5 // all registrants
	ResvExclusiveAccessAll ResvType = 6
)

// Valid reports whether t is a defined reservation type (1..6).
func (t ResvType) Valid() bool { return t >= ResvWriteExclusive && t <= ResvExclusiveAccessAll }

// AllRegistrants reports whether every registrant holds a reservation of
// type t.
func (t ResvType) AllRegistrants() bool {
	return t == ResvWriteExclusiveAll || t == ResvExclusiveAccessAll
}

// Allows reports whether a host may perform a read (write=false) or a
// write-class command under a reservation of type t, given whether it
// holds the reservation and whether it is registered.
func (t ResvType) Allows(write, holder, registered bool) bool {
	if t == ResvNone || holder {
		return true
	}
	switch t {
	case ResvWriteExclusive:
		return !write
	case ResvExclusiveAccess:
		return false
	case ResvWriteExclusiveRO, ResvWriteExclusiveAll:
		return registered || !write
	case ResvExclusiveAccessRO, ResvExclusiveAccessAll:
		return registered
	}
	return false
}

func (t ResvType) String() string {
	switch t {
	case ResvNone:
		return "none"
	case ResvWriteExclusive:
		return "write-exclusive"
	case ResvExclusiveAccess:
		return "exclusive-access"
	case ResvWriteExclusiveRO:
		return "write-exclusive-registrants-only"
	case ResvExclusiveAccessRO:
		return "exclusive-access-registrants-only"
	case ResvWriteExclusiveAll:
		return "write-exclusive-all-registrants"
	case ResvExclusiveAccessAll:
		return "exclusive-access-all-registrants"
	}
	return fmt.Sprintf("ResvType(%d)", uint8(t))
}

// Reservation Register actions (cdw10 bits 2:0).
const (
	ResvRegister   uint8 = 0
	ResvUnregister uint8 = 1
	ResvReplace    uint8 = 2
)

// Reservation Acquire actions.
const (
	ResvAcquire         uint8 = 0
	ResvPreempt         uint8 = 1
	ResvPreemptAndAbort uint8 = 2
)

// Reservation Release actions.
const (
	ResvRelease uint8 = 0
	ResvClear   uint8 = 1
)

// ResvCmd holds the cdw10 fields shared by Register, Acquire and Release.
type ResvCmd struct {
	Action uint8    // bits 2:0
	IEKey  bool     // bit 3: ignore existing key
	Type   ResvType // bits 15:8 (Acquire, Release)
	CPTPL  uint8    // bits 31:30 (Register): change persist through power loss
}

// CDW10 encodes c.
func (c ResvCmd) CDW10() uint32 {
	v := uint32(c.Action&7) | uint32(c.Type)<<8 | uint32(c.CPTPL&3)<<30
	if c.IEKey {
		v |= 1 << 3
	}
	return v
}

// ParseResvCmd decodes a reservation command's cdw10.
func ParseResvCmd(cdw10 uint32) ResvCmd {
	return ResvCmd{Action: uint8(cdw10 & 7), IEKey: cdw10&(1<<3) != 0, Type: ResvType(cdw10 >> 8), CPTPL: uint8(cdw10 >> 30)}
}

// ResvKeys is the data of Register (current key, new key), Acquire
// (current key, preempt key) and Release (current key; 8 bytes).
type ResvKeys struct {
	CRKey uint64
	Key2  uint64 // NRKEY (Register) or PRKEY (Acquire)
}

// ResvKeysLen and ResvReleaseDataLen are the data sizes.
const (
	ResvKeysLen        = 16
	ResvReleaseDataLen = 8
)

// Append appends the 16-byte data to b.
func (k ResvKeys) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, k.CRKey)
	return binary.LittleEndian.AppendUint64(b, k.Key2)
}

// ParseResvKeys decodes reservation command data: 16 bytes, or 8 for
// Release (Key2 is then 0).
func ParseResvKeys(b []byte) (ResvKeys, error) {
	if len(b) < ResvReleaseDataLen {
		return ResvKeys{}, fmt.Errorf("reservation data: have %d bytes, need at least %d: %w", len(b), ResvReleaseDataLen, ErrShort)
	}
	k := ResvKeys{CRKey: binary.LittleEndian.Uint64(b)}
	if len(b) >= ResvKeysLen {
		k.Key2 = binary.LittleEndian.Uint64(b[8:])
	}
	return k, nil
}

// Registrant is a registered controller data structure (extended format:
// 64 bytes, 128-bit host identifier).
type Registrant struct {
	CntlID uint16 // 0xFFFF when the host has no controller connected here
	Holder bool   // RCSTS bit 0: holds the reservation
	HostID [16]byte
	RKey   uint64
}

// ResvStatus is the Reservation Report data in extended format (cdw11
// EDS=1), the only format tier0 serves because host IDs are 128 bits.
type ResvStatus struct {
	Gen         uint32
	Type        ResvType
	PTPLS       bool
	Registrants []Registrant
}

// Extended reservation status layout.
const (
	ResvStatusExtHeaderLen = 64
	RegistrantExtLen       = 64
	ResvReportEDS          = 1 // Reservation Report cdw11 bit 0
)

// Append appends the extended reservation status to b.
func (r *ResvStatus) Append(b []byte) []byte {
	start := len(b)
	b = append(b, make([]byte, ResvStatusExtHeaderLen+RegistrantExtLen*len(r.Registrants))...)
	o := b[start:]
	le := binary.LittleEndian
	le.PutUint32(o[0:], r.Gen)
	o[4] = uint8(r.Type)
	le.PutUint16(o[5:], uint16(len(r.Registrants)))
	if r.PTPLS {
		o[9] = 1
	}
	for i, g := range r.Registrants {
		p := o[ResvStatusExtHeaderLen+RegistrantExtLen*i:]
		le.PutUint16(p[0:], g.CntlID)
		if g.Holder {
			p[2] = 1
		}
		le.PutUint64(p[8:], g.RKey)
		copy(p[16:32], g.HostID[:])
	}
	return b
}

// ParseResvStatus decodes extended reservation status data; it returns
// the registrants that fit in b (a host may read a prefix).
func ParseResvStatus(b []byte) (ResvStatus, error) {
	if len(b) < ResvStatusExtHeaderLen {
		return ResvStatus{}, fmt.Errorf("reservation status: have %d bytes, need %d: %w", len(b), ResvStatusExtHeaderLen, ErrShort)
	}
	le := binary.LittleEndian
	r := ResvStatus{Gen: le.Uint32(b), Type: ResvType(b[4]), PTPLS: b[9]&1 != 0}
	n := int(le.Uint16(b[5:]))
	for i := 0; i < n; i++ {
		off := ResvStatusExtHeaderLen + RegistrantExtLen*i
		if off+RegistrantExtLen > len(b) {
			break
		}
		p := b[off:]
		g := Registrant{CntlID: le.Uint16(p), Holder: p[2]&1 != 0, RKey: le.Uint64(p[8:])}
		copy(g.HostID[:], p[16:32])
		r.Registrants = append(r.Registrants, g)
	}
	return r, nil
}
