package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrNotBuilt is returned by every entry point of a binary built without
// the rdma build tag.
var ErrNotBuilt = errors.New("tier0 was built without RDMA support (build with -tags rdma and rdma-core's libibverbs-dev/librdmacm-dev)")

// ErrNoDevice: rdma-core found no RDMA device on this machine (the error
// returned wraps it and says what is missing).
var ErrNoDevice = errors.New("no RDMA device")

// softRoCEHint says how to get a device without RDMA hardware.
const softRoCEHint = "load rdma_rxe and add a link: rdma link add rxe0 type rxe netdev eth0"

// ErrDisconnected: the peer (or the device) closed the connection; a
// completion handler sees it wrapped in Completion.Err.
var ErrDisconnected = errors.New("rdma: the connection was closed by the peer or the device")

// ErrClosed: the connection was closed.
var ErrClosed = errors.New("rdma: connection closed")

// PrivateDataLen is the size of the NVMe/RDMA connect private data.
const PrivateDataLen = 32

// PrivateData is the NVMe/RDMA RDMA_CM connect request private data
// (NVMe over Fabrics, RDMA transport binding).
type PrivateData struct {
	RecFmt  uint16 // record format, 0
	QID     uint16 // 0: admin queue
	HRQSize uint16 // host receive queue size (response capsules the host can take)
	HSQSize uint16 // host send queue size, 0's based (the Connect command's SQSIZE)
	CntlID  uint16 // controller ID on I/O queues (NVMe/RDMA 1.1), 0 otherwise
}

// Append appends the 32-byte encoding of p.
func (p PrivateData) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, p.RecFmt)
	b = binary.LittleEndian.AppendUint16(b, p.QID)
	b = binary.LittleEndian.AppendUint16(b, p.HRQSize)
	b = binary.LittleEndian.AppendUint16(b, p.HSQSize)
	b = binary.LittleEndian.AppendUint16(b, p.CntlID)
	return append(b, make([]byte, PrivateDataLen-10)...)
}

// ParsePrivateData decodes connect request private data.
func ParsePrivateData(b []byte) (PrivateData, error) {
	if len(b) < PrivateDataLen {
		return PrivateData{}, fmt.Errorf("NVMe/RDMA connect private data is %d bytes, want %d", len(b), PrivateDataLen)
	}
	le := binary.LittleEndian
	p := PrivateData{RecFmt: le.Uint16(b), QID: le.Uint16(b[2:]), HRQSize: le.Uint16(b[4:]), HSQSize: le.Uint16(b[6:]), CntlID: le.Uint16(b[8:])}
	if p.RecFmt != 0 {
		return p, fmt.Errorf("NVMe/RDMA connect private data: record format %d, want 0", p.RecFmt)
	}
	return p, nil
}

// AcceptData is the private data of an accepted NVMe/RDMA connection.
type AcceptData struct {
	RecFmt  uint16
	CRQSize uint16 // controller receive queue size
}

// Append appends the 32-byte encoding of a.
func (a AcceptData) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, a.RecFmt)
	b = binary.LittleEndian.AppendUint16(b, a.CRQSize)
	return append(b, make([]byte, PrivateDataLen-4)...)
}

// RejectData is the private data of a rejected NVMe/RDMA connection.
type RejectData struct {
	RecFmt uint16
	Status uint16 // one of the Reject* codes
}

// Append appends the encoding of r.
func (r RejectData) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, r.RecFmt)
	return binary.LittleEndian.AppendUint16(b, r.Status)
}

// NVMe/RDMA connect reject status codes.
const (
	RejectInvalidPrivateDataLen uint16 = 1
	RejectInvalidRecFmt         uint16 = 2
	RejectInvalidQID            uint16 = 3
	RejectInvalidHSQSize        uint16 = 4
	RejectInvalidHRQSize        uint16 = 5
	RejectNoResources           uint16 = 6
	RejectInvalidIRD            uint16 = 7
	RejectInvalidORD            uint16 = 8
	RejectInvalidCntlID         uint16 = 9
)

