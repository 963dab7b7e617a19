package rdma

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// hostQueue is one NVMe/RDMA queue of a host, a transport.Queue: slot i's
// command has CID i, its SQE goes out of send buffer i and its data lives
// in registered data buffer i (copied from the caller's buffer by Start,
// to it by Wait). A slot is complete once both its SEND completed and its
// response capsule arrived; many slots are in flight at once, and their
// completions come on the connection's one completion goroutine (handle),
// never a goroutine per command.
type hostQueue struct {
	qid      uint16
	conn     capsuleConn
	depth    int
	dataSize int
	inline   int           // most write data sent in the command capsule (0: none)
	timeout  time.Duration // per command, for exec (the Controller of Connect)
	free     chan int
	dead     chan struct{} // closed when the queue failed or closed

	// memMu is held shared while the registered memory is used (copies
	// into and out of the data buffers, posting a SEND) and exclusively
	// by closeConn, which frees it: a command finishing on one goroutine
	// never touches memory another goroutine's Fail has unmapped.
	memMu      sync.RWMutex
	connClosed bool // under memMu

	mu    sync.Mutex
	slots []hostSlot
	err   error // sticky: the queue failed
}

type hostSlot struct {
	busy, sent, answered bool
	cqe                  nvme.CQE
	done                 chan error // buffered 1
	read                 []byte     // the caller's read buffer, filled by Wait
	start                atomic.Int64
	capsule              []byte // empty; capacity SQELen + the queue's inline bytes
}

var _ transport.Queue = (*hostQueue)(nil)

// openQueue dials one queue of depth slots, each with a data buffer of
// data bytes; inline > 0 (I/O queues only) sends writes of up to inline
// bytes in the command capsule.
func openQueue(ctx context.Context, dial func(context.Context, string, PrivateData, Config) (QueueConn, error), addr string, qid uint16, depth, data, inline int, timeout time.Duration) (*hostQueue, error) {
	if dial == nil {
		dial = dialQueue
	}
	if qid == 0 || inline < 0 {
		inline = 0
	}
	q := &hostQueue{qid: qid, depth: depth, dataSize: data, inline: inline, timeout: timeout, free: make(chan int, depth), dead: make(chan struct{}), slots: make([]hostSlot, depth)}
	n := nvme.SQELen + inline
	capsules := make([]byte, depth*n)
	for i := range q.slots {
		q.slots[i].done = make(chan error, 1)
		q.slots[i].capsule = capsules[i*n : i*n : (i+1)*n] // an append past it cannot reach the next slot's
		q.free <- i
	}
	pd := PrivateData{QID: qid, HRQSize: uint16(depth), HSQSize: uint16(depth - 1)}
	cfg := Config{Depth: depth, RecvSize: nvme.CQELen, SendSize: nvme.SQELen + inline, DataSize: data, Handler: q.handle}
	conn, err := dial(ctx, addr, pd, cfg)
	if err != nil {
		return nil, err
	}
	q.conn = conn
	return q, nil
}

// QID is the queue's ID (0: admin).
func (q *hostQueue) QID() uint16 { return q.qid }

// Depth is the number of slots (commands in flight at most).
func (q *hostQueue) Depth() int { return q.depth }

// Done is closed when the queue failed or was closed.
func (q *hostQueue) Done() <-chan struct{} { return q.dead }

