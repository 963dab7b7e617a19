package host

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// errConnLost is the transport-level failure of one queue's connection
// (transport.ErrQueueLost, over either transport). The commands in flight
// on it fail with it (wrapped with blockdev.ErrIO by the callers) and the
// controller reconnects.
var errConnLost = transport.ErrQueueLost

// slot is the per-CID state of one command in flight. Slots are reused: a
// CID is taken from queue.free, its slot filled, and the CID returned once
// the submitter has read the result.
type slot struct {
	rbuf   []byte // C2HData destination (the caller's buffer)
	wbuf   []byte // data sent on R2T
	cqe    nvme.CQE
	err    error
	done   chan struct{} // buffered 1: signalled once per command
	start  atomic.Int64  // unix nanos when submitted, 0 when idle
	hdr    [nvme.CapsuleCmdHLen + nvme.DigestLen]byte
	dd     [nvme.DigestLen]byte // in-capsule data digest
	rcvd   int                  // bytes of C2HData received
	active bool                 // guarded by queue.rmu
	// h2c counts R2Ts of this command queued for or being answered by
	// the sender goroutine; wait returns only after it drops to zero, so
	// the caller never gets its buffer back while it is still being read
	// (a completion or a connection failure can overtake the sender).
	h2c sync.WaitGroup
}

// queue is one NVMe/TCP connection, the TCP transport's
// transport.Queue: the admin queue (qid 0) or an I/O queue. Many commands are in flight at once, tagged by CID; one reader
// goroutine per queue receives completions, data and R2Ts. Senders write
// through a shared bufio.Writer; the first sender of a burst becomes the
// flusher: it yields once, so that the goroutines woken by the same batch
// of completions queue their commands, and then writes them all with one
// flush. The others only queue.
type queue struct {
	qid       uint16
	conn      net.Conn
	log       *slog.Logger
	digest    uint8 // nvme.DigestHeader | nvme.DigestData as negotiated
	maxH2C    uint32
	inlineMax int // most bytes of in-capsule write data

	wmu      sync.Mutex
	bw       *bufio.Writer
	flushing bool                 // a sender will flush what is buffered; guarded by wmu
	scratch  []byte               // H2CData header scratch, guarded by wmu
	h2cdd    [nvme.DigestLen]byte // H2CData digest scratch, guarded by wmu

	br    *bufio.Reader
	rmu   sync.Mutex
	slots []slot
	free  chan uint16

	// R2Ts are answered by a sender goroutine so that the reader never
	// blocks on a full socket send buffer while the controller waits for
	// us to read.
	r2t        chan r2tReq
	h2cDone    chan struct{} // closed when h2cLoop returned
	readerDone chan struct{} // closed when readLoop returned

	dead     chan struct{}
	deadOnce sync.Once
	deadErr  error
}

type r2tReq struct {
	wbuf []byte // the command's data, captured while it is in flight
	r    nvme.R2T
	s    *slot // its h2c count is released once the R2T is answered
}

// tcpTransport is the NVMe/TCP transport of Options (Dialer, digests,
// DialTimeout), the default Options.Transport.
type tcpTransport struct{ o *Options }

func (t tcpTransport) Name() string { return "tcp" }
func (t tcpTransport) MaxData() int { return 0 }

func (t tcpTransport) DialQueue(ctx context.Context, addr string, p transport.Params) (transport.Queue, error) {
	q, err := dialQueue(ctx, t.o, addr, p.QID, p.Depth)
	if err != nil {
		return nil, err
	}
	q.inlineMax = p.InlineMax
	return q, nil
}

