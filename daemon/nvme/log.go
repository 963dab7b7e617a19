package nvme

import (
	"encoding/binary"
	"fmt"
)

// ANAState is the asymmetric namespace access state of an ANA group as
// seen through one controller.
type ANAState uint8

// ANA states.
const (
	ANAOptimized      ANAState = 0x01
	ANANonOptimized   ANAState = 0x02
	ANAInaccessible   ANAState = 0x03
	ANAPersistentLoss ANAState = 0x04
	ANAChange         ANAState = 0x0F
)

func (s ANAState) String() string {
	switch s {
	case ANAOptimized:
		return "optimized"
	case ANANonOptimized:
		return "non-optimized"
	case ANAInaccessible:
		return "inaccessible"
	case ANAPersistentLoss:
		return "persistent-loss"
	case ANAChange:
		return "change"
	}
	return fmt.Sprintf("ANAState(%#x)", uint8(s))
}

// Valid reports whether s is one of the five defined states.
func (s ANAState) Valid() bool {
	switch s {
	case ANAOptimized, ANANonOptimized, ANAInaccessible, ANAPersistentLoss, ANAChange:
		return true
	}
	return false
}

// ParseANAState parses a state name as String prints it ("optimized",
// "non-optimized", "inaccessible", "persistent-loss", "change").
func ParseANAState(s string) (ANAState, error) {
	for _, st := range []ANAState{ANAOptimized, ANANonOptimized, ANAInaccessible, ANAPersistentLoss, ANAChange} {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("ANA state %q: want optimized, non-optimized, inaccessible, persistent-loss or change: %w", s, ErrMalformed)
}

// IOStatus returns the path status an I/O command fails with in state s,
// or StatusSuccess when I/O is allowed.
func (s ANAState) IOStatus() Status {
	switch s {
	case ANAOptimized, ANANonOptimized:
		return StatusSuccess
	case ANAPersistentLoss:
		return StatusANAPersistentLoss
	case ANAChange:
		return StatusANATransition
	}
	return StatusANAInaccessible
}

// ANAGroupDesc is one group descriptor of the ANA log page.
type ANAGroupDesc struct {
	GroupID     uint32
	ChangeCount uint64
	State       ANAState
	NSIDs       []uint32
}

// ANALog is the ANA log page (LID 0x0C).
type ANALog struct {
	ChangeCount uint64
	Groups      []ANAGroupDesc
}

// Sizes of the ANA log page parts.
const (
	ANALogHeaderLen = 16
	ANAGroupDescLen = 32
)

// Append appends the ANA log page to b. With groupsOnly (LSP RGO) the
// namespace lists are left out.
func (l *ANALog) Append(b []byte, groupsOnly bool) []byte {
	le := binary.LittleEndian
	b = le.AppendUint64(b, l.ChangeCount)
	b = le.AppendUint16(b, uint16(len(l.Groups)))
	b = append(b, 0, 0, 0, 0, 0, 0)
	for i := range l.Groups {
		g := &l.Groups[i]
		n := uint32(len(g.NSIDs))
		if groupsOnly {
			n = 0
		}
		b = le.AppendUint32(b, g.GroupID)
		b = le.AppendUint32(b, n)
		b = le.AppendUint64(b, g.ChangeCount)
		b = append(b, uint8(g.State))
		b = append(b, make([]byte, 15)...)
		if !groupsOnly {
			for _, id := range g.NSIDs {
				b = le.AppendUint32(b, id)
			}
		}
	}
	return b
}

// Len returns the encoded size of the log page.
func (l *ANALog) Len(groupsOnly bool) int {
	n := ANALogHeaderLen + ANAGroupDescLen*len(l.Groups)
	if !groupsOnly {
		for i := range l.Groups {
			n += 4 * len(l.Groups[i].NSIDs)
		}
	}
	return n
}

// ParseANALog decodes an ANA log page.
func ParseANALog(b []byte) (ANALog, error) {
	if len(b) < ANALogHeaderLen {
		return ANALog{}, fmt.Errorf("ANA log: have %d bytes, need %d: %w", len(b), ANALogHeaderLen, ErrShort)
	}
	le := binary.LittleEndian
	l := ANALog{ChangeCount: le.Uint64(b)}
	ngrps := int(le.Uint16(b[8:]))
	p := ANALogHeaderLen
	for i := 0; i < ngrps; i++ {
		if p+ANAGroupDescLen > len(b) {
			return l, fmt.Errorf("ANA log: group %d of %d at byte %d past the end (%d bytes): %w", i, ngrps, p, len(b), ErrShort)
		}
		g := ANAGroupDesc{GroupID: le.Uint32(b[p:]), ChangeCount: le.Uint64(b[p+8:]), State: ANAState(b[p+16] & 0xF)}
		n := int(le.Uint32(b[p+4:]))
		p += ANAGroupDescLen
		if n > (len(b)-p)/4 {
			return l, fmt.Errorf("ANA log: group %d lists %d namespaces, only %d bytes left: %w", g.GroupID, n, len(b)-p, ErrShort)
		}
		for j := 0; j < n; j++ {
			g.NSIDs = append(g.NSIDs, le.Uint32(b[p:]))
			p += 4
		}
		l.Groups = append(l.Groups, g)
	}
	return l, nil
}

// Discovery log page constants.
const (
	DiscoveryLogHeaderLen = 1024
	DiscoveryLogEntryLen  = 1024

	TrTypeTCP      uint8 = 3
	AdrFamIPv4     uint8 = 1
	AdrFamIPv6     uint8 = 2
	SubTypeRefDisc uint8 = 1 // referral to another discovery service
	SubTypeNVMe    uint8 = 2
	SubTypeCurDisc uint8 = 3 // the current discovery subsystem

	TReqNotSpecified  uint8 = 0
	TReqRequired      uint8 = 1
	TReqNotRequired   uint8 = 2
	TReqDisableSQFlow uint8 = 4

	TCPSecTypeNone uint8 = 0
)

// DiscoveryEntry is one discovery log page entry.
type DiscoveryEntry struct {
	TrType, AdrFam, SubType, TReq uint8
	PortID                        uint16
	CntlID                        uint16
	ASQSZ                         uint16
	EFlags                        uint16
	TrSvcID                       string // port, e.g. "4420"
	SubNQN                        string
	TrAddr                        string // IP address
	SecType                       uint8  // TSAS byte 0 for TCP
}

// DiscoveryLog is the discovery log page (LID 0x70).
type DiscoveryLog struct {
	GenCtr  uint64
	NumRec  uint64 // records in the whole page (may exceed len(Entries) when parsing a prefix)
	RecFmt  uint16
	Entries []DiscoveryEntry
}

// Append appends the header and every entry to b; NumRec is written as
// len(Entries).
func (l *DiscoveryLog) Append(b []byte) []byte {
	start := len(b)
	b = append(b, make([]byte, DiscoveryLogHeaderLen+DiscoveryLogEntryLen*len(l.Entries))...)
	o := b[start:]
	le := binary.LittleEndian
	le.PutUint64(o[0:], l.GenCtr)
	le.PutUint64(o[8:], uint64(len(l.Entries)))
	le.PutUint16(o[16:], l.RecFmt)
	for i := range l.Entries {
		e := &l.Entries[i]
		p := o[DiscoveryLogHeaderLen+DiscoveryLogEntryLen*i:]
		p[0], p[1], p[2], p[3] = e.TrType, e.AdrFam, e.SubType, e.TReq
		le.PutUint16(p[4:], e.PortID)
		le.PutUint16(p[6:], e.CntlID)
		le.PutUint16(p[8:], e.ASQSZ)
		le.PutUint16(p[10:], e.EFlags)
		copy(p[32:63], e.TrSvcID)
		copy(p[256:256+NQNLen-1], e.SubNQN)
		copy(p[512:767], e.TrAddr)
		p[768] = e.SecType
	}
	return b
}

// ParseDiscoveryLog decodes the header and as many whole entries as b holds
// (a host first reads only the header to learn NUMREC).
func ParseDiscoveryLog(b []byte) (DiscoveryLog, error) {
	if len(b) < 20 {
		return DiscoveryLog{}, fmt.Errorf("discovery log: have %d bytes, need at least 20: %w", len(b), ErrShort)
	}
	le := binary.LittleEndian
	l := DiscoveryLog{GenCtr: le.Uint64(b), NumRec: le.Uint64(b[8:]), RecFmt: le.Uint16(b[16:])}
	for i := uint64(0); i < l.NumRec; i++ {
		off := DiscoveryLogHeaderLen + DiscoveryLogEntryLen*int(i)
		if off+DiscoveryLogEntryLen > len(b) {
			break
		}
		p := b[off:]
		e := DiscoveryEntry{TrType: p[0], AdrFam: p[1], SubType: p[2], TReq: p[3],
			PortID: le.Uint16(p[4:]), CntlID: le.Uint16(p[6:]), ASQSZ: le.Uint16(p[8:]), EFlags: le.Uint16(p[10:]),
			TrSvcID: paddedString(p[32:64]), SubNQN: paddedString(p[256:512]), TrAddr: paddedString(p[512:768]), SecType: p[768]}
		l.Entries = append(l.Entries, e)
	}
	return l, nil
}

// ErrorLogEntryLen is the size of one error information log entry.
const ErrorLogEntryLen = 64

// ErrorLogEntry is one entry of the error information log (LID 0x01).
type ErrorLogEntry struct {
	ErrorCount uint64
	SQID       uint16
	CID        uint16
	Status     Status
	ParamLoc   uint16
	LBA        uint64
	NSID       uint32
	VS         uint8
	TrType     uint8
	CS         uint64
	TrTypeInfo uint16
}

// Append appends the 64-byte entry to b.
func (e *ErrorLogEntry) Append(b []byte) []byte {
	le := binary.LittleEndian
	b = le.AppendUint64(b, e.ErrorCount)
	b = le.AppendUint16(b, e.SQID)
	b = le.AppendUint16(b, e.CID)
	b = le.AppendUint16(b, uint16(e.Status)<<1)
	b = le.AppendUint16(b, e.ParamLoc)
	b = le.AppendUint64(b, e.LBA)
	b = le.AppendUint32(b, e.NSID)
	b = append(b, e.VS, e.TrType, 0, 0)
	b = le.AppendUint64(b, e.CS)
	b = le.AppendUint16(b, e.TrTypeInfo)
	return append(b, make([]byte, 22)...)
}

// ParseErrorLogEntry decodes a 64-byte error log entry.
func ParseErrorLogEntry(b []byte) (ErrorLogEntry, error) {
	if len(b) < ErrorLogEntryLen {
		return ErrorLogEntry{}, fmt.Errorf("error log entry: have %d bytes, need %d: %w", len(b), ErrorLogEntryLen, ErrShort)
	}
	le := binary.LittleEndian
	return ErrorLogEntry{ErrorCount: le.Uint64(b), SQID: le.Uint16(b[8:]), CID: le.Uint16(b[10:]), Status: Status(le.Uint16(b[12:]) >> 1),
		ParamLoc: le.Uint16(b[14:]), LBA: le.Uint64(b[16:]), NSID: le.Uint32(b[24:]), VS: b[28], TrType: b[29],
		CS: le.Uint64(b[32:]), TrTypeInfo: le.Uint16(b[40:])}, nil
}

// SMARTLogLen is the size of the SMART / health information log page.
const SMARTLogLen = 512

// SMARTLog is the SMART / health information log page (LID 0x02). The
// 128-bit counters are held in 64 bits.
type SMARTLog struct {
	CriticalWarning  uint8
	Temperature      uint16 // Kelvin
	AvailSpare       uint8  // percent
	SpareThresh      uint8
	PercentUsed      uint8
	DataUnitsRead    uint64 // thousands of 512-byte units, rounded up
	DataUnitsWritten uint64
	HostReads        uint64 // read commands
	HostWrites       uint64
	CtrlBusyTime     uint64 // minutes
	PowerCycles      uint64
	PowerOnHours     uint64
	UnsafeShutdowns  uint64
	MediaErrors      uint64
	NumErrLogEntries uint64
}

// Append appends the 512-byte page to b.
func (s *SMARTLog) Append(b []byte) []byte {
	start := len(b)
	b = append(b, make([]byte, SMARTLogLen)...)
	o := b[start:]
	le := binary.LittleEndian
	o[0] = s.CriticalWarning
	le.PutUint16(o[1:], s.Temperature)
	o[3], o[4], o[5] = s.AvailSpare, s.SpareThresh, s.PercentUsed
	for i, v := range [...]uint64{s.DataUnitsRead, s.DataUnitsWritten, s.HostReads, s.HostWrites, s.CtrlBusyTime,
		s.PowerCycles, s.PowerOnHours, s.UnsafeShutdowns, s.MediaErrors, s.NumErrLogEntries} {
		le.PutUint64(o[32+16*i:], v)
	}
	return b
}

// ParseSMARTLog decodes the SMART / health log page (low 64 bits of each
// counter).
func ParseSMARTLog(o []byte) (SMARTLog, error) {
	if len(o) < SMARTLogLen {
		return SMARTLog{}, fmt.Errorf("SMART log: have %d bytes, need %d: %w", len(o), SMARTLogLen, ErrShort)
	}
	le := binary.LittleEndian
	c := func(i int) uint64 { return le.Uint64(o[32+16*i:]) }
	return SMARTLog{CriticalWarning: o[0], Temperature: le.Uint16(o[1:]), AvailSpare: o[3], SpareThresh: o[4], PercentUsed: o[5],
		DataUnitsRead: c(0), DataUnitsWritten: c(1), HostReads: c(2), HostWrites: c(3), CtrlBusyTime: c(4),
		PowerCycles: c(5), PowerOnHours: c(6), UnsafeShutdowns: c(7), MediaErrors: c(8), NumErrLogEntries: c(9)}, nil
}

// Reservation notification log page (LID 0x80).
const (
	ResvNotifLogLen = 64

	ResvNotifEmpty         uint8 = 0
	ResvNotifRegPreempted  uint8 = 1
	ResvNotifResvReleased  uint8 = 2
	ResvNotifResvPreempted uint8 = 3

	// AENIOResvLogAvail is the asynchronous event information of an
	// I/O command specific event (AENTypeIOCmdSpec): a reservation
	// notification log page is available.
	AENIOResvLogAvail uint8 = 0x00
)

// ResvNotification is the reservation notification log page.
type ResvNotification struct {
	LogPageCount uint64
	Type         uint8
	NumAvail     uint8 // further pages available
	NSID         uint32
}

// Append appends the 64-byte page to b.
func (r *ResvNotification) Append(b []byte) []byte {
	le := binary.LittleEndian
	b = le.AppendUint64(b, r.LogPageCount)
	b = append(b, r.Type, r.NumAvail, 0, 0)
	b = le.AppendUint32(b, r.NSID)
	return append(b, make([]byte, 48)...)
}

// ParseResvNotification decodes the reservation notification log page.
func ParseResvNotification(b []byte) (ResvNotification, error) {
	if len(b) < ResvNotifLogLen {
		return ResvNotification{}, fmt.Errorf("reservation notification log: have %d bytes, need %d: %w", len(b), ResvNotifLogLen, ErrShort)
	}
	le := binary.LittleEndian
	return ResvNotification{LogPageCount: le.Uint64(b), Type: b[8], NumAvail: b[9], NSID: le.Uint32(b[12:])}, nil
}

// Commands Supported and Effects log page (LID 0x05): one dword per
// admin opcode, then one per I/O opcode.
const (
	CmdEffectsLogLen = 4096

	EffectCSUPP uint32 = 1 << 0 // command supported
	EffectLBCC  uint32 = 1 << 1 // logical block content change
	EffectNCC   uint32 = 1 << 2 // namespace capability change
	EffectNIC   uint32 = 1 << 3 // namespace inventory change
	EffectCCC   uint32 = 1 << 4 // controller capability change
)

// CmdEffectsLog is the commands supported and effects log page.
type CmdEffectsLog struct {
	Admin [256]uint32
	IO    [256]uint32
}

// Append appends the 4096-byte page to b.
func (l *CmdEffectsLog) Append(b []byte) []byte {
	le := binary.LittleEndian
	for _, v := range l.Admin {
		b = le.AppendUint32(b, v)
	}
	for _, v := range l.IO {
		b = le.AppendUint32(b, v)
	}
	return append(b, make([]byte, CmdEffectsLogLen-2048)...)
}
