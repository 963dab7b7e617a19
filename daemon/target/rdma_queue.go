package target

// The NVMe/RDMA queue of the target: one accepted queue pair's capsules,
// data buffers, RDMA READ/WRITE and responses (the port and its accept
// loop are rdma_conn.go; the transport's design is described there).

import (
	"errors"
	"fmt"
	"sync"

	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
)

// rdmaReq is a request's NVMe/RDMA state.
type rdmaReq struct {
	addr  uint64 // the host's keyed SGL
	key   uint32
	dslot int  // data buffer + 1; 0: none
	fetch bool // waiting for a data buffer to RDMA READ into (else to execute)
}

// rdmaQueue is the RDMA side of one conn.
type rdmaQueue struct {
	t     *Target
	c     *conn
	port  *rdmaPort
	link  rdmaLink
	ready chan struct{} // closed when c and link are set

	qid       uint16
	depth     int // the host's send queue size (HSQSIZE+1)
	slots     int // send buffers (and receive buffers)
	dataSlots int

	// mem guards the registered memory: held shared while copying into it
	// or posting, exclusively to mark it dead before it is unmapped.
	mem  sync.RWMutex
	dead bool

	smu         sync.Mutex
	sendFree    []int
	sendData    []int  // per send buffer: the data buffer (+1) its completion frees
	sendClose   []bool // per send buffer: close the queue after it completed
	dataFree    []int
	dataReq     []*request // per data buffer: the request whose RDMA READ it awaits
	waitData    []*request // requests waiting for a data buffer, in order
	waitSend    []pendingSend
	sqhd        uint16
	outstanding int // commands received, not yet answered (a parked AER counts)
}

type pendingSend struct {
	cqe   [nvme.CQELen]byte
	dslot int
	close bool
}

// decide checks a connecting queue's private data (on the listener's
// goroutine) and sizes its queue pair.
func (q *rdmaQueue) decide(pd rdma.PrivateData) (rdma.Config, rdma.AcceptData, uint16) {
	t := q.t
	depth := int(pd.HSQSize) + 1
	maxDepth := t.cfg.MaxQueueDepth
	if pd.QID == 0 {
		maxDepth = max(adminQueueDepth, maxDepth)
	}
	switch {
	case int(pd.QID) > t.cfg.MaxIOQueues:
		return rdma.Config{}, rdma.AcceptData{}, rdma.RejectInvalidQID
	case pd.HSQSize < 1 || depth > maxDepth:
		return rdma.Config{}, rdma.AcceptData{}, rdma.RejectInvalidHSQSize
	case pd.HRQSize < 1:
		return rdma.Config{}, rdma.AcceptData{}, rdma.RejectInvalidHRQSize
	}
	q.qid, q.depth = pd.QID, depth
	inline, ds := t.cfg.InlineDataSize, min(depth, rdmaIODataSlots)
	if pd.QID == 0 {
		inline, ds = adminInline, min(depth, rdmaAdminDataSlots)
	}
	// Responses whose SEND has not completed yet keep their buffer while
	// the host, which has their answers, may already send new commands:
	// twice the depth (and the AERs) is room for both.
	q.slots = 2*depth + maxAERs
	q.dataSlots = ds
	cfg := rdma.Config{Depth: q.slots, RecvSize: nvme.SQELen + inline, SendSize: nvme.CQELen,
		DataSize: t.cfg.MaxDataTransfer, DataSlots: ds, Handler: q.handle}
	return cfg, rdma.AcceptData{CRQSize: uint16(depth)}, 0
}

func (q *rdmaQueue) initSlots() {
	q.sendData = make([]int, q.slots)
	q.sendClose = make([]bool, q.slots)
	for i := q.slots - 1; i >= 0; i-- {
		q.sendFree = append(q.sendFree, i)
	}
	q.dataReq = make([]*request, q.dataSlots)
	for i := q.dataSlots - 1; i >= 0; i-- {
		q.dataFree = append(q.dataFree, i)
	}
}

