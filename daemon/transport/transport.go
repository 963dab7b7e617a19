package transport

import (
	"context"
	"errors"
	"time"

	"tier0/daemon/nvme"
)

// ErrQueueLost is the failure of one queue's connection: a command's Start
// or Wait error wraps it when the queue failed before the command
// completed. The queue is then dead (Done is closed); the host ends the
// association and reconnects.
var ErrQueueLost = errors.New("NVMe-oF queue connection lost")

// Command is one command for Queue.Start. The queue sets the SQE's CID and
// data pointer (DPTR, SGL flags) itself.
type Command struct {
	SQE   nvme.SQE
	Write []byte // host-to-controller data; read by the queue until Wait returns
	Read  []byte // controller-to-host data destination; written until Wait returns
	// NoTimeout exempts the command from Oldest (the Asynchronous Event
	// Request, which stays outstanding until an event).
	NoTimeout bool
	// InCapsule asks for the write data in the command capsule whatever
	// the queue's in-capsule limit (NVMe/TCP carries the Fabrics Connect
	// data so); a transport that moves all data otherwise (RDMA: keyed
	// SGL, as Linux sends Connect) ignores it.
	InCapsule bool
}

// Queue is one connected queue of an association: the admin queue (QID 0)
// or an I/O queue. Its contract:
//
//   - Start and Wait may be called from many goroutines at once; up to
//     Depth commands are in flight, and Start blocks for a free slot when
//     all are taken. The tag Start returns is given to Wait exactly once.
//   - The caller's Write and Read buffers belong to the queue from Start
//     until Wait returns, also when Wait returns an error: a queue that
//     failed returns from Wait only once nothing (no reader, no RDMA
//     completion) can touch them any more.
//   - Wait returns the completion's CQE; a non-zero NVMe status is not an
//     error. An error from Start or Wait wraps ErrQueueLost: the queue
//     failed and is dead. (Start may also refuse a command whose data
//     exceed Params.MaxData without failing the queue.)
//   - flush false lets Start leave the command buffered until a later
//     Start with flush true (a batch); transports without buffering ignore
//     it.
//   - Fail tears the queue down (idempotent): commands in flight fail,
//     Done is closed and Err returns the first error given or met.
//   - Oldest returns how long the oldest command in flight has waited
//     (commands with NoTimeout not counted), 0 when none: the host's
//     supervisor enforces its I/O timeout with it.
type Queue interface {
	Start(c Command, flush bool) (tag uint16, err error)
	Wait(tag uint16) (nvme.CQE, error)
	Oldest(now time.Time) time.Duration
	Fail(err error)
	Done() <-chan struct{}
	Err() error
	QID() uint16
	Depth() int
}

// Params describe the queue to dial.
type Params struct {
	QID uint16
	// SQSize is the 0's based submission queue size the host will give
	// in the Fabrics Connect command (NVMe/RDMA repeats it in the connect
	// private data, HSQSIZE).
	SQSize uint16
	// Depth is the number of commands the host keeps in flight at most.
	Depth int
	// MaxData is the largest data of one command (RDMA registers Depth
	// buffers of this size per queue).
	MaxData int
	// InlineMax is the most write data the controller takes in a command
	// capsule (I/O queues: from Identify Controller IOCCSZ).
	InlineMax int
}

// Transport connects queues to a controller's address.
type Transport interface {
	// DialQueue connects one queue to addr (the transport's address
	// syntax, HOST:PORT for both), ready for the Fabrics Connect.
	DialQueue(ctx context.Context, addr string, p Params) (Queue, error)
	// Name is the transport's name in logs and errors ("tcp", "rdma").
	Name() string
	// MaxData is the most data one command may carry on this transport
	// (0: no limit of its own); the host splits larger I/O.
	MaxData() int
}