// Err is why the queue failed (nil while it works).
func (q *hostQueue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

func (q *hostQueue) lost() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// Start sends c from a free slot (waiting for one) and returns the slot
// as its tag. Write data of up to the queue's inline bytes (an I/O queue
// whose controller takes in-capsule data, IOCCSZ) follows the SQE in the
// same SEND, as Linux's host sends it; other data is copied into the
// slot's registered buffer, and a keyed SGL names that buffer to the
// target. flush is ignored (every SEND is posted at once) and so is
// c.InCapsule: the Fabrics Connect data moves by keyed SGL, as Linux's
// host sends it.
func (q *hostQueue) Start(c transport.Command, flush bool) (uint16, error) {
	var slot int
	select {
	case slot = <-q.free:
	case <-q.dead:
		return 0, q.lost()
	}
	st := &q.slots[slot]
	s := c.SQE
	s.CID = uint16(slot)
	s.Flags |= nvme.SQEFlagSGLMeta
	data, write := c.Write, true
	if len(data) == 0 {
		data, write = c.Read, false
	}
	inCapsule := write && len(data) > 0 && len(data) <= q.inline
	if inCapsule {
		s.DPTR = nvme.SGL{Length: uint32(len(data)), Type: nvme.SGLTypeInCapsule}
	}
	b := s.Append(st.capsule)
	if len(data) > q.dataSize {
		q.free <- slot
		return 0, fmt.Errorf("queue %d: %d bytes exceed the %d-byte data buffer of a slot", q.qid, len(data), q.dataSize)
	}
	st.read = nil
	if !write && len(data) > 0 {
		st.read = data
	}
	q.mu.Lock()
	if q.err != nil {
		err := q.err
		q.mu.Unlock()
		q.free <- slot
		return 0, err
	}
	st.busy, st.sent, st.answered = true, false, false
	q.mu.Unlock()
	if !c.NoTimeout {
		st.start.Store(time.Now().UnixNano())
	}
	q.memMu.RLock()
	var err error
	if q.connClosed {
		err = ErrClosed
	} else {
		switch {
		case inCapsule:
			b = append(b, data...) // within the slot's capsule buffer
		case len(data) > 0:
			if write {
				copy(q.conn.Data(slot), data)
			}
			addr, key := q.conn.Key(slot)
			PutKeyedSGL(b, addr, len(data), key)
		default:
			PutKeyedSGL(b, 0, 0, 0) // the null keyed SGL
		}
		err = q.conn.Send(slot, b)
	}
	q.memMu.RUnlock()
	if err != nil {
		// not sent: the queue fails (and with it this slot), and the
		// command is the caller's to send again elsewhere
		q.Fail(fmt.Errorf("queue %d: posting command %#x: %w: %w: %v", q.qid, s.Opcode, ErrQueueLost, blockdev.ErrIO, err))
		<-st.done
		st.read = nil
		st.start.Store(0)
		q.free <- slot
		return 0, q.lost()
	}
	return uint16(slot), nil
}

// Wait waits for the command in slot tag, copies read data into the
// caller's buffer and frees the slot.
func (q *hostQueue) Wait(tag uint16) (nvme.CQE, error) {
	st := &q.slots[tag]
	err := <-st.done
	cqe := st.cqe
	if err == nil && st.read != nil && cqe.Status.OK() {
		q.memMu.RLock()
		if q.connClosed {
			err = fmt.Errorf("queue %d: %w: %w: closed before the read data was copied", q.qid, ErrQueueLost, blockdev.ErrIO)
		} else {
			copy(st.read, q.conn.Data(int(tag)))
		}
		q.memMu.RUnlock()
	}
	st.read = nil
	st.start.Store(0)
	q.free <- int(tag)
	if err != nil {
		return nvme.CQE{}, err
	}
	return cqe, nil
}

// Oldest is how long the oldest command in flight has waited (commands
// started with NoTimeout not counted), 0 when none.
func (q *hostQueue) Oldest(now time.Time) time.Duration {
	var max time.Duration
	for i := range q.slots {
		st := q.slots[i].start.Load()
		if st == 0 {
			continue
		}
		if d := now.Sub(time.Unix(0, st)); d > max {
			max = d
		}
	}
	return max
}

// Fail fails the queue: its commands in flight fail with err (wrapped with
// ErrQueueLost unless it is already), and the connection is closed.
func (q *hostQueue) Fail(err error) {
	if !errors.Is(err, ErrQueueLost) {
		err = fmt.Errorf("queue %d: %w: %w", q.qid, ErrQueueLost, err)
	}
	q.fail(err)
	q.closeConn()
}

// closeConn closes the connection once nothing uses its memory.
func (q *hostQueue) closeConn() {
	q.memMu.Lock()
	defer q.memMu.Unlock()
	if q.connClosed || q.conn == nil {
		return
	}
	q.connClosed = true
	q.conn.Close()
}

// handle runs on the connection's completion goroutine.
func (q *hostQueue) handle(c Completion) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.Err != nil {
		q.failLocked(fmt.Errorf("queue %d: %w: %w: %v", q.qid, ErrQueueLost, blockdev.ErrIO, c.Err))
		return
	}
	switch c.Op {
	case OpSend:
		if c.Slot < 0 || c.Slot >= len(q.slots) {
			return
		}
		s := &q.slots[c.Slot]
		s.sent = true
		q.finishLocked(s)
	case OpRecv:
		cqe, err := nvme.ParseCQE(c.Data)
		if err != nil {
			q.failLocked(fmt.Errorf("queue %d: response capsule of %d bytes: %w: %w: %v", q.qid, len(c.Data), ErrQueueLost, blockdev.ErrIO, err))
			return
		}
		if int(cqe.CID) >= len(q.slots) || !q.slots[cqe.CID].busy || q.slots[cqe.CID].answered {
			q.failLocked(fmt.Errorf("queue %d: response for command ID %d, which is not outstanding: %w: %w", q.qid, cqe.CID, ErrQueueLost, blockdev.ErrIO))
			return
		}
		s := &q.slots[cqe.CID]
		s.cqe, s.answered = cqe, true
		q.finishLocked(s)
	}
}