// rdmaServeStarted, when set (tests), runs as a queue's serve begins.
var rdmaServeStarted func()

// serve waits for the queue's end and then ends it in the order the
// command lifetime rule needs (see the file comment).
func (q *rdmaQueue) serve() {
	if rdmaServeStarted != nil {
		rdmaServeStarted()
	}
	c := q.c
	<-c.done
	q.link.Stop()
	q.smu.Lock()
	var never []*request
	for i, r := range q.dataReq {
		if r != nil {
			never = append(never, r)
			q.dataReq[i] = nil
		}
	}
	never = append(never, q.waitData...)
	q.waitData, q.waitSend = nil, nil
	q.smu.Unlock()
	for _, r := range never {
		c.drop(r)
	}
	c.teardown()
	q.mem.Lock()
	q.dead = true
	q.mem.Unlock()
	q.link.Close()
	q.t.mu.Lock()
	delete(q.t.conns, c)
	q.t.mu.Unlock()
}

// handle runs on the queue pair's completion goroutine.
func (q *rdmaQueue) handle(cp rdma.Completion) {
	<-q.ready
	c := q.c
	if cp.Err != nil {
		switch {
		case c.closing():
		case errors.Is(cp.Err, rdma.ErrDisconnected): // the host's disconnect: as a TCP EOF
			q.t.log.Debug("NVMe/RDMA queue disconnected", "remote", c.remote(), "qid", q.qid)
		default:
			q.t.warnLimited("rdma-conn:"+c.remote(), "NVMe/RDMA queue closed", "remote", c.remote(), "qid", q.qid, "err", cp.Err)
		}
		c.close()
		return
	}
	switch cp.Op {
	case rdma.OpRecv:
		q.capsule(cp.Data)
	case rdma.OpSend:
		q.sent(cp.Slot)
	case rdma.OpRDMARead:
		q.fetched(cp.Slot)
	case rdma.OpRDMAWrite:
		// the response's SEND, posted after it, completes the command
	}
}

// protocolError ends the queue: the host broke the transport binding.
func (q *rdmaQueue) protocolError(why string) {
	q.t.warnLimited("rdma-proto:"+q.c.remote(), "NVMe/RDMA protocol error; closing the queue", "remote", q.c.remote(), "qid", q.qid, "err", why)
	q.c.close()
}

// capsule starts the command of one received capsule.
func (q *rdmaQueue) capsule(b []byte) {
	c := q.c
	if c.closing() {
		return
	}
	if len(b) < nvme.SQELen {
		q.protocolError(fmt.Sprintf("a command capsule of %d bytes, want at least %d", len(b), nvme.SQELen))
		return
	}
	sqe, _ := nvme.ParseSQE(b[:nvme.SQELen])
	q.smu.Lock()
	q.outstanding++
	over := q.outstanding > q.depth
	q.sqhd++
	if int(q.sqhd) >= q.depth {
		q.sqhd = 0
	}
	q.smu.Unlock()
	if over {
		q.protocolError(fmt.Sprintf("more than %d commands outstanding (the queue's HSQSIZE+1)", q.depth))
		return
	}
	r := reqPool.Get().(*request)
	*r = request{c: c, sqe: sqe}
	if t := b[39]; t>>4 == 4 { // keyed SGL data block: 24-bit length, key
		r.rd.addr = sqe.DPTR.Addr
		r.sqe.DPTR.Length = uint32(b[32]) | uint32(b[33])<<8 | uint32(b[34])<<16
		r.rd.key = uint32(b[35]) | uint32(b[36])<<8 | uint32(b[37])<<16 | uint32(b[38])<<24
		if sub := t & 0xF; sub != 0 && sub != 0xF { // address, or address with invalidate
			c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
			return
		}
	}
	if n := len(b) - nvme.SQELen; n > 0 {
		if n > c.inlineMax() {
			c.complete(r, nvme.StatusSGLInvalidData|nvme.StatusDNR)
			return
		}
		r.buf = q.t.pools.get(n)
		r.data = r.buf.b
		copy(r.data, b[nvme.SQELen:])
		r.inCapsule = true
	}
	c.start(r)
}

