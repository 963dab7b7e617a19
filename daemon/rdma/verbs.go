//go:build rdma && linux && cgo

package rdma

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include "verbs.h"
*/
import "C"

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Built reports whether this binary has the RDMA transport.
const Built = true

const defaultTimeout = 5 * time.Second

// Conn is one connected queue pair with its completion queue and its one
// registered memory region.
type Conn struct {
	q       C.struct_t0_q
	ch      *C.struct_rdma_event_channel // owned by a dialed Conn; nil when accepted
	id      *C.struct_rdma_cm_id
	mem     []byte
	cfg     Config
	recvOff int
	sendOff int
	dataOff int
	peer    PrivateData
	accept  AcceptData

	closed   atomic.Bool
	peerGone atomic.Bool // a CM disconnect arrived
	done     chan struct{}
	closeMu  sync.Mutex
	stopped  bool
	isClosed bool
}

// setup maps and registers the queue's memory, creates its QP and CQ and
// posts every receive buffer.
func (c *Conn) setup(id *C.struct_rdma_cm_id) error {
	var total int
	c.recvOff, c.sendOff, c.dataOff, total = c.cfg.layout()
	mem, err := syscall.Mmap(-1, 0, total, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("rdma: mapping %d bytes of queue memory: %v", total, err)
	}
	c.mem = mem
	steps := [...]string{1: "ibv_alloc_pd", 2: "ibv_create_comp_channel", 3: "ibv_create_cq", 4: "ibv_req_notify_cq", 5: "rdma_create_qp", 6: "ibv_reg_mr"}
	if r, err := C.t0_setup(&c.q, id, C.int(c.cfg.Depth), C.int(c.cfg.dataSlots()), unsafe.Pointer(&mem[0]), C.size_t(total)); r != 0 {
		hint := ""
		if r == 6 {
			hint = " (locked memory limit? ulimit -l)"
		}
		return fmt.Errorf("rdma: %s failed for a queue of depth %d and %d bytes: %v%s", steps[r], c.cfg.Depth, total, err, hint)
	}
	for i := 0; i < c.cfg.Depth; i++ {
		if err := c.postRecv(i); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) postRecv(slot int) error {
	off := c.recvOff + slot*c.cfg.RecvSize
	if r := C.t0_post_recv(&c.q, C.uint64_t(uint64(OpRecv)<<32|uint64(slot)), unsafe.Pointer(&c.mem[off]), C.uint32_t(c.cfg.RecvSize)); r != 0 {
		return fmt.Errorf("rdma: ibv_post_recv slot %d: %v", slot, syscall.Errno(r))
	}
	return nil
}

func (c *Conn) slotCheck(slot int) error {
	if slot < 0 || slot >= c.cfg.Depth {
		return fmt.Errorf("rdma: slot %d out of range 0..%d", slot, c.cfg.Depth-1)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	if c.peerGone.Load() {
		return fmt.Errorf("rdma: the peer disconnected: %w", ErrClosed)
	}
	return nil
}

// Send copies msg into slot's send buffer and posts it as a SEND. The
// handler sees OpSend for slot when the buffer may be reused.
func (c *Conn) Send(slot int, msg []byte) error {
	if err := c.slotCheck(slot); err != nil {
		return err
	}
	if len(msg) > c.cfg.SendSize {
		return fmt.Errorf("rdma: message of %d bytes exceeds the send buffer of %d", len(msg), c.cfg.SendSize)
	}
	off := c.sendOff + slot*c.cfg.SendSize
	copy(c.mem[off:], msg)
	if r := C.t0_post_send(&c.q, C.uint64_t(uint64(OpSend)<<32|uint64(slot)), C.int(OpSend), unsafe.Pointer(&c.mem[off]), C.uint32_t(len(msg)), 0, 0); r != 0 {
		return fmt.Errorf("rdma: ibv_post_send (SEND) slot %d: %v", slot, syscall.Errno(r))
	}
	return nil
}

// RDMARead reads n bytes of the peer's memory at (raddr, rkey) into slot's
// data buffer (a target fetching a host's write data).
func (c *Conn) RDMARead(slot, n int, raddr uint64, rkey uint32) error {
	return c.rdma(OpRDMARead, slot, n, raddr, rkey)
}

// RDMAWrite writes the first n bytes of slot's data buffer to the peer's
// memory at (raddr, rkey) (a target returning read data).
func (c *Conn) RDMAWrite(slot, n int, raddr uint64, rkey uint32) error {
	return c.rdma(OpRDMAWrite, slot, n, raddr, rkey)
}

func (c *Conn) rdma(op Op, slot, n int, raddr uint64, rkey uint32) error {
	if err := c.slotCheck(slot); err != nil {
		return err
	}
	if slot >= c.cfg.dataSlots() {
		return fmt.Errorf("rdma: %v from data slot %d, the queue has %d", op, slot, c.cfg.dataSlots())
	}
	if n < 1 || n > c.cfg.DataSize {
		return fmt.Errorf("rdma: %v of %d bytes, want 1..%d (the data slot size)", op, n, c.cfg.DataSize)
	}
	off := c.dataOff + slot*c.cfg.DataSize
	if r := C.t0_post_send(&c.q, C.uint64_t(uint64(op)<<32|uint64(slot)), C.int(op), unsafe.Pointer(&c.mem[off]), C.uint32_t(n), C.uint64_t(raddr), C.uint32_t(rkey)); r != 0 {
		return fmt.Errorf("rdma: ibv_post_send (%v) slot %d: %v", op, slot, syscall.Errno(r))
	}
	return nil
}

// Data is slot's registered data buffer.
func (c *Conn) Data(slot int) []byte {
	off := c.dataOff + slot*c.cfg.DataSize
	return c.mem[off : off+c.cfg.DataSize : off+c.cfg.DataSize]
}

// Key is the (address, rkey) pair under which the peer reaches slot's data
// buffer with RDMA READ/WRITE: the keyed SGL of a command using it.
func (c *Conn) Key(slot int) (uint64, uint32) {
	off := c.dataOff + slot*c.cfg.DataSize
	return uint64(uintptr(unsafe.Pointer(&c.mem[off]))), uint32(C.t0_rkey(&c.q))
}

// Peer is the connect private data (sent when dialed, received when
// accepted).
func (c *Conn) Peer() PrivateData { return c.peer }

// Accepted is the accept private data (received when dialed, sent when
// accepted).
func (c *Conn) Accepted() AcceptData { return c.accept }

// idleWaitMs is how long the completion goroutine sleeps in poll(2) when
// no completion or CM event wakes it.
const idleWaitMs = 500

// poll is the queue's one completion goroutine.
func (c *Conn) poll() {
	defer close(c.done)
	const batch = 64
	wcs := make([]C.struct_t0_wc, batch)
	ms := 0
	cmfd := C.int(-1)
	if c.ch != nil {
		cmfd = C.int(c.ch.fd)
	}
	for !c.closed.Load() {
		var cmReady C.int
		n, err := C.t0_wait(&c.q, cmfd, C.int(ms), &wcs[0], batch, &cmReady)
		if n < 0 {
			if !c.closed.Load() {
				c.cfg.Handler(Completion{Err: fmt.Errorf("rdma: completion queue: %v", err)})
			}
			return
		}
		for _, wc := range wcs[:n] {
			op, slot := Op(wc.wr_id>>32), int(uint32(wc.wr_id))
			if wc.status != C.IBV_WC_SUCCESS {
				if c.closed.Load() {
					continue
				}
				c.cfg.Handler(Completion{Op: op, Slot: slot, Err: fmt.Errorf("rdma: %v on slot %d failed: %s (vendor error %#x)",
					op, slot, C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(wc.status))), uint32(wc.vendor_err))})
				continue
			}
			if op == OpRecv {
				off := c.recvOff + slot*c.cfg.RecvSize
				c.cfg.Handler(Completion{Op: op, Slot: slot, Data: c.mem[off : off+int(wc.byte_len)]})
				if !c.closed.Load() {
					if err := c.postRecv(slot); err != nil {
						c.cfg.Handler(Completion{Op: op, Slot: slot, Err: err})
					}
				}
				continue
			}
			c.cfg.Handler(Completion{Op: op, Slot: slot})
		}
		if cmReady != 0 {
			c.cmEvents()
		}
		// Drain at once when the batch was full, else wait for an event.
		// The wait's timeout only bounds how late a Stop is seen when no
		// event comes (Stop's disconnect flushes the posted receives,
		// which raises one at once): an idle queue wakes twice a second,
		// not twenty times (measured: an idle four-node cluster over
		// soft-RoCE in the emulated test guest starved its control
		// plane; docs/RDMA.md).
		if int(n) == batch {
			ms = 0
		} else {
			ms = idleWaitMs
		}
	}
}

