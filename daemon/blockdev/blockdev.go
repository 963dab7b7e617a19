package blockdev

import (
	"errors"
	"fmt"
)

// Device is a random-access block device. See the package documentation for
// the contract.
type Device interface {
	// ReadAt reads len(p) bytes starting at byte offset off.
	ReadAt(p []byte, off int64) (n int, err error)
	// WriteAt writes len(p) bytes starting at byte offset off.
	WriteAt(p []byte, off int64) (n int, err error)
	// Flush makes every completed write durable.
	Flush() error
	// WriteZeroes makes [off, off+length) read back as zeroes.
	WriteZeroes(off, length int64) error
	// Discard tells the device that [off, off+length) is no longer in use
	// (TRIM / deallocate). Afterwards the range reads back as zeroes.
	Discard(off, length int64) error
	// Size is the capacity in bytes; a multiple of BlockSize.
	Size() int64
	// BlockSize is the logical block size in bytes (512 or 4096).
	BlockSize() int
	// Close releases the device. Calls after Close fail with ErrClosed.
	Close() error
}

// FUAWriter is implemented by devices that can make one write durable on its
// own (NVMe Force Unit Access) without flushing everything else.
type FUAWriter interface {
	WriteAtFUA(p []byte, off int64) (n int, err error)
}

// Lender is implemented by devices held in memory that can lend their own
// memory for a read instead of copying it (the NVMe/TCP target writes a
// lent read's data to its socket straight from the device). LendAt
// appends to iov slices of the device's memory that hold the length bytes
// at off (a multiple of the block size, like ReadAt) and returns the loan
// that holds them: until Loan.Return they keep exactly the bytes a ReadAt
// at the time of the call would have returned — one state of the range
// between whole writes — whatever is written meanwhile. Writes never wait
// for a loan (the device writes elsewhere, copy on write), so a reader
// that is slow to return one costs memory, never a writer's time. A
// Lender's requests wait for nothing but the CPU (no medium, no lock held
// across I/O): the NVMe/TCP target relies on it to run a write to one
// from its connection's read buffer, never handing it to another
// goroutine.
type Lender interface {
	LendAt(iov [][]byte, off, length int64) (Loan, [][]byte, error)
}

// Loan is a read's hold on a Lender's memory. Return ends it, once; the
// lent slices must not be used afterwards.
type Loan interface {
	Return()
}

// Sentinel errors. Wrap them with fmt.Errorf("...: %w", ErrX) and add the
// values involved.
var (
	// ErrMisaligned: an offset or length is not a multiple of the block size.
	ErrMisaligned = errors.New("request not aligned to the logical block size")
	// ErrOutOfRange: the request extends past the end of the device.
	ErrOutOfRange = errors.New("request out of range")
	// ErrClosed: the device was closed.
	ErrClosed = errors.New("device closed")
	// ErrIO: the medium or the transport failed the request (retryable at
	// the caller's discretion, e.g. on another path or member).
	ErrIO = errors.New("I/O error")
	// ErrTimeout: the request did not complete in time; its effect on the
	// medium is unknown.
	ErrTimeout = errors.New("I/O timeout")
	// ErrFenced: the device refused the request because this node no longer
	// holds the right to write it (an NVMe reservation conflict or a lost
	// ownership lease). Never retry a fenced write on another path.
	ErrFenced = errors.New("fenced: this node no longer owns the device")
	// ErrNoPath: no usable path to the device exists right now (multipath
	// with every path inaccessible past the hold timeout).
	ErrNoPath = errors.New("no usable path")
)

// CheckRange validates a request of length bytes at off against a device
// of the given size and block size, returning an error that names the
// values and wraps ErrMisaligned or ErrOutOfRange.
func CheckRange(off, length, size int64, blockSize int) error {
	bs := int64(blockSize)
	if off < 0 || length < 0 {
		return fmt.Errorf("offset %d length %d: negative values are not allowed: %w", off, length, ErrOutOfRange)
	}
	if off%bs != 0 || length%bs != 0 {
		return fmt.Errorf("offset %d length %d: both must be multiples of the %d-byte block size: %w", off, length, blockSize, ErrMisaligned)
	}
	if off > size || length > size-off {
		return fmt.Errorf("offset %d length %d: ends at byte %d, past the device end at %d: %w", off, length, off+length, size, ErrOutOfRange)
	}
	return nil
}