// dialQueue connects one queue: TCP connect, ICReq/ICResp exchange, start
// of the reader goroutine. The Fabrics Connect command is the caller's.
func dialQueue(ctx context.Context, o *Options, addr string, qid uint16, depth int) (*queue, error) {
	dctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	conn, err := o.Dialer(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connecting queue %d to %s: %w", qid, addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	q := &queue{qid: qid, conn: conn, log: o.Logger.With("addr", addr, "qid", qid), dead: make(chan struct{})}
	var want uint8
	if o.HeaderDigest {
		want |= nvme.DigestHeader
	}
	if o.DataDigest {
		want |= nvme.DigestData
	}
	deadline, _ := dctx.Deadline()
	conn.SetDeadline(deadline)
	req := nvme.ICReq{Digest: want}.Append(make([]byte, 0, nvme.ICReqLen))
	if _, err := conn.Write(req); err != nil {
		conn.Close()
		return nil, fmt.Errorf("sending ICReq on queue %d to %s: %w", qid, addr, err)
	}
	resp := make([]byte, nvme.ICRespLen)
	if _, err := io.ReadFull(conn, resp); err != nil {
		conn.Close()
		return nil, fmt.Errorf("reading ICResp on queue %d from %s: %w", qid, addr, err)
	}
	ic, err := nvme.ParseICResp(resp)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ICResp from %s: %w", addr, err)
	}
	if ic.PFV != 0 || ic.CPDA != 0 {
		conn.Close()
		return nil, fmt.Errorf("ICResp from %s: pfv %d cpda %d, this host supports pfv 0 and cpda 0 only", addr, ic.PFV, ic.CPDA)
	}
	if ic.Digest != want {
		conn.Close()
		return nil, fmt.Errorf("ICResp from %s: digests %#x, asked for %#x (header digest %v, data digest %v)", addr, ic.Digest, want, o.HeaderDigest, o.DataDigest)
	}
	if ic.MaxData < 4096 {
		conn.Close()
		return nil, fmt.Errorf("ICResp from %s: maxh2cdata %d, the specification requires at least 4096", addr, ic.MaxData)
	}
	conn.SetDeadline(time.Time{})
	q.init(ic.Digest, ic.MaxData, depth)
	return q, nil
}

// init sets up an initialized connection and starts its goroutines.
func (q *queue) init(digest uint8, maxH2C uint32, depth int) {
	q.digest = digest
	q.maxH2C = maxH2C
	q.inlineMax = 8192 - nvme.SQELen
	q.bw = bufio.NewWriterSize(q.conn, 64<<10)
	q.br = bufio.NewReaderSize(q.conn, 64<<10)
	q.scratch = make([]byte, 0, nvme.DataHLen+nvme.DigestLen)
	q.slots = make([]slot, depth)
	q.free = make(chan uint16, depth)
	for i := range q.slots {
		q.slots[i].done = make(chan struct{}, 1)
		q.free <- uint16(i)
	}
	q.r2t = make(chan r2tReq, depth)
	q.h2cDone = make(chan struct{})
	q.readerDone = make(chan struct{})
	go q.readLoop()
	go q.h2cLoop()
}

// fail tears the connection down. The commands in flight fail once the
// reader and the H2C sender have stopped touching their buffers (see
// readLoop), so that a caller never gets its buffer back while the queue
// may still write into it.
func (q *queue) Fail(err error) {
	q.deadOnce.Do(func() {
		q.deadErr = err
		close(q.dead)
		q.conn.Close()
	})
}

// failSlots fails every command in flight; called by the reader after it
// and the H2C sender stopped.
func (q *queue) failSlots() {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	for i := range q.slots {
		s := &q.slots[i]
		if s.active {
			s.active = false
			s.err = q.deadErr
			s.done <- struct{}{}
		}
	}
}

// Done is closed when the queue failed.
func (q *queue) Done() <-chan struct{} { return q.dead }

// Err is why the queue failed (nil while it works).
func (q *queue) Err() error {
	if !q.isDead() {
		return nil
	}
	return q.deadErr
}

// QID is the queue's ID (0: admin).
func (q *queue) QID() uint16 { return q.qid }

// Depth is the number of commands in flight at most.
func (q *queue) Depth() int { return len(q.slots) }

func (q *queue) isDead() bool {
	select {
	case <-q.dead:
		return true
	default:
		return false
	}
}

// submit sends c on q and waits for its completion. It returns the CQE, or
// an error wrapping errConnLost when the connection failed first. A
// non-zero NVMe status is not an error here; callers interpret cqe.Status.
func submit(q transport.Queue, c transport.Command) (nvme.CQE, error) {
	cid, err := q.Start(c, true)
	if err != nil {
		return nvme.CQE{}, err
	}
	return q.Wait(cid)
}