// start continues conn.start for an RDMA queue: it checks the data
// descriptor and fetches or reserves the command's data buffer.
func (q *rdmaQueue) start(r *request) {
	c := q.c
	s := &r.sqe
	keyed := s.DPTR.Type>>4 == 4
	mdt := int64(q.t.cfg.MaxDataTransfer)
	switch dataDir(s) {
	case 1:
		switch {
		case s.DPTR.Type == nvme.SGLTypeInCapsule:
			if s.DPTR.Addr != 0 {
				c.complete(r, nvme.StatusSGLInvalidOffset|nvme.StatusDNR)
				return
			}
			if int(s.DPTR.Length) != len(r.data) {
				c.complete(r, nvme.StatusSGLInvalidData|nvme.StatusDNR)
				return
			}
		case keyed:
			if r.inCapsule {
				c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
				return
			}
			if s.DPTR.Length == 0 {
				break
			}
			if int64(s.DPTR.Length) > mdt {
				c.complete(r, nvme.StatusInvalidField|nvme.StatusDNR)
				return
			}
			q.withData(r, true)
			return
		default:
			c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
			return
		}
	case 2:
		if s.DPTR.Length > 0 && !keyed {
			c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
			return
		}
		if int64(s.DPTR.Length) > mdt {
			c.complete(r, nvme.StatusInvalidField|nvme.StatusDNR)
			return
		}
		if s.DPTR.Length > 0 {
			q.withData(r, false)
			return
		}
	}
	q.dispatch(r)
}

// withData gives r a data buffer (or queues it for one) and then fetches
// its data (a write) or dispatches it (a read).
func (q *rdmaQueue) withData(r *request, fetch bool) {
	q.smu.Lock()
	if len(q.dataFree) == 0 {
		r.rd.fetch = fetch
		q.waitData = append(q.waitData, r)
		q.smu.Unlock()
		return
	}
	ds := q.dataFree[len(q.dataFree)-1]
	q.dataFree = q.dataFree[:len(q.dataFree)-1]
	q.smu.Unlock()
	q.useData(r, ds, fetch)
}

func (q *rdmaQueue) useData(r *request, ds int, fetch bool) {
	r.rd.dslot = ds + 1
	if !fetch {
		q.dispatch(r)
		return
	}
	q.smu.Lock()
	q.dataReq[ds] = r
	q.smu.Unlock()
	if err := q.link.RDMARead(ds, int(r.sqe.DPTR.Length), r.rd.addr, r.rd.key); err != nil {
		// the request stays with its buffer: serve drops it
		q.protocolError(fmt.Sprintf("posting the RDMA READ of command %#x: %v", r.sqe.Opcode, err))
	}
}

// fetched: the RDMA READ into data buffer ds completed; its command runs
// from that buffer.
func (q *rdmaQueue) fetched(ds int) {
	q.smu.Lock()
	var r *request
	if ds >= 0 && ds < len(q.dataReq) {
		r, q.dataReq[ds] = q.dataReq[ds], nil
	}
	q.smu.Unlock()
	if r == nil {
		q.protocolError(fmt.Sprintf("an RDMA READ completion for data buffer %d, which no command awaits", ds))
		return
	}
	r.data = q.link.Data(ds)[:r.sqe.DPTR.Length]
	r.buf = nil // registered memory: never to the buffer pools
	q.dispatch(r)
}

// dispatch runs a command whose data is here: admin and fabrics commands
// at once, I/O commands on the queue's workers.
func (q *rdmaQueue) dispatch(r *request) {
	c := q.c
	if c.closing() {
		c.drop(r)
		return
	}
	if c.qid == 0 || c.work == nil || r.sqe.Opcode == nvme.CmdFabrics {
		c.t.execute(r)
		return
	}
	select {
	case c.work <- r:
	case <-c.done:
		c.drop(r)
	}
}

