package target

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/nvme"
)

// connectTimeout bounds the time from accept to a successful Connect, so a
// peer that never connects cannot hold a connection open.
var connectTimeout = 10 * time.Second

// errTerminated: the connection ended after a TermReq (sent or received).
var errTerminated = errors.New("connection terminated")

// bufPools recycles data buffers by power-of-two size class.
type bufPools struct {
	classes []sync.Pool // class i holds buffers of 512<<i bytes
}

type buffer struct{ b []byte }

func newBufPools(max int) *bufPools {
	n := 0
	for s := 512; s < max; s <<= 1 {
		n++
	}
	p := &bufPools{classes: make([]sync.Pool, n+1)}
	for i := range p.classes {
		size := 512 << i
		p.classes[i].New = func() any { return &buffer{b: make([]byte, size)} }
	}
	return p
}

// get returns a buffer holding at least n bytes; b.b is resliced to n.
func (p *bufPools) get(n int) *buffer {
	i := 0
	for 512<<i < n {
		i++
	}
	if i >= len(p.classes) {
		return &buffer{b: make([]byte, n)}
	}
	b := p.classes[i].Get().(*buffer)
	b.b = b.b[:n]
	return b
}

func (p *bufPools) put(b *buffer) {
	if b == nil {
		return
	}
	c := cap(b.b)
	for i := range p.classes {
		if 512<<i == c {
			b.b = b.b[:c]
			p.classes[i].Put(b)
			return
		}
	}
}

// request is one command in flight on a queue.
type request struct {
	c         *conn
	sqe       nvme.SQE
	slot      uint16
	buf       *buffer // data: received from the host, or to send to it
	data      []byte  // the valid part of buf
	inCapsule bool
	want      uint32 // bytes expected by R2T
	rcvd      uint32
	waiting   bool        // waiting for H2CData
	xferErr   nvme.Status // data digest failed on the way in
	cqe       nvme.CQE
	sendLen   int // bytes of data to send to the host with the response
	closeConn bool
}

var reqPool = sync.Pool{New: func() any { return new(request) }}

// outMsg is one thing for the writer goroutine to put on the wire.
type outMsg struct {
	req  *request // a response (CQE, maybe data); nil for the kinds below
	r2t  *nvme.R2T
	cqe  nvme.CQE // a bare response (AER completion) when req and r2t are nil
	term []byte   // a C2HTermReq, then close
}

// conn is one NVMe/TCP connection, i.e. one queue.
type conn struct {
	t       *Target
	nc      net.Conn
	br      *bufio.Reader
	bw      *bufio.Writer
	digest  uint8
	hdr     [nvme.CapsuleCmdHLen + nvme.DigestLen]byte
	scratch [nvme.DigestLen]byte

	ctrl  *controller
	qid   uint16
	depth int
	auth  *connAuth // nil: the queue needs no authentication

	smu   sync.Mutex
	slots []*request
	free  []uint16
	sqhd  uint32

	out       chan outMsg
	done      chan struct{}
	closeOnce sync.Once
	work      chan *request
	workers   sync.WaitGroup
	writerWG  sync.WaitGroup
	wbuf      []byte

	// drain: an I/O queue counts in its subsystem's quiesce accounting
	// (subsystem.drains) from the moment it is known dead (teardown, or its
	// controller's shutdown) until its workers have finished; see
	// beginDrain. dropped counts queued commands never executed.
	drainOnce  sync.Once
	drainKey   hostKey
	drainSub   *subsystem
	drainStart time.Time
	dropped    atomic.Int64
}

func newConn(t *Target, nc net.Conn) *conn {
	c := &conn{t: t, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), bw: bufio.NewWriterSize(nc, 64<<10),
		out: make(chan outMsg, 2*adminQueueDepth+8), done: make(chan struct{})}
	c.setDepth(adminQueueDepth)
	return c
}

func (c *conn) setDepth(n int) {
	c.smu.Lock()
	defer c.smu.Unlock()
	c.depth = n
	c.slots = make([]*request, n)
	c.free = c.free[:0]
	for i := n - 1; i >= 0; i-- {
		c.free = append(c.free, uint16(i))
	}
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.done) // first: a closing queue's ID may be reused at once
		c.nc.Close()
	})
}