// cmEvents handles the CM events of a dialed connection after it is
// established: a disconnect (the target removed its port, deleted the
// controller or went away) or a device removal fails the queue at once
// instead of leaving its commands to time out.
func (c *Conn) cmEvents() {
	for !c.closed.Load() {
		e, err := getEvent(c.ch, 0)
		if err != nil {
			return
		}
		switch e.typ {
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
			if !c.peerGone.Swap(true) {
				c.cfg.Handler(Completion{Err: fmt.Errorf("%w (%s)", ErrDisconnected, evName(e.typ))})
			}
		}
	}
}

// Stop disconnects and waits for the completion goroutine to end: once
// it returns the handler is not called again and no post succeeds, but
// the registered memory stays mapped (Data is still valid) until Close.
// A target stops a dead queue first, waits for the commands still
// executing from its data buffers, then closes it.
func (c *Conn) Stop() {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.stopped {
		return
	}
	c.stopped = true
	c.closed.Store(true)
	if c.id != nil {
		C.rdma_disconnect(c.id)
	}
	<-c.done
}

// Close disconnects and frees the queue. Pending work requests are
// flushed; the handler is not called for them.
func (c *Conn) Close() error {
	c.Stop()
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.isClosed {
		return nil
	}
	c.isClosed = true
	c.destroy()
	return nil
}

// Remote is the peer's IPv4 address and port ("?" when unknown).
func (c *Conn) Remote() string {
	var buf [64]C.char
	port := C.t0_peer(c.id, &buf[0], C.int(len(buf)))
	if port < 0 {
		return "?"
	}
	return net.JoinHostPort(C.GoString(&buf[0]), fmt.Sprint(int(port)))
}

func (c *Conn) destroy() {
	C.t0_teardown(&c.q)
	if c.id != nil {
		C.rdma_destroy_id(c.id)
		c.id = nil
	}
	if c.ch != nil {
		C.rdma_destroy_event_channel(c.ch)
		c.ch = nil
	}
	if c.mem != nil {
		syscall.Munmap(c.mem)
		c.mem = nil
	}
}
