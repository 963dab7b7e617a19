package rdma

// What a Namespace needs to be an array member of a tier0 node
// (daemon/node's Member): FUA writes (host.go), reservations, and errors
// that tell a lost queue (the member is unreachable: resynced when it
// returns) from an NVMe status of its drive (the member failed) and a
// reservation conflict (fenced).

import (
	"errors"
	"fmt"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// ErrQueueLost is the failure of a queue's transport: a failed work
// request, a disconnect (the target's port or controller went away), a
// command not answered in time, a malformed response. It wraps
// transport.ErrQueueLost. The queue is unusable afterwards: the
// Controller of Connect does not reconnect (its user opens a new
// association), daemon/host's over Transport does.
var ErrQueueLost = fmt.Errorf("NVMe/RDMA queue lost: %w", transport.ErrQueueLost)

// StatusError is a command that completed with a non-zero NVMe status.
// Like daemon/host's, it maps onto the blockdev sentinels: a reservation
// conflict or a preempt-and-abort is ErrFenced, LBA out of range is
// ErrOutOfRange, any other status ErrIO.
type StatusError struct {
	Opcode uint8
	Status nvme.Status
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: NVMe status %#x (%v)", opName(e.Opcode), uint16(e.Status.Code()), e.Status)
}

func (e *StatusError) Unwrap() error { return e.Status }

func (e *StatusError) Is(target error) bool {
	fenced := e.Status.Code() == nvme.StatusReservationConflict || e.Status.Code() == nvme.StatusPreemptAbort
	switch target {
	case blockdev.ErrFenced:
		return fenced
	case blockdev.ErrOutOfRange:
		return e.Status.Code() == nvme.StatusLBARange || e.Status.Code() == nvme.StatusCapacityExceeded
	case blockdev.ErrIO:
		return !fenced
	}
	return false
}

// IsPathError reports whether err is an NVMe path status (ANA
// inaccessible, transition, persistent loss) or a lost queue: the target
// or the way to it is down, not the drive.
func IsPathError(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status.IsPathError()
	}
	return errors.Is(err, ErrQueueLost)
}

// NSID is the namespace ID.
func (n *Namespace) NSID() uint32 { return n.nsid }

// Incarnation is the boot incarnation of the target's node that Identify
// Controller reported at Connect (nvme.IncarnationOff; raid.Incarnated),
// 0 when the target reports none. An RDMA controller does not reconnect
// (a lost queue fails the member, and the owner's re-add connects again),
// so a connection never outlives the incarnation it was made to.
func (n *Namespace) Incarnation() uint64 { return n.c.id.Incarnation }

// resv runs a reservation command on an I/O queue.
func (n *Namespace) resv(op string, opc uint8, cdw10 uint32, data []byte) error {
	if n.closed.Load() || n.c.closed.Load() {
		return fmt.Errorf("rdma: %s (namespace %d): %w", op, n.nsid, blockdev.ErrClosed)
	}
	s := nvme.SQE{Opcode: opc, Flags: nvme.SQEFlagSGLMeta, NSID: n.nsid, CDW10: cdw10}
	if err := n.c.ioQueue().run(s, data, true); err != nil {
		return fmt.Errorf("rdma: %s (namespace %d): %w", op, n.nsid, err)
	}
	return nil
}

// Register registers key for this host (nvme.ResvRegister with current 0
// and new key; nvme.ResvReplace replaces crkey by nrkey;
// nvme.ResvUnregister removes crkey). iekey ignores the existing key.
func (n *Namespace) Register(action uint8, crkey, nrkey uint64, iekey bool) error {
	return n.resv("reservation register", nvme.CmdResvRegister, nvme.ResvCmd{Action: action, IEKey: iekey}.CDW10(),
		nvme.ResvKeys{CRKey: crkey, Key2: nrkey}.Append(make([]byte, 0, 16)))
}

// Acquire acquires a reservation of type t with key crkey; action
// nvme.ResvPreempt or nvme.ResvPreemptAndAbort preempts the holder of prkey.
func (n *Namespace) Acquire(action uint8, t nvme.ResvType, crkey, prkey uint64) error {
	return n.resv("reservation acquire", nvme.CmdResvAcquire, nvme.ResvCmd{Action: action, Type: t}.CDW10(),
		nvme.ResvKeys{CRKey: crkey, Key2: prkey}.Append(make([]byte, 0, 16)))
}

// Release releases (nvme.ResvRelease) or clears (nvme.ResvClear) the
// reservation of type t held with crkey.
func (n *Namespace) Release(action uint8, t nvme.ResvType, crkey uint64) error {
	return n.resv("reservation release", nvme.CmdResvRelease, nvme.ResvCmd{Action: action, Type: t}.CDW10(),
		nvme.ResvKeys{CRKey: crkey}.Append(make([]byte, 0, 16)))
}

// Report returns the reservation status (extended format).
func (n *Namespace) Report() (nvme.ResvStatus, error) {
	if n.closed.Load() || n.c.closed.Load() {
		return nvme.ResvStatus{}, fmt.Errorf("rdma: reservation report (namespace %d): %w", n.nsid, blockdev.ErrClosed)
	}
	buf := make([]byte, 4096)
	s := nvme.SQE{Opcode: nvme.CmdResvReport, Flags: nvme.SQEFlagSGLMeta, NSID: n.nsid, CDW10: uint32(len(buf)/4 - 1), CDW11: nvme.ResvReportEDS}
	if err := n.c.ioQueue().run(s, buf, false); err != nil {
		return nvme.ResvStatus{}, fmt.Errorf("rdma: reservation report (namespace %d): %w", n.nsid, err)
	}
	return nvme.ParseResvStatus(buf)
}