// Start sends c and returns its CID; Wait collects the completion. With
// flush false the command may stay in the write buffer until a later Start
// with flush true (a caller issuing a batch flushes with the last one).
// Write data of c.InCapsule commands (Fabrics Connect) and of at most
// inlineMax bytes goes in the capsule, other data on R2T.
func (q *queue) Start(c transport.Command, flush bool) (uint16, error) {
	var cid uint16
	select {
	case cid = <-q.free:
	default:
		// the queue is full: push out what is buffered (our own unflushed
		// batch included) before blocking for a free slot
		q.wmu.Lock()
		q.bw.Flush()
		q.wmu.Unlock()
		select {
		case cid = <-q.free:
		case <-q.dead:
			return 0, fmt.Errorf("queue %d: %w: %v", q.qid, errConnLost, q.deadErr)
		}
	}
	s := &q.slots[cid]
	s.rbuf, s.wbuf, s.err, s.rcvd = c.Read, c.Write, nil, 0
	sqe := c.SQE
	sqe.CID = cid
	sqe.Flags |= nvme.SQEFlagSGLMeta
	inline := 0
	switch {
	case len(c.Write) > 0 && (len(c.Write) <= q.inlineMax || c.InCapsule):
		inline = len(c.Write)
		sqe.DPTR = nvme.SGL{Length: uint32(inline), Type: nvme.SGLTypeInCapsule}
	case len(c.Write) > 0:
		sqe.DPTR = nvme.SGL{Length: uint32(len(c.Write)), Type: nvme.SGLTypeTransport}
	case len(c.Read) > 0:
		sqe.DPTR = nvme.SGL{Length: uint32(len(c.Read)), Type: nvme.SGLTypeTransport}
	default:
		sqe.DPTR = nvme.SGL{Type: nvme.SGLTypeTransport}
	}
	hdr := nvme.AppendCapsuleCmd(s.hdr[:0], &sqe, inline, q.digest)
	if inline > 0 && q.digest&nvme.DigestData != 0 {
		binary.LittleEndian.PutUint32(s.dd[:], nvme.CRC32C(c.Write))
	}

	q.rmu.Lock()
	if q.isDead() {
		q.rmu.Unlock()
		q.free <- cid
		return 0, fmt.Errorf("queue %d: %w: %v", q.qid, errConnLost, q.deadErr)
	}
	s.active = true
	if !c.NoTimeout {
		s.start.Store(time.Now().UnixNano())
	}
	q.rmu.Unlock()

	q.wmu.Lock()
	_, err := q.bw.Write(hdr)
	if err == nil && inline > 0 {
		_, err = q.bw.Write(c.Write)
		if err == nil && q.digest&nvme.DigestData != 0 {
			_, err = q.bw.Write(s.dd[:])
		}
	}
	lead := err == nil && flush && !q.flushing
	if lead {
		q.flushing = true
	}
	q.wmu.Unlock()
	if lead {
		// let the other senders that are ready now queue behind us
		runtime.Gosched()
		q.wmu.Lock()
		q.flushing = false
		err = q.bw.Flush()
		q.wmu.Unlock()
	}
	if err != nil {
		q.Fail(fmt.Errorf("writing to the socket: %w", err))
	}
	return cid, nil
}

// Wait waits for the completion of a command started with Start and frees
// its CID.
func (q *queue) Wait(cid uint16) (nvme.CQE, error) {
	s := &q.slots[cid]
	<-s.done
	s.h2c.Wait()
	cqe, err := s.cqe, s.err
	if err != nil {
		// failed by the reader on its way out (failSlots): it and the
		// H2C sender can no longer touch the buffers; let it finish
		<-q.readerDone
	}
	s.rbuf, s.wbuf = nil, nil
	s.start.Store(0)
	q.free <- cid
	if err != nil {
		return cqe, fmt.Errorf("queue %d: %w: %v", q.qid, errConnLost, err)
	}
	return cqe, nil
}