func (c *conn) closing() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *conn) remote() string {
	if a := c.nc.RemoteAddr(); a != nil {
		return a.String()
	}
	return "?"
}

// serve runs the connection until it fails or is closed.
func (c *conn) serve() {
	defer c.teardown()
	_ = c.nc.SetReadDeadline(time.Now().Add(connectTimeout))
	if err := c.handshake(); err != nil {
		c.t.warnLimited("icreq:"+c.remote(), "NVMe/TCP connection setup failed", "remote", c.remote(), "err", err)
		return
	}
	c.writerWG.Add(1)
	go c.writer()
	for {
		if err := c.readPDU(); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				c.t.warnLimited("conn:"+c.remote(), "NVMe/TCP connection closed", "remote", c.remote(), "qid", c.qid, "err", err)
			}
			return
		}
	}
}

// teardown ends the connection: it is the command lifetime rule's target
// half (docs/FABRIC.md, "Command lifetime"). Commands queued for the
// workers but not started are dropped — never executed, the device never
// sees them — and teardown waits for those already executing. Until they
// have finished the queue counts as draining, and its host cannot connect
// a new I/O queue to the subsystem (see connect), so a command of this
// connection can never run after the host's retry of it on a new one.
func (c *conn) teardown() {
	c.close()
	if c.work != nil {
		c.beginDrain(c.ctrl)
		close(c.work)
		c.workers.Wait()
		c.endDrain()
	}
	c.writerWG.Wait()
	if ctrl := c.ctrl; ctrl != nil {
		if c.qid == 0 {
			ctrl.shutdown()
		} else {
			ctrl.mu.Lock()
			if ctrl.ioq[c.qid] == c {
				delete(ctrl.ioq, c.qid)
			}
			ctrl.mu.Unlock()
		}
	}
}

// terminate sends a C2HTermReq and returns an error that ends the
// connection. hdr is the offending header.
func (c *conn) terminate(fes uint16, fei uint32, hdr []byte, why string) error {
	term := nvme.TermReq{Type: nvme.PDUC2HTermReq, FES: fes, FEI: fei, Data: hdr}.Append(nil)
	select {
	case c.out <- outMsg{term: term}:
		// The writer sends it after what is queued, then closes.
		select {
		case <-c.done:
		case <-time.After(2 * time.Second):
		}
	case <-c.done:
	}
	return fmt.Errorf("%s (FES %#x, FEI %d): %w", why, fes, fei, errTerminated)
}

func (c *conn) handshake() error {
	b := c.hdr[:nvme.CommonHeaderLen]
	if _, err := io.ReadFull(c.br, b); err != nil {
		return err
	}
	h, err := nvme.ParseHeader(b)
	if err != nil || h.Type != nvme.PDUICReq || h.PLen != nvme.ICReqLen {
		c.writeDirect(nvme.TermReq{Type: nvme.PDUC2HTermReq, FES: nvme.FESInvalidHeader, Data: b}.Append(nil))
		return fmt.Errorf("first PDU is not a 128-byte ICReq (type %#x, plen %d)", b[0], h.PLen)
	}
	full := make([]byte, nvme.ICReqLen)
	copy(full, b)
	if _, err := io.ReadFull(c.br, full[nvme.CommonHeaderLen:]); err != nil {
		return err
	}
	req, _ := nvme.ParseICReq(full)
	if req.PFV != 0 {
		c.writeDirect(nvme.TermReq{Type: nvme.PDUC2HTermReq, FES: nvme.FESInvalidHeader, FEI: 8, Data: full}.Append(nil))
		return fmt.Errorf("ICReq PFV %d, only 0 is supported", req.PFV)
	}
	if req.HPDA != 0 {
		c.writeDirect(nvme.TermReq{Type: nvme.PDUC2HTermReq, FES: nvme.FESUnsupportedParam, FEI: 10, Data: full}.Append(nil))
		return fmt.Errorf("ICReq HPDA %d, only 0 is supported", req.HPDA)
	}
	c.digest = req.Digest & (nvme.DigestHeader | nvme.DigestData)
	resp := nvme.ICResp{Digest: c.digest, MaxData: uint32(c.t.cfg.MaxDataTransfer)}.Append(nil)
	if _, err := c.nc.Write(resp); err != nil {
		return err
	}
	return nil
}