func (q *hostQueue) finishLocked(s *hostSlot) {
	if s.busy && s.sent && s.answered {
		s.busy = false
		s.done <- nil
	}
}

func (q *hostQueue) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failLocked(err)
}

// failLocked records the queue's first error, fails the commands in
// flight and closes dead; the connection is closed by Fail or close (not
// here: handle runs on the completion goroutine that closing waits for).
func (q *hostQueue) failLocked(err error) {
	if q.err == nil {
		q.err = err
		close(q.dead)
	}
	for i := range q.slots {
		if s := &q.slots[i]; s.busy {
			s.busy = false
			s.done <- q.err
		}
	}
}

func (q *hostQueue) close() {
	q.fail(fmt.Errorf("queue %d: %w", q.qid, blockdev.ErrClosed))
	q.closeConn()
}

// connect sends Fabrics Connect and returns the controller ID (the
// Controller of Connect).
func (q *hostQueue) connect(o Options, cntlID uint16) (uint16, error) {
	d := nvme.ConnectData{HostID: o.HostID, CntlID: cntlID, SubNQN: o.SubNQN, HostNQN: o.HostNQN}
	cmd := nvme.ConnectCmd{QID: q.qid, SQSize: uint16(q.depth - 1)}.SQE(0)
	cqe, err := q.exec(cmd, d.Append(nil), true)
	if err != nil {
		return 0, err
	}
	return uint16(cqe.DW0()), nil
}

func (q *hostQueue) run(s nvme.SQE, data []byte, write bool) error {
	_, err := q.exec(s, data, write)
	return err
}

// exec runs one command for the Controller of Connect, which has no
// supervisor: a command not answered within q.timeout fails the queue.
// A non-zero NVMe status is a *StatusError.
func (q *hostQueue) exec(s nvme.SQE, data []byte, write bool) (nvme.CQE, error) {
	c := transport.Command{SQE: s, Read: data}
	if write {
		c = transport.Command{SQE: s, Write: data}
	}
	tag, err := q.Start(c, true)
	if err != nil {
		return nvme.CQE{}, err
	}
	t := time.NewTimer(q.timeout)
	select {
	case <-t.C:
		// the queue fails, and with it this command (the target may still
		// write into the slot's buffer, which is not reused)
		q.fail(fmt.Errorf("queue %d: command %#x (cid %d) not answered within %v: %w: %w", q.qid, s.Opcode, tag, q.timeout, ErrQueueLost, blockdev.ErrTimeout))
	case e := <-q.slots[tag].done:
		// put back for Wait, which takes it again
		q.slots[tag].done <- e
	}
	t.Stop()
	cqe, err := q.Wait(tag)
	if err != nil {
		return nvme.CQE{}, err
	}
	if !cqe.Status.OK() {
		return cqe, fmt.Errorf("queue %d: %w", q.qid, &StatusError{Opcode: s.Opcode, Status: cqe.Status})
	}
	return cqe, nil
}
