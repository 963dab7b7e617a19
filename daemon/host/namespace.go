package host

import (
	"context"
	"fmt"
	"sync/atomic"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// Namespace is one namespace of a controller, a blockdev.Device (and
// blockdev.FUAWriter). I/O larger than the controller's MDTS is split.
type Namespace struct {
	c      *Controller
	nsid   uint32
	id     nvme.IdentifyNamespace
	bs     int
	size   int64
	maxIO  int // bytes per command
	flags  int // ioFailFast under Multipath, with ioAbandon under Options.FailFast
	closed atomic.Bool
}

var _ blockdev.Device = (*Namespace)(nil)
var _ blockdev.FUAWriter = (*Namespace)(nil)

// Namespace identifies namespace nsid and returns it as a block device.
func (c *Controller) Namespace(nsid uint32) (*Namespace, error) {
	id, err := c.IdentifyNamespace(context.Background(), nsid)
	if err != nil {
		return nil, fmt.Errorf("namespace %d on %s: %w", nsid, c.addr, err)
	}
	bs := id.BlockSize()
	if bs == 0 || id.NSZE == 0 {
		return nil, fmt.Errorf("namespace %d on %s is not active (size %d blocks, block size %d): check the NSID with `nvme list-ns` or tier0 fabric io --nsid", nsid, c.addr, id.NSZE, bs)
	}
	maxIO := max(c.maxIO(c.Identify().MDTS)/bs*bs, bs)
	if maxIO/bs > 65536 {
		maxIO = 65536 * bs
	}
	flags := 0
	if c.opts.FailFast {
		flags = ioFailFast | ioAbandon
	}
	return &Namespace{c: c, nsid: nsid, id: id, bs: bs, size: int64(id.NSZE) * int64(bs), maxIO: maxIO, flags: flags}, nil
}

// maxIO is the most data of one I/O command: 1 MiB, less when the
// controller's MDTS or the transport (transport.Transport.MaxData) says
// less.
func (c *Controller) maxIO(mdts uint8) int {
	n := 1 << 20
	if mdts != 0 && mdts < 20 {
		n = min(n, 4096<<mdts)
	}
	if t := c.tr.MaxData(); t > 0 {
		n = min(n, t)
	}
	return n
}

// Incarnation is the boot incarnation of the target's node
// (Controller.Incarnation; raid.Incarnated): a RAID member whose node
// restarted since its superblock was written catches up instead of being
// taken as current. 0 (unknown) from a target that reports none; raid
// then keeps its behaviour for devices without an incarnation.
func (n *Namespace) Incarnation() uint64 { return n.c.Incarnation() }

// NSID is the namespace ID.
func (n *Namespace) NSID() uint32 { return n.nsid }

// Identify returns the Identify Namespace data read when it was opened.
func (n *Namespace) Identify() nvme.IdentifyNamespace { return n.id }

// Controller returns the controller of the namespace.
func (n *Namespace) Controller() *Controller { return n.c }

// ANAGroup is the namespace's ANA group ID (0 when the controller has no ANA).
func (n *Namespace) ANAGroup() uint32 { return n.id.ANAGRPID }

// ANAState is the namespace's ANA state as last read from the controller.
// A controller without ANA reports optimized; one that is not connected
// reports inaccessible.
func (n *Namespace) ANAState() ANAState {
	if !n.c.Connected() {
		return nvme.ANAInaccessible
	}
	if n.id.ANAGRPID == 0 || n.c.Identify().ANACAP == 0 {
		return nvme.ANAOptimized
	}
	if s, ok := n.c.GroupState(n.id.ANAGRPID); ok {
		return s
	}
	return nvme.ANAChange
}

// Size is the capacity in bytes.
func (n *Namespace) Size() int64 { return n.size }

// BlockSize is the logical block size.
func (n *Namespace) BlockSize() int { return n.bs }

// Close marks the namespace closed; the controller stays connected.
func (n *Namespace) Close() error {
	n.closed.Store(true)
	return nil
}

func (n *Namespace) check(off, length int64) error {
	if n.closed.Load() {
		return fmt.Errorf("namespace %d on %s: %w", n.nsid, n.c.addr, blockdev.ErrClosed)
	}
	return blockdev.CheckRange(off, length, n.size, n.bs)
}

// status turns a completion into an error.
func (n *Namespace) status(op string, off int64, cqe nvme.CQE) error {
	if cqe.Status.OK() {
		return nil
	}
	return fmt.Errorf("%s at byte %d of namespace %d on %s: %w", op, off, n.nsid, n.c.addr, &StatusError{Op: op, Status: cqe.Status})
}

// rw issues reads or writes of at most maxIO bytes each, in parallel.
func (n *Namespace) rw(p []byte, off int64, write, fua bool) (int, error) {
	if err := n.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) <= n.maxIO {
		if err := n.rw1(p, off, write, fua); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return n.rwBatch(p, off, write, fua)
}

// rwBatch issues the maxIO-sized pieces of a large request back to back on
// one I/O queue (no goroutine per piece) and then collects them. Pieces that
// fail on the transport are redone one by one through rw1, which applies the
// reconnect policy.
func (n *Namespace) rwBatch(p []byte, off int64, write, fua bool) (int, error) {
	a, err := n.assoc()
	if err != nil {
		return 0, err
	}
	q, err := a.ioQueue(n.c)
	if err != nil {
		return 0, err
	}
	type piece struct {
		lo, hi  int
		cid     uint16
		started bool
	}
	pieces := make([]piece, 0, (len(p)+n.maxIO-1)/n.maxIO)
	for lo := 0; lo < len(p); lo += n.maxIO {
		pieces = append(pieces, piece{lo: lo, hi: min(lo+n.maxIO, len(p))})
	}
	first, firstAt := error(nil), len(p)
	setErr := func(lo int, err error) {
		if lo < firstAt {
			first, firstAt = err, lo
		}
	}
	// a window of at most half the queue depth in flight: slots are freed
	// only by wait, so starting more than the queue holds would deadlock
	window := max(1, q.Depth()/2)
	var redo []piece
	lost := false // a write piece was sent and its connection lost
	started := 0
	for waited := 0; waited < len(pieces); waited++ {
		for started < len(pieces) && started-waited < window {
			pc := &pieces[started]
			c := n.rwCmd(p[pc.lo:pc.hi], off+int64(pc.lo), write, fua)
			last := started == len(pieces)-1 || started-waited == window-1
			if cid, err := q.Start(c, last); err == nil {
				pc.cid, pc.started = cid, true
			}
			started++
		}
		pc := pieces[waited]
		if !pc.started {
			redo = append(redo, pc)
			continue
		}
		cqe, err := q.Wait(pc.cid)
		if err != nil {
			redo = append(redo, pc)
			lost = lost || write
			continue
		}
		if err := n.status(opName(write), off+int64(pc.lo), cqe); err != nil {
			setErr(pc.lo, err)
		}
	}
	if len(redo) > 0 {
		a.fail(fmt.Errorf("queue %d failed during a batched request", q.QID()))
		if lost {
			// the lost pieces may still execute on the controller: no
			// resubmission before the association is quiesced
			err := fmt.Errorf("write of %d bytes at byte %d of namespace %d on %s: queue %d: %w: %w", len(p), off, n.nsid, n.c.addr, q.QID(), errConnLost, blockdev.ErrIO)
			if n.flags&ioFailFast != 0 {
				return 0, n.c.lostWrite(a, n.flags, err)
			}
			if werr := n.c.waitQuiesced(a, nil); werr != nil {
				return 0, fmt.Errorf("%w (while waiting for the lost association to quiesce: %w)", err, werr)
			}
		}
		for _, pc := range redo {
			if err := n.rw1(p[pc.lo:pc.hi], off+int64(pc.lo), write, fua); err != nil {
				setErr(pc.lo, err)
			}
		}
	}
	if first != nil {
		return firstAt, first
	}
	return len(p), nil
}

// assoc returns the controller's association under the namespace's policy.
func (n *Namespace) assoc() (*assoc, error) {
	if n.flags&ioFailFast != 0 {
		return n.c.now()
	}
	return n.c.current(context.Background())
}

func opName(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

func (n *Namespace) rwCmd(p []byte, off int64, write, fua bool) transport.Command {
	sqe := nvme.SQE{Opcode: nvme.CmdRead, NSID: n.nsid}
	sqe.SetRW(uint64(off/int64(n.bs)), uint32(len(p)/n.bs))
	if !write {
		return transport.Command{SQE: sqe, Read: p}
	}
	sqe.Opcode = nvme.CmdWrite
	if fua {
		sqe.CDW12 |= nvme.CmdWriteFUABit
	}
	return transport.Command{SQE: sqe, Write: p}
}

func (n *Namespace) rw1(p []byte, off int64, write, fua bool) error {
	c := n.rwCmd(p, off, write, fua)
	cqe, err := n.c.io(opName(write), c.SQE, c.Write, c.Read, n.flags)
	if err != nil {
		return err
	}
	return n.status(opName(write), off, cqe)
}

// ReadAt reads len(p) bytes at off.
func (n *Namespace) ReadAt(p []byte, off int64) (int, error) { return n.rw(p, off, false, false) }

// WriteAt writes len(p) bytes at off.
func (n *Namespace) WriteAt(p []byte, off int64) (int, error) { return n.rw(p, off, true, false) }

// WriteAtFUA writes with Force Unit Access.
func (n *Namespace) WriteAtFUA(p []byte, off int64) (int, error) { return n.rw(p, off, true, true) }

// Flush sends an NVMe Flush.
func (n *Namespace) Flush() error {
	if n.closed.Load() {
		return fmt.Errorf("namespace %d: %w", n.nsid, blockdev.ErrClosed)
	}
	cqe, err := n.c.io("flush", nvme.SQE{Opcode: nvme.CmdFlush, NSID: n.nsid}, nil, nil, n.flags)
	if err != nil {
		return err
	}
	return n.status("flush", 0, cqe)
}

// WriteZeroes sends Write Zeroes commands of at most 65536 blocks.
func (n *Namespace) WriteZeroes(off, length int64) error {
	return n.zeroes(off, length, false)
}

// Discard sends Write Zeroes with the deallocate bit, so that the range
// reads back as zeroes as the blockdev contract requires (DSM deallocate
// alone does not guarantee that).
func (n *Namespace) Discard(off, length int64) error {
	return n.zeroes(off, length, true)
}

func (n *Namespace) zeroes(off, length int64, deac bool) error {
	if err := n.check(off, length); err != nil {
		return err
	}
	const maxBlocks = 65536
	for length > 0 {
		nb := min(length/int64(n.bs), maxBlocks)
		sqe := nvme.SQE{Opcode: nvme.CmdWriteZeroes, NSID: n.nsid}
		sqe.SetRW(uint64(off/int64(n.bs)), uint32(nb))
		if deac {
			sqe.CDW12 |= nvme.CmdWriteZeroesDeac
		}
		cqe, err := n.c.io("write zeroes", sqe, nil, nil, n.flags)
		if err != nil {
			return err
		}
		if err := n.status("write zeroes", off, cqe); err != nil {
			return err
		}
		off += nb * int64(n.bs)
		length -= nb * int64(n.bs)
	}
	return nil
}

// resv runs a reservation command; never retried after a lost connection
// (its effect is unknown then).
func (n *Namespace) resv(op string, opc uint8, cdw10 uint32, data []byte) error {
	if n.closed.Load() {
		return fmt.Errorf("namespace %d: %w", n.nsid, blockdev.ErrClosed)
	}
	cqe, err := n.c.io(op, nvme.SQE{Opcode: opc, NSID: n.nsid, CDW10: cdw10}, data, nil, n.flags|ioNoRetry)
	if err != nil {
		return err
	}
	return n.status(op, 0, cqe)
}

// Register registers key for this host (action nvme.ResvRegister with
// current 0 and new key; nvme.ResvReplace replaces crkey by nrkey;
// nvme.ResvUnregister removes crkey). iekey ignores the existing key.
func (n *Namespace) Register(action uint8, crkey, nrkey uint64, iekey bool) error {
	return n.resv("reservation register", nvme.CmdResvRegister, nvme.ResvCmd{Action: action, IEKey: iekey}.CDW10(),
		nvme.ResvKeys{CRKey: crkey, Key2: nrkey}.Append(make([]byte, 0, 16)))
}

// Acquire acquires a reservation of type t with key crkey; action
// nvme.ResvPreempt or nvme.ResvPreemptAndAbort preempts the holder of
// prkey.
func (n *Namespace) Acquire(action uint8, t nvme.ResvType, crkey, prkey uint64) error {
	return n.resv("reservation acquire", nvme.CmdResvAcquire, nvme.ResvCmd{Action: action, Type: t}.CDW10(),
		nvme.ResvKeys{CRKey: crkey, Key2: prkey}.Append(make([]byte, 0, 16)))
}

// Release releases (nvme.ResvRelease) or clears (nvme.ResvClear) the
// reservation of type t held with crkey.
func (n *Namespace) Release(action uint8, t nvme.ResvType, crkey uint64) error {
	// Linux sends 16 bytes (crkey + reserved); so do we.
	return n.resv("reservation release", nvme.CmdResvRelease, nvme.ResvCmd{Action: action, Type: t}.CDW10(),
		nvme.ResvKeys{CRKey: crkey}.Append(make([]byte, 0, 16)))
}

// Report returns the reservation status (extended format).
func (n *Namespace) Report() (nvme.ResvStatus, error) {
	if n.closed.Load() {
		return nvme.ResvStatus{}, fmt.Errorf("namespace %d: %w", n.nsid, blockdev.ErrClosed)
	}
	buf := make([]byte, 4096)
	sqe := nvme.SQE{Opcode: nvme.CmdResvReport, NSID: n.nsid, CDW10: uint32(len(buf)/4 - 1), CDW11: nvme.ResvReportEDS}
	cqe, err := n.c.io("reservation report", sqe, nil, buf, n.flags|ioNoRetry)
	if err != nil {
		return nvme.ResvStatus{}, err
	}
	if err := n.status("reservation report", 0, cqe); err != nil {
		return nvme.ResvStatus{}, err
	}
	return nvme.ParseResvStatus(buf)
}