// Oldest returns how long the oldest command in flight has waited, or 0.
// Commands submitted with noTimeout (the AER) are not counted.
func (q *queue) Oldest(now time.Time) time.Duration {
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

// complete finishes the command in slot cid (called by the reader).
func (q *queue) complete(cid uint16, cqe nvme.CQE) error {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if int(cid) >= len(q.slots) || !q.slots[cid].active {
		return fmt.Errorf("completion for cid %d that is not in flight", cid)
	}
	s := &q.slots[cid]
	s.active = false
	s.cqe = cqe
	s.done <- struct{}{}
	return nil
}

func (q *queue) activeSlot(cid uint16) (*slot, error) {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if int(cid) >= len(q.slots) || !q.slots[cid].active {
		return nil, fmt.Errorf("PDU for cid %d that is not in flight", cid)
	}
	return &q.slots[cid], nil
}

// readLoop receives PDUs until the connection fails.
func (q *queue) readLoop() {
	err := q.read()
	q.Fail(err)
	<-q.h2cDone
	q.failSlots()
	close(q.readerDone)
}

func (q *queue) read() error {
	var hb [nvme.ICRespLen + nvme.DigestLen]byte
	var dd [nvme.DigestLen]byte
	for {
		if _, err := io.ReadFull(q.br, hb[:nvme.CommonHeaderLen]); err != nil {
			return fmt.Errorf("reading a PDU header: %w", err)
		}
		hlen := int(hb[2])
		if hlen < nvme.CommonHeaderLen || hlen > nvme.ICRespLen {
			return fmt.Errorf("PDU type %#x with hlen %d", hb[0], hlen)
		}
		hd := 0
		if hb[1]&nvme.FlagHDGST != 0 {
			hd = nvme.DigestLen
		}
		if _, err := io.ReadFull(q.br, hb[nvme.CommonHeaderLen:hlen+hd]); err != nil {
			return fmt.Errorf("reading a PDU header: %w", err)
		}
		h, err := nvme.ParseHeader(hb[:hlen])
		if err != nil {
			return err
		}
		if hd > 0 && !nvme.CheckDigest(hb[:hlen], hb[hlen:hlen+hd]) {
			return fmt.Errorf("%v PDU: header digest mismatch", h.Type)
		}
		if (hd > 0) != (q.digest&nvme.DigestHeader != 0) && h.Type != nvme.PDUC2HTermReq {
			return fmt.Errorf("%v PDU: header digest flag %v disagrees with the negotiated digests", h.Type, hd > 0)
		}
		if (h.Type == nvme.PDUCapsuleResp || h.Type == nvme.PDUR2T) && int(h.PLen) != hlen+hd {
			return fmt.Errorf("%v PDU: plen %d, want %d (no data)", h.Type, h.PLen, hlen+hd)
		}
		switch h.Type {
		case nvme.PDUCapsuleResp:
			cqe, err := nvme.ParseCapsuleResp(hb[:hlen])
			if err != nil {
				return err
			}
			if err := q.complete(cqe.CID, cqe); err != nil {
				return err
			}
		case nvme.PDUC2HData:
			p, err := nvme.ParseDataPDU(hb[:hlen])
			if err != nil {
				return err
			}
			if pad := int(h.PDO) - hlen - hd; pad > 0 {
				if _, err := q.br.Discard(pad); err != nil {
					return err
				}
			}
			s, err := q.activeSlot(p.CID)
			if err != nil {
				return err
			}
			end := uint64(p.Offset) + uint64(p.Length)
			if end > uint64(len(s.rbuf)) {
				return fmt.Errorf("C2HData cid %d: offset %d length %d past the %d-byte buffer", p.CID, p.Offset, p.Length, len(s.rbuf))
			}
			dst := s.rbuf[p.Offset:end]
			if _, err := io.ReadFull(q.br, dst); err != nil {
				return fmt.Errorf("reading C2HData: %w", err)
			}
			if h.Flags&nvme.FlagDDGST != 0 {
				if _, err := io.ReadFull(q.br, dd[:]); err != nil {
					return err
				}
				if !nvme.CheckDigest(dst, dd[:]) {
					return fmt.Errorf("C2HData cid %d offset %d: data digest mismatch", p.CID, p.Offset)
				}
			}
			s.rcvd += int(p.Length)
			if h.Flags&nvme.FlagDataSuccess != 0 {
				if h.Flags&nvme.FlagDataLast == 0 {
					return fmt.Errorf("C2HData cid %d: SUCCESS without LAST", p.CID)
				}
				if err := q.complete(p.CID, nvme.CQE{CID: p.CID, SQID: q.qid}); err != nil {
					return err
				}
			}
		case nvme.PDUR2T:
			r, err := nvme.ParseR2T(hb[:hlen])
			if err != nil {
				return err
			}
			s, err := q.activeSlot(r.CID)
			if err != nil {
				return err
			}
			if uint64(r.Offset)+uint64(r.Length) > uint64(len(s.wbuf)) || r.Length == 0 {
				return fmt.Errorf("R2T cid %d: offset %d length %d outside the %d-byte write", r.CID, r.Offset, r.Length, len(s.wbuf))
			}
			s.h2c.Add(1)
			select {
			case q.r2t <- r2tReq{wbuf: s.wbuf, r: r, s: s}:
			default:
				s.h2c.Done()
				return fmt.Errorf("R2T cid %d: more R2Ts outstanding than commands in flight", r.CID)
			}
		case nvme.PDUC2HTermReq:
			// the header holds FES and FEI; the rest (the offending
			// header) is not needed, and the connection ends anyway
			if hlen < nvme.TermReqHLen {
				return fmt.Errorf("C2HTermReq with hlen %d", hlen)
			}
			return fmt.Errorf("controller terminated the connection: C2HTermReq fes %#x fei %#x",
				binary.LittleEndian.Uint16(hb[8:]), binary.LittleEndian.Uint32(hb[10:]))
		default:
			return fmt.Errorf("unexpected %v PDU from the controller", h.Type)
		}
	}
}

// h2cLoop answers R2Ts until the queue dies.
func (q *queue) h2cLoop() {
	defer close(q.h2cDone)
	// On the way out, release the R2Ts still queued: their commands fail
	// with the connection, and their buffers must not be read any more.
	defer func() {
		for {
			select {
			case req := <-q.r2t:
				req.s.h2c.Done()
			default:
				return
			}
		}
	}()
	for {
		select {
		case req := <-q.r2t:
			var err error
			if !q.isDead() {
				err = q.sendH2C(req.wbuf, req.r)
			}
			req.s.h2c.Done()
			if err != nil {
				q.Fail(fmt.Errorf("sending H2CData: %w", err))
				return
			}
		case <-q.dead:
			return
		}
	}
}

// sendH2C answers an R2T with H2CData PDUs of at most maxH2C bytes.
func (q *queue) sendH2C(wbuf []byte, r nvme.R2T) error {
	end := uint64(r.Offset) + uint64(r.Length)
	if end > uint64(len(wbuf)) || r.Length == 0 {
		return fmt.Errorf("R2T cid %d: offset %d length %d outside the %d-byte write", r.CID, r.Offset, r.Length, len(wbuf))
	}
	q.wmu.Lock()
	defer q.wmu.Unlock()
	off := uint64(r.Offset)
	dd := q.h2cdd[:]
	for off < end {
		n := end - off
		if n > uint64(q.maxH2C) {
			n = uint64(q.maxH2C)
		}
		p := nvme.DataPDU{Type: nvme.PDUH2CData, CID: r.CID, TTag: r.TTag, Offset: uint32(off), Length: uint32(n)}
		if off+n == end {
			p.Flags = nvme.FlagDataLast
		}
		q.scratch = p.Append(q.scratch[:0], q.digest)
		data := wbuf[off : off+n]
		if _, err := q.bw.Write(q.scratch); err != nil {
			return err
		}
		if _, err := q.bw.Write(data); err != nil {
			return err
		}
		if q.digest&nvme.DigestData != 0 {
			binary.LittleEndian.PutUint32(dd, nvme.CRC32C(data))
			if _, err := q.bw.Write(dd); err != nil {
				return err
			}
		}
		off += n
	}
	if !q.flushing {
		return q.bw.Flush()
	}
	return nil // a sender is about to flush it
}