func (c *conn) writeDirect(b []byte) {
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.nc.Write(b)
}

func (c *conn) hdgst() int {
	if c.digest&nvme.DigestHeader != 0 {
		return nvme.DigestLen
	}
	return 0
}

// readPDU reads and handles one PDU from the host.
func (c *conn) readPDU() error {
	b := c.hdr[:nvme.CommonHeaderLen]
	if _, err := io.ReadFull(c.br, b); err != nil {
		return err
	}
	h, err := nvme.ParseHeader(b)
	if err != nil {
		fei := uint32(0)
		switch {
		case h.Type.HLen() == 0:
			fei = 0
		case int(h.HLen) != h.Type.HLen():
			fei = 2
		case h.PLen < uint32(h.HLen):
			fei = 4
		default:
			fei = 3
		}
		return c.terminate(nvme.FESInvalidHeader, fei, b, err.Error())
	}
	switch h.Type {
	case nvme.PDUH2CTermReq:
		n := int(h.PLen) - nvme.CommonHeaderLen
		if n > nvme.TermReqHLen+nvme.MaxTermReqData {
			n = nvme.TermReqHLen + nvme.MaxTermReqData
		}
		rest := make([]byte, n)
		_, _ = io.ReadFull(c.br, rest)
		tr, _ := nvme.ParseTermReq(append(append([]byte{}, b...), rest...))
		return fmt.Errorf("host sent H2CTermReq FES %#x FEI %d: %w", tr.FES, tr.FEI, errTerminated)
	case nvme.PDUCapsuleCmd, nvme.PDUH2CData:
	default:
		return c.terminate(nvme.FESInvalidHeader, 0, b, fmt.Sprintf("host sent a %v PDU", h.Type))
	}
	if (h.Flags&nvme.FlagHDGST != 0) != (c.digest&nvme.DigestHeader != 0) {
		return c.terminate(nvme.FESInvalidHeader, 1, b, "header digest flag disagrees with ICReq")
	}
	hd := c.hdgst()
	hb := c.hdr[:int(h.HLen)+hd]
	if _, err := io.ReadFull(c.br, hb[nvme.CommonHeaderLen:]); err != nil {
		return err
	}
	if hd != 0 && !nvme.CheckDigest(hb[:h.HLen], hb[h.HLen:]) {
		return c.terminate(nvme.FESHeaderDigest, 0, hb[:h.HLen], "header digest mismatch")
	}
	dataLen := h.DataLen()
	if dataLen < 0 || (dataLen > 0 && int(h.PDO) != int(h.HLen)+hd) {
		return c.terminate(nvme.FESInvalidHeader, 3, hb[:h.HLen], fmt.Sprintf("pdo %d / plen %d inconsistent", h.PDO, h.PLen))
	}
	if dataLen > 0 && (h.Flags&nvme.FlagDDGST != 0) != (c.digest&nvme.DigestData != 0) {
		return c.terminate(nvme.FESInvalidHeader, 1, hb[:h.HLen], "data digest flag disagrees with ICReq")
	}
	if h.Type == nvme.PDUH2CData {
		return c.readH2CData(h, hb[:h.HLen], dataLen)
	}
	return c.readCapsule(h, hb[:h.HLen], dataLen)
}

func (c *conn) inlineMax() int {
	if c.ctrl == nil {
		return max(adminInline, c.t.cfg.InlineDataSize)
	}
	if c.qid == 0 {
		return adminInline
	}
	return c.t.cfg.InlineDataSize
}

func (c *conn) allocSlot(r *request) bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	if len(c.free) == 0 {
		return false
	}
	s := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.slots[s] = r
	r.slot = s
	c.sqhd++
	if c.sqhd >= uint32(c.depth) {
		c.sqhd = 0
	}
	return true
}

func (c *conn) freeSlot(r *request) {
	c.smu.Lock()
	if int(r.slot) < len(c.slots) && c.slots[r.slot] == r {
		c.slots[r.slot] = nil
		c.free = append(c.free, r.slot)
	}
	c.smu.Unlock()
}

