package nvme

import "fmt"

// Status is the 15-bit NVMe status field of a CQE: SC in bits 7:0, SCT in
// bits 10:8, CRD in 12:11, More in 13, DNR in 14. The constants below carry
// their SCT, so that StatusReservationConflict is 0x083 and
// StatusANAInaccessible 0x302, as in Linux's NVME_SC_* values. A Status is
// an error so that it can travel up a call stack; StatusSuccess must not be
// returned as an error.
type Status uint16

// Status code types.
const (
	SCTGeneric         = 0x0
	SCTCommandSpecific = 0x1
	SCTMedia           = 0x2
	SCTPath            = 0x3
	SCTVendor          = 0x7
)

// Status bits outside SC/SCT.
const (
	StatusMore Status = 0x2000
	StatusDNR  Status = 0x4000 // do not retry
)

// Generic command status (SCT 0).
const (
	StatusSuccess             Status = 0x00
	StatusInvalidOpcode       Status = 0x01
	StatusInvalidField        Status = 0x02
	StatusCIDConflict         Status = 0x03
	StatusDataTransferError   Status = 0x04
	StatusPowerLoss           Status = 0x05
	StatusInternal            Status = 0x06
	StatusAbortRequested      Status = 0x07
	StatusAbortSQDeleted      Status = 0x08
	StatusFusedFail           Status = 0x09
	StatusFusedMissing        Status = 0x0A
	StatusInvalidNS           Status = 0x0B
	StatusCmdSeqError         Status = 0x0C
	StatusSGLInvalidLast      Status = 0x0D
	StatusSGLInvalidCount     Status = 0x0E
	StatusSGLInvalidData      Status = 0x0F
	StatusSGLInvalidMetadata  Status = 0x10
	StatusSGLInvalidType      Status = 0x11
	StatusSGLInvalidOffset    Status = 0x16
	StatusHostIDInconsistent  Status = 0x18
	StatusKeepAliveExpired    Status = 0x19
	StatusKeepAliveInvalid    Status = 0x1A
	StatusPreemptAbort        Status = 0x1B
	StatusSanitizeFailed      Status = 0x1C
	StatusSanitizeInProgress  Status = 0x1D
	StatusNSWriteProtected    Status = 0x20
	StatusCmdInterrupted      Status = 0x21
	StatusTransientTransport  Status = 0x22
	StatusLBARange            Status = 0x80
	StatusCapacityExceeded    Status = 0x81
	StatusNSNotReady          Status = 0x82
	StatusReservationConflict Status = 0x83
	StatusFormatInProgress    Status = 0x84
)

// Command specific status (SCT 1).
const (
	StatusCQInvalid           Status = 0x100
	StatusQIDInvalid          Status = 0x101
	StatusQueueSize           Status = 0x102
	StatusAbortLimit          Status = 0x103
	StatusAsyncLimit          Status = 0x105
	StatusInvalidLogPage      Status = 0x109
	StatusInvalidFormat       Status = 0x10A
	StatusFeatureNotSaveable  Status = 0x10D
	StatusFeatureNotChangable Status = 0x10E
	StatusFeatureNotPerNS     Status = 0x10F
	StatusBadAttributes       Status = 0x180 // DSM: conflicting attributes
	StatusInvalidPI           Status = 0x181
	StatusReadOnly            Status = 0x182 // write to a read-only range
	StatusConnectFormat       Status = 0x180 // Connect: incompatible format
	StatusConnectCtrlBusy     Status = 0x181 // Connect: controller busy
	StatusConnectInvalidParam Status = 0x182 // Connect: invalid parameters
	StatusConnectRestartDisc  Status = 0x183
	StatusConnectInvalidHost  Status = 0x184 // Connect: host not allowed
	StatusDiscoveryRestart    Status = 0x190
	StatusAuthRequired        Status = 0x191
)

// Media and data integrity errors (SCT 2).
const (
	StatusWriteFault     Status = 0x280
	StatusReadError      Status = 0x281
	StatusGuardCheck     Status = 0x282
	StatusAppTagCheck    Status = 0x283
	StatusRefTagCheck    Status = 0x284
	StatusCompareFailed  Status = 0x285
	StatusAccessDenied   Status = 0x286
	StatusUnwrittenBlock Status = 0x287
)

