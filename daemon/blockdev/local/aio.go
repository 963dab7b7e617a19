package local

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux native AIO (io_setup/io_submit/io_getevents), used for O_DIRECT
// reads and writes: the caller's goroutine queues its iocb and parks on a
// channel; one reaper goroutine collects completions in batches. Compared
// with one blocking pread per request this saves an OS thread switch per
// request, which is what lets 4 KiB random I/O keep up with fio.
//
// Submissions are batched by combining: a caller that finds no
// submission in progress becomes the submitter and keeps passing
// everything queued meanwhile to io_submit, several iocbs per call, until
// the queue is empty; a caller that finds one in progress only queues its
// iocb. Under concurrency that is one io_submit per batch instead of one
// per request, without a submission goroutine (no extra hand-off) and
// without delaying a lone request.

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

	smu        sync.Mutex
	pending    []*iocb // queued, not yet submitted
	batch      []*iocb // the submitter's batch (swapped with pending)
	submitting bool    // a caller is submitting; others only queue
	yieldFirst bool    // the submitter yields once before its first batch

	// Counters (and a test hook) for the batching.
	queued      atomic.Int64 // iocbs queued for submission
	submitCalls atomic.Int64 // io_submit calls
	reapCalls   atomic.Int64 // io_getevents calls that returned events
	reapedN     atomic.Int64 // events reaped
	// beforeSubmit, when set, is called by the submitter with each batch
	// just before io_submit (tests use it to hold a batch open).
	beforeSubmit func(batch []*iocb)
}

func newAIORing(depth int) (*aioRing, error) {
	r := &aioRing{slots: make([]aioSlot, depth), free: make(chan int, depth),
		pending: make([]*iocb, 0, depth), batch: make([]*iocb, 0, depth), yieldFirst: true}
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
		if n > 0 {
			r.reapCalls.Add(1)
			r.reapedN.Add(int64(n))
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
	r.enqueue(&s.cb)
	res := <-s.done
	if res < 0 {
		return 0, unix.Errno(-res)
	}
	return int(res), nil
}

// enqueue queues cb for submission and, when no other caller is
// submitting, submits everything queued until the queue is empty. The
// outcome of cb arrives on its slot's done channel either way: from the
// reaper, or from the submitter when io_submit refused it.
func (r *aioRing) enqueue(cb *iocb) {
	r.queued.Add(1)
	r.smu.Lock()
	r.pending = append(r.pending, cb)
	if r.submitting {
		r.smu.Unlock()
		return
	}
	r.submitting = true
	if r.yieldFirst {
		// Let the goroutines that are runnable now (typically the ones
		// the reaper just woke, each about to issue its next request)
		// queue theirs, so that they go in this batch.
		r.smu.Unlock()
		runtime.Gosched()
		r.smu.Lock()
	}
	for len(r.pending) > 0 {
		r.batch, r.pending = r.pending, r.batch[:0]
		b := r.batch
		r.smu.Unlock()
		r.submit(b)
		r.smu.Lock()
	}
	r.submitting = false
	r.smu.Unlock()
}

// submit passes batch to io_submit, as many per call as the kernel
// takes. An iocb the kernel refuses (io_submit takes the ones before it
// and fails on it when it comes first) completes alone with the error;
// the rest of the batch is still submitted.
func (r *aioRing) submit(batch []*iocb) {
	for len(batch) > 0 {
		if r.beforeSubmit != nil {
			r.beforeSubmit(batch)
		}
		n, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, r.ctx, uintptr(len(batch)), uintptr(unsafe.Pointer(&batch[0])))
		r.submitCalls.Add(1)
		switch {
		case e == unix.EINTR:
		case e == unix.EAGAIN:
			// The kernel is out of AIO resources for a moment.
			time.Sleep(50 * time.Microsecond)
		case e != 0:
			r.slots[batch[0].data].done <- -int64(e)
			batch = batch[1:]
		default:
			batch = batch[n:]
		}
	}
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