func (c *conn) readCapsule(h nvme.Header, hb []byte, dataLen int) error {
	sqe, _ := nvme.ParseSQE(hb[nvme.CommonHeaderLen:])
	if dataLen > c.inlineMax() {
		return c.terminate(nvme.FESDataLimitExceeded, 0, hb, fmt.Sprintf("%d bytes of in-capsule data, at most %d allowed", dataLen, c.inlineMax()))
	}
	r := reqPool.Get().(*request)
	*r = request{c: c, sqe: sqe}
	if !c.allocSlot(r) {
		reqPool.Put(r)
		return c.terminate(nvme.FESPDUSequence, 0, hb, fmt.Sprintf("more than %d commands outstanding", c.depth))
	}
	if dataLen > 0 {
		r.buf = c.t.pools.get(dataLen)
		r.data = r.buf.b
		r.inCapsule = true
		if _, err := io.ReadFull(c.br, r.data); err != nil {
			return err
		}
		if c.digest&nvme.DigestData != 0 {
			if _, err := io.ReadFull(c.br, c.scratch[:]); err != nil {
				return err
			}
			if !nvme.CheckDigest(r.data, c.scratch[:]) {
				c.complete(r, nvme.StatusTransientTransport)
				return nil
			}
		}
	}
	c.start(r)
	return nil
}

func (c *conn) readH2CData(h nvme.Header, hb []byte, dataLen int) error {
	p, err := nvme.ParseDataPDU(hb)
	if err != nil {
		return c.terminate(nvme.FESInvalidHeader, 16, hb, err.Error())
	}
	// Check the slot under the lock: a request that is not waiting for data
	// may be completing on the writer, which frees its slot (under the lock)
	// before recycling it. A waiting request is touched by this reader only.
	c.smu.Lock()
	var r *request
	if int(p.TTag) < len(c.slots) {
		r = c.slots[p.TTag]
	}
	valid := r != nil && r.waiting && r.sqe.CID == p.CID
	c.smu.Unlock()
	if !valid {
		return c.terminate(nvme.FESInvalidHeader, 10, hb, fmt.Sprintf("H2CData for unknown transfer tag %d / CID %d", p.TTag, p.CID))
	}
	if p.Length > uint32(c.t.cfg.MaxDataTransfer) {
		return c.terminate(nvme.FESDataLimitExceeded, 16, hb, fmt.Sprintf("H2CData of %d bytes exceeds MAXH2CDATA", p.Length))
	}
	if p.Offset != r.rcvd || uint64(p.Offset)+uint64(p.Length) > uint64(r.want) || dataLen == 0 {
		return c.terminate(nvme.FESDataOutOfRange, 12, hb, fmt.Sprintf("H2CData offset %d length %d, expected offset %d of %d", p.Offset, p.Length, r.rcvd, r.want))
	}
	dst := r.data[p.Offset : p.Offset+p.Length]
	if _, err := io.ReadFull(c.br, dst); err != nil {
		return err
	}
	if c.digest&nvme.DigestData != 0 {
		if _, err := io.ReadFull(c.br, c.scratch[:]); err != nil {
			return err
		}
		if !nvme.CheckDigest(dst, c.scratch[:]) {
			r.xferErr = nvme.StatusTransientTransport
		}
	}
	r.rcvd += p.Length
	if r.rcvd == r.want {
		r.waiting = false
		if r.xferErr != 0 {
			c.complete(r, r.xferErr)
			return nil
		}
		c.dispatch(r)
	}
	return nil
}

// dataDir returns the data direction of a command: 1 host to controller,
// 2 controller to host, 0 none, 3 bidirectional.
func dataDir(s *nvme.SQE) uint8 {
	if s.Opcode == nvme.AdminFabrics {
		return s.FCType() & 3
	}
	return s.Opcode & 3
}

