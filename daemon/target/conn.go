package target

import (
	"bufio"
	"encoding/binary"
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
	lat       *nsLat  // the latency average of its namespace (reads, writes)
	rd        rdmaReq // NVMe/RDMA: keyed SGL and data buffer (rdma_conn.go)
}

var reqPool = sync.Pool{New: func() any { return new(request) }}

// pauseWorker, queued to the workers, makes the one that takes it wait for
// a stalled inline command to finish (see takeOver).
var pauseWorker = new(request)

// outItem is one thing to put on the wire.
type outItem struct {
	req   *request // a response (CQE, maybe data); nil for the kinds below
	r2t   nvme.R2T // when isR2T
	cqe   nvme.CQE // a bare response (AER completion)
	term  []byte   // a C2HTermReq, then close
	isR2T bool
}

// Inline execution (see dispatch and runBatch): a read or write whose
// namespace answers fast is run by the reader itself, between parsing the
// PDUs of one wake-up and writing their answers; others go to the queue's
// workers. Fast: under inlineLimit per command on average, or, for large
// transfers, under inlineBlock per 4 KiB and inlineMax per command (a
// memory copy, which costs a worker the same CPU, not a wait for a drive).
// An inline command that runs for longer than stallAfter (checked twice,
// so up to twice that) hands the reader's role to a new goroutine: the
// rest of its batch goes to the workers, the answers already made are
// written, and no further command of the queue runs inline until it
// returned.
const (
	inlineLimit = 30 * time.Microsecond
	inlineBlock = 2 * time.Microsecond
	inlineMax   = 200 * time.Microsecond
	stallAfter  = time.Millisecond
)

// newWatch starts the inline watchdog's timer (a variable for tests, which
// let it fire before the reader stored it).
var newWatch = time.AfterFunc

// nsLat holds moving averages of one namespace's execution time on one
// queue (reads and writes; 1/8 weight per command): per command and per
// 4 KiB, in nanoseconds.
type nsLat struct {
	nsid   uint32
	avg    atomic.Int64
	perBlk atomic.Int64
}

func (l *nsLat) add(d time.Duration, bytes uint32) {
	// a lost update between two workers is harmless
	old := l.avg.Load()
	l.avg.Store(old + (int64(d)-old)/8)
	pb := int64(d) / int64(max(1, bytes/4096))
	old = l.perBlk.Load()
	l.perBlk.Store(old + (pb-old)/8)
}

// fast reports whether the namespace's commands may run inline.
func (l *nsLat) fast() bool {
	a := l.avg.Load()
	return a < int64(inlineLimit) || (a < int64(inlineMax) && l.perBlk.Load() < int64(inlineBlock))
}

// connectNoSQFlow is the Connect attribute by which a host disables SQ
// flow control (CATTR bit 2).
const connectNoSQFlow = 1 << 2

// errHandedOff: this goroutine no longer holds the reader's role.
var errHandedOff = errors.New("reader role handed off")

