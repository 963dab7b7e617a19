package host

import (
	"errors"
	"fmt"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// StatusError is a command that completed with a non-zero NVMe status.
type StatusError struct {
	Op     string
	Status nvme.Status
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s: NVMe status %#x (%v)", e.Op, uint16(e.Status.Code()), e.Status)
}

// Is maps NVMe statuses onto the blockdev sentinels: a reservation conflict
// and a command aborted because another host preempted-and-aborted us are
// ErrFenced; LBA out of range is ErrOutOfRange; every other status is ErrIO.
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

// IsPathError reports whether err is an NVMe path status (ANA inaccessible,
// transition, persistent loss) or a lost connection: errors that a
// multipath host retries on another path.
func IsPathError(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status.IsPathError()
	}
	return errors.Is(err, errConnLost) || errors.Is(err, errCtrlDown)
}

var (
	errCtrlDown = errors.New("controller not connected")
	errClosed   = fmt.Errorf("controller closed: %w", blockdev.ErrClosed)
)

// lostError is the error of a modifying command that was sent on an
// association that was then lost: the controller may still execute it
// until the association is quiesced, so it must not be sent anywhere else
// before (Multipath waits with wait).
type lostError struct {
	err error
	c   *Controller
	a   *assoc
}

func (e *lostError) Error() string { return e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

func (e *lostError) wait(cancel <-chan struct{}) error { return e.c.waitQuiesced(e.a, cancel) }

func ioErrKind(err error) error {
	switch {
	case errors.Is(err, blockdev.ErrClosed):
		return blockdev.ErrClosed
	case errors.Is(err, blockdev.ErrTimeout):
		return blockdev.ErrTimeout
	}
	return blockdev.ErrIO
}