// start validates the data descriptor of a new command, requests its data
// with an R2T when it is not in the capsule, and dispatches it.
func (c *conn) start(r *request) {
	s := &r.sqe
	if c.ctrl == nil && !(s.Opcode == nvme.AdminFabrics && s.FCType() == nvme.FabricsConnect) {
		c.complete(r, nvme.StatusCmdSeqError|nvme.StatusDNR)
		return
	}
	if c.ctrl != nil {
		c.ctrl.touch()
	}
	if c.auth != nil && !c.auth.admits(s) {
		c.complete(r, nvme.StatusAuthRequired|nvme.StatusDNR)
		return
	}
	sgl := s.DPTR
	switch dataDir(s) {
	case 1:
		switch sgl.Type {
		case nvme.SGLTypeInCapsule:
			if sgl.Addr != 0 {
				c.complete(r, nvme.StatusSGLInvalidOffset|nvme.StatusDNR)
				return
			}
			if int(sgl.Length) != len(r.data) {
				c.complete(r, nvme.StatusSGLInvalidData|nvme.StatusDNR)
				return
			}
		case nvme.SGLTypeTransport:
			if r.inCapsule {
				c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
				return
			}
			if sgl.Length == 0 {
				break
			}
			if int64(sgl.Length) > int64(c.t.cfg.MaxDataTransfer) {
				c.complete(r, nvme.StatusInvalidField|nvme.StatusDNR)
				return
			}
			r.buf = c.t.pools.get(int(sgl.Length))
			r.data = r.buf.b
			r.want, r.waiting = sgl.Length, true
			select {
			case c.out <- outMsg{r2t: &nvme.R2T{CID: r.sqe.CID, TTag: r.slot, Length: r.want}}:
			case <-c.done:
			}
			return
		default:
			c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
			return
		}
	case 2:
		if sgl.Length > 0 && sgl.Type != nvme.SGLTypeTransport {
			c.complete(r, nvme.StatusSGLInvalidType|nvme.StatusDNR)
			return
		}
		if int64(sgl.Length) > int64(c.t.cfg.MaxDataTransfer) {
			c.complete(r, nvme.StatusInvalidField|nvme.StatusDNR)
			return
		}
	}
	c.dispatch(r)
}

// dispatch runs a command whose data has arrived: admin and fabrics
// commands inline, I/O commands on the queue's workers.
func (c *conn) dispatch(r *request) {
	if c.qid == 0 || c.work == nil || r.sqe.Opcode == nvme.CmdFabrics {
		c.t.execute(r)
		return
	}
	select {
	case c.work <- r:
	case <-c.done:
		c.drop(r) // the connection died before the command was queued
	}
}

func (c *conn) startWorkers(n int) {
	c.work = make(chan *request, c.depth)
	for i := 0; i < n; i++ {
		c.workers.Add(1)
		go func() {
			defer c.workers.Done()
			for r := range c.work {
				if c.closing() {
					// the connection is dead: its host has given up
					// on this command and may resubmit it elsewhere
					c.drop(r)
					continue
				}
				c.t.execute(r)
			}
		}()
	}
}

// drop discards a command of a closed connection without executing it.
func (c *conn) drop(r *request) {
	c.dropped.Add(1)
	c.freeSlot(r)
	c.t.pools.put(r.buf)
	*r = request{}
	reqPool.Put(r)
}

// hostKey names a host as reservations and the quiesce rule do: host NQN
// and host identifier.
type hostKey struct {
	nqn string
	id  [16]byte
}

// beginDrain counts the I/O queue c of ctrl as draining in its subsystem
// (once; called by teardown and by the controller's shutdown, whichever
// comes first). endDrain, after the workers stopped, ends it.
func (c *conn) beginDrain(ctrl *controller) {
	if ctrl == nil {
		return
	}
	c.drainOnce.Do(func() {
		c.drainSub, c.drainKey, c.drainStart = ctrl.sub, hostKey{ctrl.hostNQN, ctrl.hostID}, time.Now()
		ctrl.sub.mu.Lock()
		ctrl.sub.drains[c.drainKey]++
		ctrl.sub.mu.Unlock()
	})
}