// conn is one NVMe/TCP connection, i.e. one queue.
type conn struct {
	t       *Target
	nc      net.Conn
	br      *bufio.Reader
	digest  uint8
	hdr     [nvme.CapsuleCmdHLen + nvme.DigestLen]byte
	scratch [nvme.DigestLen]byte

	rd    *rdmaQueue // an NVMe/RDMA queue (rdma_conn.go); nc then stands in for a stream
	ctrl  *controller
	qid   uint16
	depth int
	auth  *connAuth // nil: the queue needs no authentication

	smu   sync.Mutex
	slots []*request
	free  []uint16
	sqhd  uint32

	done      chan struct{}
	closeOnce sync.Once
	work      chan *request
	workers   sync.WaitGroup
	unpause   chan struct{} // one per pauseWorker, when its stalled command returned
	torn      chan struct{} // closed when teardown finished

	// The output (emit, writeOut): answers queue in oq; the goroutine that
	// finds no writer becomes it and writes everything queued with one
	// writev per round. The reader holds the writer's role while it parses
	// and executes the PDUs of one wake-up (oplug), so that their answers
	// leave together.
	omu      sync.Mutex
	oidle    sync.Cond // signalled when owriting drops
	oq       []outItem
	ospare   []outItem
	owriting bool        // a goroutine holds the writer's role
	oplug    bool        // the reader holds it (it writes when its batch is done)
	oplugReq bool        // the reader wants it when the present writer is done
	odead    bool        // nothing more is written; queued items are released
	noSQFlow bool        // the host disabled SQ flow control in Connect (writer only)
	hdrs     []byte      // PDU headers of one round (writer only)
	iov      [][]byte    // what one round writes (writer only)
	wv       net.Buffers // iov, consumed by WriteTo

	// inline execution, see runBatch and takeOver
	emu      sync.Mutex
	batch    []*request // parsed commands to run inline (the reader's)
	bi       int        // next one to run
	inBatch  bool
	execSeq  uint64 // inline commands started
	watchSeq uint64 // execSeq when the watchdog last looked
	gen      uint64 // the reader's generation; a take-over increments it
	stopped  bool   // teardown began: no more take-overs
	watch    *time.Timer
	stalled  atomic.Int32   // inline commands that outlived stallAfter, still running
	execWG   sync.WaitGroup // those commands (teardown waits for them)
	lat      []*nsLat

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
	c := &conn{t: t, nc: nc, br: bufio.NewReaderSize(nc, 256<<10), done: make(chan struct{}), torn: make(chan struct{})}
	c.oidle.L = &c.omu
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
	_ = c.nc.SetReadDeadline(time.Now().Add(connectTimeout))
	if err := c.handshake(); err != nil {
		c.t.warnLimited("icreq:"+c.remote(), "NVMe/TCP connection setup failed", "remote", c.remote(), "err", err)
		c.teardown()
		return
	}
	if c.readLoop(0) == errHandedOff {
		<-c.torn // another goroutine reads now, and tears down at the end
	}
}

// readLoop holds the reader's role of generation gen: it parses every
// complete PDU the read buffer holds, runs the commands gathered for
// inline execution, writes the answers of the wake-up, and reads again.
// It tears the connection down when reading fails, and returns
// errHandedOff when a stalled inline command made it give up its role.
func (c *conn) readLoop(gen uint64) error {
	c.plug()
	for {
		err := c.readPDU()
		if err == nil && c.pduBuffered() {
			continue
		}
		if err == nil {
			if !c.runBatch(gen) {
				return errHandedOff
			}
			c.unplug()
			continue
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			c.t.warnLimited("conn:"+c.remote(), "NVMe/TCP connection closed", "remote", c.remote(), "qid", c.qid, "err", err)
		}
		c.teardown()
		return err
	}
}

// pduBuffered reports whether the read buffer holds a whole PDU.
func (c *conn) pduBuffered() bool {
	n := c.br.Buffered()
	if n < nvme.CommonHeaderLen {
		return false
	}
	b, _ := c.br.Peek(nvme.CommonHeaderLen)
	return uint32(n) >= binary.LittleEndian.Uint32(b[4:])
}

// readFull fills p from the connection. Before it waits for the socket it
// writes what the reader holds, and takes the writer's role again after.
func (c *conn) readFull(p []byte) error {
	if c.br.Buffered() >= len(p) {
		_, err := io.ReadFull(c.br, p)
		return err
	}
	c.unplug()
	_, err := io.ReadFull(c.br, p)
	c.plug()
	return err
}

// teardown ends the connection: it is the command lifetime rule's target
// half (docs/FABRIC.md, "Command lifetime"). Commands queued for the
// workers or for inline execution but not started are dropped — never
// executed, the device never sees them — and teardown waits for those
// already executing. Until they have finished the queue counts as
// draining, and its host cannot connect a new I/O queue to the subsystem
// (see connect), so a command of this connection can never run after the
// host's retry of it on a new one. A request's buffer returns to its pool
// only once no write of it is in progress.
func (c *conn) teardown() {
	c.close()
	c.emu.Lock()
	c.stopped = true
	for _, r := range c.batch[c.bi:] {
		c.drop(r)
	}
	c.batch, c.bi, c.inBatch = nil, 0, false
	if c.watch != nil {
		c.watch.Stop()
	}
	c.emu.Unlock()
	if c.work != nil {
		c.beginDrain(c.ctrl)
		close(c.work)
		c.workers.Wait()
		c.execWG.Wait()
		c.endDrain()
	}
	c.execWG.Wait()
	c.omu.Lock()
	c.odead = true
	if c.oplug {
		c.oplug, c.owriting = false, false
	}
	c.oplugReq = false
	for c.owriting {
		c.oidle.Wait()
	}
	q := c.oq
	c.oq = nil
	c.omu.Unlock()
	for i := range q {
		c.release(&q[i])
	}
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
	close(c.torn)
}

