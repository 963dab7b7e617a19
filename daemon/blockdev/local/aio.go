package local

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux native AIO (io_setup/io_submit/io_getevents), used for O_DIRECT
// reads and writes: the caller's goroutine submits without a blocking
// system call and parks on a channel; one reaper goroutine collects
// completions in batches. Compared with one blocking pread per request this
// saves an OS thread switch per request, which is what lets 4 KiB random
// I/O keep up with fio.

// iocb is struct iocb from <linux/aio_abi.h> (little-endian layout).
type iocb struct {
	data    uint64
	_       uint32 // aio_key
	rwFlags uint32
	opcode  uint16
	_       int16 // aio_reqprio
	fildes  uint32
	buf     uint64
	nbytes  uint64
	offset  int64
	_       uint64 // aio_reserved2
	_       uint32 // aio_flags
	_       uint32 // aio_resfd
}

// ioEvent is struct io_event.
type ioEvent struct {
	data uint64
	obj  uint64
	res  int64
	res2 int64
}

const (
	iocbCmdPread  = 0
	iocbCmdPwrite = 1
)

// wakeBuf is the (unused) buffer of the zero-length wake-up read.
var wakeBuf = make([]byte, 1)

type aioSlot struct {
	cb iocb
	// buf is the request's buffer while the kernel owns it. Storing it
	// here keeps it reachable and, because the slot is on the heap, makes
	// the compiler place every buffer passed to do on the heap too: a
	// buffer on a goroutine stack could be moved (stack shrinking during
	// GC) while the kernel still writes to its old address.
	buf  []byte
	done chan int64 // the result: bytes or -errno
}

// aioRing is one AIO context with a fixed number of request slots.
type aioRing struct {
	ctx    uintptr
	slots  []aioSlot
	free   chan int // indexes of free slots; also bounds requests in flight
	stop   atomic.Bool
	reaped sync.WaitGroup
}

func newAIORing(depth int) (*aioRing, error) {
	r := &aioRing{slots: make([]aioSlot, depth), free: make(chan int, depth)}
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, uintptr(depth), uintptr(unsafe.Pointer(&r.ctx)), 0); e != 0 {
		return nil, fmt.Errorf("io_setup(%d): %w", depth, e)
	}
	for i := range r.slots {
		r.slots[i].done = make(chan int64, 1)
		r.free <- i
	}
	r.reaped.Add(1)
	go r.reap(depth)
	return r, nil
}

// reap delivers completions until close. close wakes it with a
// zero-length read; it also wakes every 200 ms to check for close, in case
// that read could not be submitted.
func (r *aioRing) reap(depth int) {
	defer r.reaped.Done()
	events := make([]ioEvent, depth)
	ts := unix.Timespec{Nsec: 200e6}
	for !r.stop.Load() {
		n, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, r.ctx, 1, uintptr(len(events)),
			uintptr(unsafe.Pointer(&events[0])), uintptr(unsafe.Pointer(&ts)), 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			// Cannot happen with a valid context; fail loudly rather
			// than leave requests waiting forever.
			panic(fmt.Sprintf("local: io_getevents: %v", e))
		}
		for _, ev := range events[:n] {
			if ev.data < uint64(len(r.slots)) {
				r.slots[ev.data].done <- ev.res
			}
		}
	}
}

// do runs one request and returns the bytes moved or the errno.
func (r *aioRing) do(fd int, write bool, p []byte, off int64, rwFlags uint32) (int, error) {
	i := <-r.free
	defer func() { r.free <- i }()
	s := &r.slots[i]
	s.buf = p
	defer func() { s.buf = nil }()
	s.cb = iocb{
		data:    uint64(i),
		rwFlags: rwFlags,
		opcode:  iocbCmdPread,
		fildes:  uint32(fd),
		buf:     uint64(uintptr(unsafe.Pointer(&p[0]))),
		nbytes:  uint64(len(p)),
		offset:  off,
	}
	if write {
		s.cb.opcode = iocbCmdPwrite
	}
	cbp := &s.cb
	for {
		n, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, r.ctx, 1, uintptr(unsafe.Pointer(&cbp)))
		if e == unix.EINTR {
			continue
		}
		if e == unix.EAGAIN {
			// The kernel is out of AIO resources for a moment.
			time.Sleep(50 * time.Microsecond)
			continue
		}
		if e != 0 {
			return 0, e
		}
		if n != 1 {
			return 0, fmt.Errorf("io_submit accepted %d of 1 requests", n)
		}
		break
	}
	res := <-s.done
	if res < 0 {
		return 0, unix.Errno(-res)
	}
	return int(res), nil
}

// close stops the reaper and destroys the context; no request may be in
// flight. fd is an open file descriptor to aim the wake-up read at.
func (r *aioRing) close(fd int) error {
	r.stop.Store(true)
	cb := &iocb{
		data:   uint64(len(r.slots)),
		opcode: iocbCmdPread,
		fildes: uint32(fd),
		buf:    uint64(uintptr(unsafe.Pointer(&wakeBuf[0]))),
	}
	unix.Syscall(unix.SYS_IO_SUBMIT, r.ctx, 1, uintptr(unsafe.Pointer(&cb)))
	r.reaped.Wait()
	if _, _, e := unix.Syscall(unix.SYS_IO_DESTROY, r.ctx, 0, 0); e != 0 {
		return fmt.Errorf("io_destroy: %w", e)
	}
	return nil
}
