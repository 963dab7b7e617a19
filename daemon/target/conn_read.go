package target

import (
	"fmt"

	"tier0/daemon/nvme"
)

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

// dataInBuffer reports whether the H2CData PDU p, of dataLen bytes, may
// be used where it lies in the read buffer instead of being copied to the
// request's buffer: it is the whole data of a write to a memory
// namespace (whose commands only wait for the CPU) that will run inline,
// it is all buffered (with its digest), and the watchdog's take-over is
// not under way. Such a write runs before the reader reads again (the
// batch runs once no whole PDU is buffered), and its batch is never
// handed to the workers (onWatch), so the buffer is not overwritten
// while the device reads it.
func (c *conn) dataInBuffer(r *request, p nvme.DataPDU, dataLen int) bool {
	if p.Offset != 0 || p.Length != r.want || r.sqe.Opcode != nvme.CmdWrite || c.qid == 0 || c.work == nil || c.rd != nil {
		return false
	}
	need := dataLen
	if c.digest&nvme.DigestData != 0 {
		need += nvme.DigestLen
	}
	if c.br.Buffered() < need || c.stalled.Load() != 0 {
		return false
	}
	l := c.latOf(r.sqe.NSID)
	return l != nil && l.mem && l.fast()
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
	var dst []byte
	if c.dataInBuffer(r, p, dataLen) {
		// the whole transfer is buffered and the write runs inline
		// before the next read: it writes from the read buffer
		dst, _ = c.br.Peek(dataLen)
		_, _ = c.br.Discard(dataLen)
		c.t.pools.put(r.buf)
		r.buf, r.data, r.inBuf = nil, dst, true
		c.emu.Lock()
		c.bufData = true
		c.emu.Unlock()
	} else {
		dst = r.data[p.Offset : p.Offset+p.Length]
		if err := c.readData(dst); err != nil {
			return err
		}
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