func (c *conn) endDrain() {
	c.drainOnce.Do(func() {}) // a queue never counted stays uncounted
	if s := c.drainSub; s != nil {
		s.mu.Lock()
		if s.drains[c.drainKey]--; s.drains[c.drainKey] <= 0 {
			delete(s.drains, c.drainKey)
		}
		close(s.drained)
		s.drained = make(chan struct{})
		s.mu.Unlock()
		c.drainSub = nil
		if d := time.Since(c.drainStart); d > c.t.cfg.CommandQuiesceTime && c.ctrl != nil {
			c.t.log.Warn("commands of a dead I/O queue outlived the advertised command quiesce time; a host may have resubmitted them already",
				"cntlid", c.ctrl.id, "qid", c.qid, "hostnqn", c.ctrl.hostNQN, "drain", d.Round(time.Millisecond), "cqt", c.t.cfg.CommandQuiesceTime)
		}
	}
	if n := c.dropped.Load(); n > 0 && c.ctrl != nil {
		c.t.log.Info("dropped the commands queued on a closed I/O queue; they were never executed",
			"cntlid", c.ctrl.id, "qid", c.qid, "hostnqn", c.ctrl.hostNQN, "dropped", n)
	}
}

// complete sends the response of r with status st (and, on success, the
// sendLen bytes of r.data).
func (c *conn) complete(r *request, st nvme.Status) {
	r.cqe.CID = r.sqe.CID
	r.cqe.Status = st
	if !st.OK() {
		r.sendLen = 0
	}
	select {
	case c.out <- outMsg{req: r}:
	case <-c.done:
	}
}

// sendCQE sends a completion that has no request (AER).
func (c *conn) sendCQE(cqe nvme.CQE) {
	select {
	case c.out <- outMsg{cqe: cqe}:
	case <-c.done:
	default:
		// The writer is backed up; deliver without holding the caller.
		go func() {
			select {
			case c.out <- outMsg{cqe: cqe}:
			case <-c.done:
			}
		}()
	}
}

// writer owns the socket's write side: it turns outMsgs into PDUs,
// batching them into one flush while more are queued.
func (c *conn) writer() {
	defer c.writerWG.Done()
	for {
		var m outMsg
		select {
		case m = <-c.out:
		case <-c.done:
			return
		}
		for {
			if err := c.writeMsg(m); err != nil {
				c.close()
				return
			}
			select {
			case m = <-c.out:
				continue
			default:
			}
			break
		}
		if err := c.bw.Flush(); err != nil {
			c.close()
			return
		}
	}
}

func (c *conn) writeMsg(m outMsg) error {
	if m.term != nil {
		_, _ = c.bw.Write(m.term)
		_ = c.bw.Flush()
		c.close()
		return errTerminated
	}
	if m.r2t != nil {
		c.wbuf = m.r2t.Append(c.wbuf[:0], c.digest)
		_, err := c.bw.Write(c.wbuf)
		return err
	}
	r := m.req
	if r == nil {
		m.cqe.SQID = c.qid
		m.cqe.SQHead = c.sqHead()
		c.wbuf = nvme.AppendCapsuleResp(c.wbuf[:0], &m.cqe, c.digest)
		_, err := c.bw.Write(c.wbuf)
		return err
	}
	c.freeSlot(r)
	var err error
	if r.sendLen > 0 {
		d := r.data[:r.sendLen]
		c.wbuf = nvme.DataPDU{Type: nvme.PDUC2HData, Flags: nvme.FlagDataLast, CID: r.sqe.CID, Length: uint32(len(d))}.Append(c.wbuf[:0], c.digest)
		if _, err = c.bw.Write(c.wbuf); err == nil {
			if _, err = c.bw.Write(d); err == nil && c.digest&nvme.DigestData != 0 {
				c.wbuf = nvme.AppendDigest(c.wbuf[:0], d)
				_, err = c.bw.Write(c.wbuf)
			}
		}
	}
	if err == nil {
		r.cqe.SQID = c.qid
		r.cqe.SQHead = c.sqHead()
		c.wbuf = nvme.AppendCapsuleResp(c.wbuf[:0], &r.cqe, c.digest)
		_, err = c.bw.Write(c.wbuf)
	}
	closeConn := r.closeConn
	c.t.pools.put(r.buf)
	*r = request{}
	reqPool.Put(r)
	if err == nil && closeConn {
		_ = c.bw.Flush()
		c.close()
		return errTerminated
	}
	return err
}

func (c *conn) sqHead() uint16 {
	c.smu.Lock()
	defer c.smu.Unlock()
	return uint16(c.sqhd)
}