// RejectReason names an NVMe/RDMA reject status.
func RejectReason(s uint16) string {
	switch s {
	case RejectInvalidPrivateDataLen:
		return "invalid private data length"
	case RejectInvalidRecFmt:
		return "invalid record format"
	case RejectInvalidQID:
		return "invalid queue ID"
	case RejectInvalidHSQSize:
		return "invalid host send queue size (HSQSIZE)"
	case RejectInvalidHRQSize:
		return "invalid host receive queue size (HRQSIZE)"
	case RejectNoResources:
		return "no resources"
	case RejectInvalidIRD:
		return "invalid IRD"
	case RejectInvalidORD:
		return "invalid ORD"
	case RejectInvalidCntlID:
		return "invalid controller ID"
	}
	return fmt.Sprintf("unknown NVMe/RDMA reject status %d", s)
}

// Op is the kind of a work completion.
type Op uint8

const (
	OpRecv      Op = 1 // a message arrived in a receive slot
	OpSend      Op = 2 // a SEND from a slot completed (its buffer is free)
	OpRDMARead  Op = 3 // an RDMA READ into a data slot completed
	OpRDMAWrite Op = 4 // an RDMA WRITE from a data slot completed
)

func (o Op) String() string {
	switch o {
	case OpRecv:
		return "RECV"
	case OpSend:
		return "SEND"
	case OpRDMARead:
		return "RDMA READ"
	case OpRDMAWrite:
		return "RDMA WRITE"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Completion is one work completion, given to Config.Handler on the
// queue's completion goroutine.
type Completion struct {
	Op   Op
	Slot int
	// Data is the received message (OpRecv); valid only during the
	// handler call: the receive buffer is posted again when it returns.
	Data []byte
	// Err is non-nil for a failed work request (the queue pair is then in
	// the error state and every later completion fails too).
	Err error
}

// Config sizes one queue's registered memory and names its completion
// handler.
type Config struct {
	// Depth is the number of slots: receive buffers posted, send buffers
	// and data buffers (one of each per slot).
	Depth int
	// RecvSize and SendSize are each slot's receive and send buffer sizes
	// (a host receives 16-byte CQEs and sends 64-byte SQEs; a target the
	// reverse, plus any in-capsule data it accepts).
	RecvSize, SendSize int
	// DataSize is each data buffer's size (the largest transfer of one
	// command).
	DataSize int
	// DataSlots is the number of data buffers (default Depth): a target
	// holds one per command moving data, not one per capsule it can
	// receive, and its RDMA READ/WRITE use data slots 0..DataSlots-1.
	DataSlots int
	// Handler receives every completion, on the queue's one completion
	// goroutine; it must not block.
	Handler func(Completion)
}

func (c *Config) check() error {
	if c.Depth < 1 || c.Depth > 4096 {
		return fmt.Errorf("rdma: queue depth %d, want 1..4096", c.Depth)
	}
	if c.RecvSize < 16 || c.SendSize < 16 || c.DataSize < 0 {
		return fmt.Errorf("rdma: buffer sizes recv %d send %d data %d: recv and send need at least 16 bytes", c.RecvSize, c.SendSize, c.DataSize)
	}
	if c.DataSlots < 0 || c.DataSlots > c.Depth {
		return fmt.Errorf("rdma: %d data slots for a queue of depth %d, want 0..depth", c.DataSlots, c.Depth)
	}
	if c.Handler == nil {
		return errors.New("rdma: Config.Handler is nil; a queue needs a completion handler")
	}
	return nil
}

// layout returns the offsets of the three areas in the queue's one
// registered region and its total size (page rounded).
func (c *Config) layout() (recvOff, sendOff, dataOff, total int) {
	recvOff = 0
	sendOff = align(c.Depth*c.RecvSize, 64)
	dataOff = align(sendOff+c.Depth*c.SendSize, 4096)
	total = align(dataOff+c.dataSlots()*c.DataSize, 4096)
	return
}

func (c *Config) dataSlots() int {
	if c.DataSlots > 0 {
		return c.DataSlots
	}
	return c.Depth
}

func align(n, a int) int { return (n + a - 1) / a * a }
