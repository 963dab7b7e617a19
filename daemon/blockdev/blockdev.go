// Package blockdev defines the block device interface that every layer of
// tier0 stacks on: local drives, NVMe/TCP namespaces imported from other
// nodes, RAID arrays, and the in-memory, fault-injecting and recording devices
// used by tests.
//
// # Contract
//
// Addressing is in bytes. Every offset and every length passed to ReadAt,
// WriteAt, WriteZeroes and Discard must be a multiple of BlockSize();
// otherwise the call fails with an error wrapping ErrMisaligned and touches
// nothing. A range that does not lie entirely inside [0, Size()) fails with
// ErrOutOfRange and touches nothing. A zero-length request succeeds.
//
// Buffers belong to the caller. A device never keeps p after the call
// returns, and never writes into p on WriteAt. Devices opened with O_DIRECT
// (package local) may copy through an aligned bounce buffer when p is not
// page-aligned; callers on the hot path should pass buffers from
// AlignedBuffer to avoid the copy.
//
// Concurrency: all methods may be called from many goroutines at once.
// Concurrent writes to overlapping ranges have no defined order; callers that
// need an order (the RAID stripe lock does) must serialize them.
//
// Durability: a completed WriteAt may sit in a volatile cache. Flush returns
// once every write that completed before Flush was called is on stable
// storage. A device that implements FUAWriter can make a single write durable
// without a full flush.
//
// Errors: ReadAt and WriteAt return n < len(p) only together with a non-nil
// error. Errors wrap one of the sentinels below so that callers can test
// them with errors.Is; anything else is an unclassified failure of the
// medium or transport and should be treated like ErrIO.
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