// terminate sends a C2HTermReq and returns an error that ends the
// connection. hdr is the offending header. Called by the reader.
func (c *conn) terminate(fes uint16, fei uint32, hdr []byte, why string) error {
	term := nvme.TermReq{Type: nvme.PDUC2HTermReq, FES: fes, FEI: fei, Data: hdr}.Append(nil)
	// The writer sends it after what is queued, then closes.
	c.emit(outItem{term: term})
	c.unplug()
	select {
	case <-c.done:
	case <-time.After(2 * time.Second):
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
	if err := c.readFull(b); err != nil {
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
		_ = c.readFull(rest)
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
	if err := c.readFull(hb[nvme.CommonHeaderLen:]); err != nil {
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
		if err := c.readFull(r.data); err != nil {
			return err
		}
		if c.digest&nvme.DigestData != 0 {
			if err := c.readFull(c.scratch[:]); err != nil {
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
	if err := c.readFull(dst); err != nil {
		return err
	}
	if c.digest&nvme.DigestData != 0 {
		if err := c.readFull(c.scratch[:]); err != nil {
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
	if c.rd != nil {
		c.rd.start(r)
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
			c.emit(outItem{isR2T: true, r2t: nvme.R2T{CID: r.sqe.CID, TTag: r.slot, Length: r.want}})
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
// commands at once, reads and writes of a namespace that answers fast
// inline after the PDUs of this wake-up are parsed (runBatch), other I/O
// commands on the queue's workers.
func (c *conn) dispatch(r *request) {
	if c.qid == 0 || c.work == nil || r.sqe.Opcode == nvme.CmdFabrics {
		c.t.execute(r)
		return
	}
	if op := r.sqe.Opcode; op == nvme.CmdRead || op == nvme.CmdWrite {
		r.lat = c.latOf(r.sqe.NSID)
		if r.lat != nil && c.stalled.Load() == 0 && r.lat.fast() {
			c.batch = append(c.batch, r)
			return
		}
	}
	select {
	case c.work <- r:
	case <-c.done:
		c.drop(r) // the connection died before the command was queued
	}
}

// latOf returns the latency average of namespace nsid on this queue (nil
// past the first 8 namespaces: their commands always go to the workers).
// Called by the reader.
func (c *conn) latOf(nsid uint32) *nsLat {
	for _, l := range c.lat {
		if l.nsid == nsid {
			return l
		}
	}
	if len(c.lat) >= 8 {
		return nil
	}
	l := &nsLat{nsid: nsid}
	c.lat = append(c.lat, l)
	return l
}

// runBatch executes the commands gathered for inline execution, under the
// watchdog (onWatch). It returns false when this reader (generation gen)
// lost its role while it executed one.
func (c *conn) runBatch(gen uint64) bool {
	if len(c.batch) == 0 {
		return true
	}
	// The timer is started and stored under c.emu: it may fire before the
	// store (a descheduled reader), and onWatch, a take-over's reader and
	// teardown read c.watch under c.emu too.
	c.emu.Lock()
	c.inBatch, c.bi, c.watchSeq = true, 0, c.execSeq
	if c.watch == nil {
		c.watch = newWatch(stallAfter, c.onWatch)
	} else {
		c.watch.Reset(stallAfter)
	}
	c.emu.Unlock()
	t0 := time.Now()
	for {
		c.emu.Lock()
		if c.gen != gen {
			// a stalled command: the batch went to the workers and a new
			// reader took over (takeOver); this goroutine only finishes
			c.emu.Unlock()
			c.stalled.Add(-1)
			c.unpause <- struct{}{}
			c.execWG.Done()
			return false
		}
		if c.bi == len(c.batch) {
			c.inBatch = false
			c.batch, c.bi = c.batch[:0], 0
			c.emu.Unlock()
			break
		}
		r := c.batch[c.bi]
		c.bi++
		c.execSeq++
		c.emu.Unlock()
		if c.closing() {
			c.drop(r)
			continue
		}
		l, n := r.lat, r.sqe.DPTR.Length // r is recycled once its answer is written
		c.t.execute(r)
		t1 := time.Now()
		if l != nil {
			l.add(t1.Sub(t0), n)
		}
		t0 = t1
	}
	c.watch.Stop()
	return true
}

// onWatch is the inline watchdog: it hands the reader's role over when the
// command the reader executes has not changed since its last look.
func (c *conn) onWatch() {
	c.emu.Lock()
	defer c.emu.Unlock()
	if !c.inBatch || c.stopped {
		return
	}
	if c.execSeq != c.watchSeq {
		c.watchSeq = c.execSeq
		c.watch.Reset(stallAfter)
		return
	}
	c.takeOverLocked()
}

// takeOverLocked (c.emu held) gives the role of the reader stalled in an
// inline command to a new goroutine. The rest of its batch goes to the
// workers, behind a pauseWorker that keeps one worker idle until the
// stalled command returns (so that no more commands execute at once than
// the queue has workers), and the answers it holds are written.
func (c *conn) takeOverLocked() {
	c.gen++
	c.stalled.Add(1)
	c.execWG.Add(1)
	c.work <- pauseWorker // never blocks: room for depth commands and depth pauses
	for _, r := range c.batch[c.bi:] {
		c.work <- r
	}
	c.batch, c.bi, c.inBatch = nil, 0, false
	gen := c.gen
	c.omu.Lock()
	own := c.oplug
	c.oplug, c.oplugReq = false, false
	c.omu.Unlock()
	if own {
		go c.writeOut()
	}
	go c.readLoop(gen) //nolint:errcheck // it ends the connection itself
}

func (c *conn) startWorkers(n int) {
	c.work = make(chan *request, 2*c.depth)
	c.unpause = make(chan struct{}, c.depth)
	for i := 0; i < n; i++ {
		c.workers.Add(1)
		go func() {
			defer c.workers.Done()
			for r := range c.work {
				if r == pauseWorker {
					<-c.unpause
					continue
				}
				if c.closing() {
					// the connection is dead: its host has given up
					// on this command and may resubmit it elsewhere
					c.drop(r)
					continue
				}
				l, n, t0 := r.lat, r.sqe.DPTR.Length, time.Now() // r is recycled once its answer is written
				c.t.execute(r)
				if l != nil {
					l.add(time.Since(t0), n)
				}
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
	if c.rd != nil {
		c.rd.complete(r, st)
		return
	}
	r.cqe.CID = r.sqe.CID
	r.cqe.Status = st
	if !st.OK() {
		r.sendLen = 0
	}
	c.emit(outItem{req: r})
}

// sendCQE sends a completion that has no request (AER), without holding
// the caller on the socket.
func (c *conn) sendCQE(cqe nvme.CQE) {
	if c.rd != nil {
		c.rd.sendCQE(cqe)
		return
	}
	if c.queue(outItem{cqe: cqe}) {
		go c.writeOut()
	}
}

// emit queues it for the wire; the caller writes it (and whatever else is
// queued) when no other goroutine holds the writer's role.
func (c *conn) emit(it outItem) {
	if c.queue(it) {
		c.writeOut()
	}
}

// queue adds it to the output and reports whether the caller took the
// writer's role.
func (c *conn) queue(it outItem) bool {
	c.omu.Lock()
	if c.odead {
		c.omu.Unlock()
		c.release(&it)
		return false
	}
	c.oq = append(c.oq, it)
	if c.owriting {
		c.omu.Unlock()
		return false
	}
	c.owriting = true
	c.omu.Unlock()
	return true
}

// plug makes the reader the writer for the batch it is about to parse (or
// the next writer, when another goroutine is writing now).
func (c *conn) plug() {
	c.omu.Lock()
	if !c.odead {
		if !c.owriting {
			c.owriting, c.oplug = true, true
		} else if !c.oplug {
			c.oplugReq = true
		}
	}
	c.omu.Unlock()
}

// unplug writes what the reader held back.
func (c *conn) unplug() {
	c.omu.Lock()
	c.oplugReq = false
	own := c.oplug
	c.oplug = false
	c.omu.Unlock()
	if own {
		c.writeOut()
	}
}

// writeOut writes everything queued, one writev per round, until the
// queue is empty; the caller holds the writer's role and gives it up (or
// hands it to the reader that asked for it) on return. A request's
// buffer and the request itself are recycled only after the write that
// carried them returned.
func (c *conn) writeOut() {
	for {
		c.omu.Lock()
		if len(c.oq) == 0 || c.odead {
			if c.oplugReq && !c.odead {
				c.oplugReq, c.oplug = false, true
			} else {
				c.owriting = false
				c.oidle.Broadcast()
			}
			c.omu.Unlock()
			return
		}
		items := c.oq
		c.oq, c.ospare = c.ospare[:0], nil
		c.omu.Unlock()
		end, err := c.writeItems(items)
		for i := range items {
			c.release(&items[i])
			items[i] = outItem{}
		}
		c.omu.Lock()
		if c.ospare == nil {
			c.ospare = items[:0]
		}
		if err != nil || end {
			c.odead = true
		}
		c.omu.Unlock()
		if err != nil || end {
			c.close()
		}
	}
}

// writeItems puts items on the wire with one vectored write: headers from
// c.hdrs, data from the requests' own buffers. end reports a TermReq or a
// response that ends the connection (what follows it is not written).
func (c *conn) writeItems(items []outItem) (end bool, err error) {
	if need := len(items) * 64; cap(c.hdrs) < need {
		c.hdrs = make([]byte, 0, 2*need)
	}
	hdrs, iov := c.hdrs[:0], c.iov[:0]
	for i := range items {
		m := &items[i]
		start := len(hdrs)
		switch {
		case m.term != nil:
			iov = append(iov, m.term)
			end = true
		case m.isR2T:
			hdrs = m.r2t.Append(hdrs, c.digest)
			iov = append(iov, hdrs[start:])
		case m.req == nil:
			m.cqe.SQID = c.qid
			m.cqe.SQHead = c.sqHead()
			hdrs = nvme.AppendCapsuleResp(hdrs, &m.cqe, c.digest)
			iov = append(iov, hdrs[start:])
		default:
			r := m.req
			c.freeSlot(r)
			if r.sqe.Opcode == nvme.AdminFabrics && r.sqe.FCType() == nvme.FabricsConnect && r.cqe.Status.OK() {
				c.noSQFlow = nvme.ParseConnectCmd(&r.sqe).CAttr&connectNoSQFlow != 0
			}
			if r.sendLen > 0 {
				d := r.data[:r.sendLen]
				// With SQ flow control disabled by the host, a successful
				// read ends with C2HData SUCCESS and no CapsuleResp, as
				// Linux nvmet and SPDK do: the response carries nothing
				// else (no SQ head, no result).
				success := c.noSQFlow && r.cqe.Status.OK() && r.cqe.Result == 0 && !r.closeConn
				flags := nvme.FlagDataLast
				if success {
					flags |= nvme.FlagDataSuccess
				}
				hdrs = nvme.DataPDU{Type: nvme.PDUC2HData, Flags: flags, CID: r.sqe.CID, Length: uint32(len(d))}.Append(hdrs, c.digest)
				iov = append(iov, hdrs[start:], d)
				if c.digest&nvme.DigestData != 0 {
					start = len(hdrs)
					hdrs = nvme.AppendDigest(hdrs, d)
					iov = append(iov, hdrs[start:])
				}
				if success {
					continue
				}
				start = len(hdrs)
			}
			r.cqe.SQID = c.qid
			r.cqe.SQHead = c.sqHead()
			hdrs = nvme.AppendCapsuleResp(hdrs, &r.cqe, c.digest)
			iov = append(iov, hdrs[start:])
			end = r.closeConn
		}
		if end {
			break
		}
	}
	c.hdrs, c.iov = hdrs, iov
	c.wv = iov
	_, err = c.wv.WriteTo(c.nc)
	clear(iov)
	return end, err
}

// release recycles the request and buffer of an item that was written or
// will never be.
func (c *conn) release(m *outItem) {
	if r := m.req; r != nil {
		c.freeSlot(r)
		c.t.pools.put(r.buf)
		*r = request{}
		reqPool.Put(r)
	}
}

func (c *conn) sqHead() uint16 {
	c.smu.Lock()
	defer c.smu.Unlock()
	return uint16(c.sqhd)
}
