package target

import (
	"encoding/binary"

	"tier0/daemon/nvme"
)

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
				var d []byte
				if r.loan == nil {
					d = r.data[:r.sendLen]
				}
				// With SQ flow control disabled by the host, a successful
				// read ends with C2HData SUCCESS and no CapsuleResp, as
				// Linux nvmet and SPDK do: the response carries nothing
				// else (no SQ head, no result).
				success := c.noSQFlow && r.cqe.Status.OK() && r.cqe.Result == 0 && !r.closeConn
				flags := nvme.FlagDataLast
				if success {
					flags |= nvme.FlagDataSuccess
				}
				hdrs = nvme.DataPDU{Type: nvme.PDUC2HData, Flags: flags, CID: r.sqe.CID, Length: uint32(r.sendLen)}.Append(hdrs, c.digest)
				iov = append(iov, hdrs[start:])
				if r.loan != nil {
					iov = append(iov, r.iov...)
				} else {
					iov = append(iov, d)
				}
				if c.digest&nvme.DigestData != 0 {
					start = len(hdrs)
					if r.loan != nil {
						crc := uint32(0)
						for _, b := range r.iov {
							crc = nvme.UpdateCRC32C(crc, b)
						}
						hdrs = binary.LittleEndian.AppendUint32(hdrs, crc)
					} else {
						hdrs = nvme.AppendDigest(hdrs, d)
					}
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
		if r.loan != nil {
			r.loan.Return()
		}
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