// complete sends r's response (conn.complete of an RDMA queue): the data
// of a read by RDMA WRITE, then the CQE by SEND. r is recycled at once;
// its data buffer returns when the SEND completed.
func (q *rdmaQueue) complete(r *request, st nvme.Status) {
	r.cqe.CID = r.sqe.CID
	r.cqe.Status = st
	if !st.OK() {
		r.sendLen = 0
	}
	q.mem.RLock()
	defer q.mem.RUnlock()
	if q.dead {
		q.release(r)
		return
	}
	ds := r.rd.dslot
	if r.sendLen > 0 {
		if ds == 0 || r.sendLen > q.t.cfg.MaxDataTransfer {
			// cannot happen: a read's length was checked and its buffer
			// reserved at start
			r.cqe.Status, r.sendLen = nvme.StatusInternal, 0
		} else {
			n := copy(q.link.Data(ds - 1)[:r.sendLen], r.data[:r.sendLen])
			if err := q.link.RDMAWrite(ds-1, n, r.rd.addr, r.rd.key); err != nil {
				q.release(r)
				q.protocolError(fmt.Sprintf("posting the RDMA WRITE of command %#x: %v", r.sqe.Opcode, err))
				return
			}
		}
	}
	var p pendingSend
	p.dslot, p.close = ds, r.closeConn
	cqe := r.cqe
	q.release(r)
	q.send(&cqe, p)
}

// send posts one CQE (the caller holds q.mem shared).
func (q *rdmaQueue) send(cqe *nvme.CQE, p pendingSend) {
	q.smu.Lock()
	if q.outstanding > 0 {
		q.outstanding--
	}
	cqe.SQID, cqe.SQHead = q.qid, q.sqhd
	cqe.Append(p.cqe[:0])
	if len(q.sendFree) == 0 {
		q.waitSend = append(q.waitSend, p)
		q.smu.Unlock()
		return
	}
	s := q.sendFree[len(q.sendFree)-1]
	q.sendFree = q.sendFree[:len(q.sendFree)-1]
	q.sendData[s], q.sendClose[s] = p.dslot, p.close
	q.smu.Unlock()
	q.post(s, p.cqe[:])
}

func (q *rdmaQueue) post(s int, msg []byte) {
	if err := q.link.Send(s, msg); err != nil && !q.c.closing() {
		q.protocolError(fmt.Sprintf("posting a response: %v", err))
	}
}

// sendCQE sends a completion that has no request (an AER's).
func (q *rdmaQueue) sendCQE(cqe nvme.CQE) {
	q.mem.RLock()
	defer q.mem.RUnlock()
	if !q.dead {
		q.send(&cqe, pendingSend{})
	}
}

// sent: the SEND from buffer s completed: the host has the response, its
// data buffer is free for the next command waiting for one.
func (q *rdmaQueue) sent(s int) {
	if s < 0 || s >= q.slots {
		return
	}
	q.smu.Lock()
	ds, cl := q.sendData[s], q.sendClose[s]
	q.sendData[s], q.sendClose[s] = 0, false
	var next *request
	if ds > 0 {
		if len(q.waitData) > 0 {
			next = q.waitData[0]
			q.waitData = q.waitData[1:]
		} else {
			q.dataFree = append(q.dataFree, ds-1)
		}
	}
	var pend *pendingSend
	if len(q.waitSend) > 0 {
		p := q.waitSend[0]
		q.waitSend = q.waitSend[1:]
		pend = &p
		q.sendData[s], q.sendClose[s] = p.dslot, p.close
	} else {
		q.sendFree = append(q.sendFree, s)
	}
	q.smu.Unlock()
	if pend != nil {
		q.mem.RLock()
		if !q.dead {
			q.post(s, pend.cqe[:])
		}
		q.mem.RUnlock()
	}
	if next != nil {
		q.useData(next, ds-1, next.rd.fetch)
	}
	if cl {
		q.c.close()
	}
}

// release recycles a request whose response is posted (or never will be).
func (q *rdmaQueue) release(r *request) {
	q.c.freeSlot(r)
	q.t.pools.put(r.buf)
	*r = request{}
	reqPool.Put(r)
}