// Path related status (SCT 3).
const (
	StatusInternalPathError Status = 0x300
	StatusANAPersistentLoss Status = 0x301
	StatusANAInaccessible   Status = 0x302
	StatusANATransition     Status = 0x303
	StatusCtrlPathError     Status = 0x360
	StatusHostPathError     Status = 0x370
	StatusHostAbortedCmd    Status = 0x371
)

// SC returns the status code (bits 7:0).
func (s Status) SC() uint8 { return uint8(s) }

// SCT returns the status code type (bits 10:8).
func (s Status) SCT() uint8 { return uint8(s>>8) & 0x7 }

// Code returns SCT and SC together (what the constants above hold),
// without DNR, More and CRD.
func (s Status) Code() Status { return s & 0x7FF }

// DNR reports the Do Not Retry bit.
func (s Status) DNR() bool { return s&StatusDNR != 0 }

// OK reports whether s is a success.
func (s Status) OK() bool { return s.Code() == StatusSuccess }

// IsPathError reports whether s is a path-related status that a multipath
// host retries on another path (ANA inaccessible, transition, ...).
func (s Status) IsPathError() bool { return s.SCT() == SCTPath }

var statusNames = map[Status]string{
	StatusSuccess: "success", StatusInvalidOpcode: "invalid opcode", StatusInvalidField: "invalid field in command",
	StatusCIDConflict: "command ID conflict", StatusDataTransferError: "data transfer error",
	StatusInternal: "internal error", StatusAbortRequested: "command abort requested", StatusAbortSQDeleted: "aborted: SQ deleted",
	StatusInvalidNS: "invalid namespace or format", StatusCmdSeqError: "command sequence error",
	StatusSGLInvalidData: "data SGL length invalid", StatusSGLInvalidType: "SGL descriptor type invalid",
	StatusSGLInvalidOffset: "SGL offset invalid", StatusHostIDInconsistent: "host identifier inconsistent format",
	StatusKeepAliveExpired: "keep alive timer expired", StatusKeepAliveInvalid: "keep alive timeout invalid",
	StatusPreemptAbort: "command aborted due to preempt and abort", StatusTransientTransport: "transient transport error",
	StatusLBARange: "LBA out of range", StatusCapacityExceeded: "capacity exceeded", StatusNSNotReady: "namespace not ready",
	StatusReservationConflict: "reservation conflict",
	StatusQIDInvalid:          "invalid queue identifier", StatusQueueSize: "invalid queue size", StatusAsyncLimit: "asynchronous event request limit exceeded",
	StatusInvalidLogPage: "invalid log page", StatusFeatureNotSaveable: "feature not saveable", StatusFeatureNotChangable: "feature not changeable",
	StatusConnectFormat: "connect: incompatible format / conflicting attributes", StatusConnectCtrlBusy: "connect: controller busy",
	StatusConnectInvalidParam: "connect: invalid parameters", StatusConnectRestartDisc: "connect: restart discovery",
	StatusConnectInvalidHost: "connect: invalid host", StatusDiscoveryRestart: "discovery restart", StatusAuthRequired: "authentication required",
	StatusWriteFault: "write fault", StatusReadError: "unrecovered read error", StatusCompareFailed: "compare failure",
	StatusAccessDenied: "access denied", StatusUnwrittenBlock: "deallocated or unwritten logical block",
	StatusInternalPathError: "internal path error", StatusANAPersistentLoss: "ANA persistent loss",
	StatusANAInaccessible: "ANA inaccessible", StatusANATransition: "ANA transition",
	StatusCtrlPathError: "controller pathing error", StatusHostPathError: "host pathing error", StatusHostAbortedCmd: "command aborted by host",
}

// String names the status, e.g. "reservation conflict (sct 0x0 sc 0x83, dnr)".
func (s Status) String() string {
	name, ok := statusNames[s.Code()]
	if !ok {
		name = "status"
	}
	dnr := ""
	if s.DNR() {
		dnr = ", dnr"
	}
	return fmt.Sprintf("%s (sct %#x sc %#x%s)", name, s.SCT(), s.SC(), dnr)
}

// Error implements error.
func (s Status) Error() string { return "nvme: " + s.String() }
