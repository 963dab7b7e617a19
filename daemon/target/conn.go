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

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// connectTimeout bounds the time from accept to a successful Connect, so a
// peer that never connects cannot hold a connection open.
var connectTimeout = 10 * time.Second

// connectTimeout is Config.ConnectTimeout, or the package default.
func (t *Target) connectTimeout() time.Duration {
	if t.cfg.ConnectTimeout > 0 {
		return t.cfg.ConnectTimeout
	}
	return connectTimeout
}

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
	// A read of a device that lends its memory (blockdev.Lender): the data
	// to send is iov, slices of the device's memory held by loan, which is
	// returned only after the write that carried them (release).
	loan blockdev.Loan
	iov  [][]byte
	lent [4][]byte // iov's backing for up to 4 slices
	// A write whose data is a slice of the connection's read buffer
	// (readH2CData): it runs inline, before the reader reads again.
	inBuf     bool
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
	inlineBlock = 2 * time.Microsecond
	inlineMax   = 200 * time.Microsecond
	stallAfter  = time.Millisecond
)

// inlineLimit (nanoseconds) is a variable for tests, whose preconditions
// need a namespace judged fast however loaded the machine that runs them;
// atomic, as a previous test's connections may still be ending.
var inlineLimit atomic.Int64

func init() { inlineLimit.Store(int64(30 * time.Microsecond)) }

// newWatch starts the inline watchdog's timer (a variable for tests, which
// let it fire before the reader stored it).
var newWatch = time.AfterFunc

// nsLat holds moving averages of one namespace's execution time on one
// queue (reads and writes; 1/8 weight per command): per command and per
// 4 KiB, in nanoseconds.
type nsLat struct {
	nsid   uint32
	mem    bool // the namespace's device is held in memory (blockdev.Lender) when first seen
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
	return a < inlineLimit.Load() || (a < int64(inlineMax) && l.perBlk.Load() < int64(inlineBlock))
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
	bufData  bool           // the batch has writes whose data is in the read buffer (never handed over)
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
	_ = c.nc.SetReadDeadline(time.Now().Add(c.t.connectTimeout()))
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

// directRead is the least data, beyond what the read buffer holds, that
// readData reads from the socket straight into its destination.
const directRead = 16 << 10

// readData fills p, the data of a PDU, like readFull; when more than
// directRead bytes of it are still to come, it copies what the read
// buffer holds and reads the rest from the socket straight into p (the
// request's buffer), saving the copy through the read buffer (a 128 KiB
// write's H2CData).
func (c *conn) readData(p []byte) error {
	n := c.br.Buffered()
	if len(p)-n < directRead {
		return c.readFull(p)
	}
	if _, err := io.ReadFull(c.br, p[:n]); err != nil {
		return err
	}
	c.unplug()
	_, err := io.ReadFull(c.nc, p[n:])
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
