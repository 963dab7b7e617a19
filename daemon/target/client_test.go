package target

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"tier0/daemon/nvme"
)

// rawClient is a minimal NVMe/TCP host for tests: one connection (queue),
// one command at a time unless the test drives PDUs itself.
type rawClient struct {
	t      testing.TB
	nc     net.Conn
	br     *bufio.Reader
	digest uint8
	cid    uint16
	maxH2C uint32
	// h2cChunk splits H2C data into PDUs of at most this many bytes.
	h2cChunk int
}

func dialRaw(t testing.TB, addr string, digest uint8) *rawClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &rawClient{t: t, nc: nc, br: bufio.NewReader(nc), digest: digest}
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := nc.Write(nvme.ICReq{Digest: digest}.Append(nil)); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, nvme.ICRespLen)
	if _, err := io.ReadFull(c.br, b); err != nil {
		t.Fatalf("reading ICResp: %v", err)
	}
	resp, err := nvme.ParseICResp(b)
	if err != nil {
		t.Fatalf("ICResp: %v", err)
	}
	if resp.Digest != digest || resp.CPDA != 0 || resp.PFV != 0 || resp.MaxData < 4096 || resp.MaxData%4 != 0 {
		t.Fatalf("ICResp %+v does not satisfy the Linux host (digest %d asked)", resp, digest)
	}
	c.maxH2C = resp.MaxData
	return c
}

// pdu is one PDU read from the target.
type pdu struct {
	h    nvme.Header
	hdr  []byte
	data []byte
}

func (c *rawClient) readPDU() (pdu, error) {
	b := make([]byte, nvme.CommonHeaderLen)
	if _, err := io.ReadFull(c.br, b); err != nil {
		return pdu{}, err
	}
	h, err := nvme.ParseHeader(b)
	if err != nil {
		return pdu{}, fmt.Errorf("target sent a bad header % x: %w", b, err)
	}
	rest := make([]byte, int(h.PLen)-nvme.CommonHeaderLen)
	if _, err := io.ReadFull(c.br, rest); err != nil {
		return pdu{}, err
	}
	full := append(b, rest...)
	p := pdu{h: h, hdr: full[:h.HLen]}
	if h.Type == nvme.PDUC2HTermReq {
		p.data = full[h.HLen:]
		return p, nil
	}
	if (h.Flags&nvme.FlagHDGST != 0) != (c.digest&nvme.DigestHeader != 0) {
		return p, fmt.Errorf("%v: HDGST flag %v, negotiated %v", h.Type, h.Flags&nvme.FlagHDGST != 0, c.digest&nvme.DigestHeader != 0)
	}
	if h.Flags&nvme.FlagHDGST != 0 && !nvme.CheckDigest(full[:h.HLen], full[h.HLen:]) {
		return p, fmt.Errorf("%v: bad header digest", h.Type)
	}
	if n := h.DataLen(); n > 0 {
		p.data = full[h.PDO : int(h.PDO)+n]
		if h.Flags&nvme.FlagDDGST != 0 && !nvme.CheckDigest(p.data, full[int(h.PDO)+n:]) {
			return p, fmt.Errorf("%v: bad data digest", h.Type)
		}
		if (h.Flags&nvme.FlagDDGST != 0) != (c.digest&nvme.DigestData != 0) {
			return p, fmt.Errorf("%v: DDGST flag disagrees with negotiation", h.Type)
		}
	}
	return p, nil
}

func (c *rawClient) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// sendCapsule sends sqe with in-capsule data.
func (c *rawClient) sendCapsule(sqe *nvme.SQE, data []byte) {
	b := nvme.AppendCapsuleCmd(nil, sqe, len(data), c.digest)
	b = append(b, data...)
	if len(data) > 0 && c.digest&nvme.DigestData != 0 {
		b = nvme.AppendDigest(b, data)
	}
	c.write(b)
}

// result is a completed command.
type result struct {
	cqe  nvme.CQE
	data []byte
}

// do runs one command: out is host-to-controller data (in the capsule
// when inCapsule, else by R2T); data read from the target is returned.
func (c *rawClient) do(sqe nvme.SQE, out []byte, inCapsule bool) result {
	c.t.Helper()
	r, err := c.try(sqe, out, inCapsule)
	if err != nil {
		c.t.Fatalf("command opcode %#x: %v", sqe.Opcode, err)
	}
	return r
}

func (c *rawClient) try(sqe nvme.SQE, out []byte, inCapsule bool) (result, error) {
	_ = c.nc.SetDeadline(time.Now().Add(20 * time.Second))
	c.cid++
	sqe.CID = c.cid
	sqe.Flags |= nvme.SQEFlagSGLMeta
	if out != nil {
		sqe.DPTR.Length = uint32(len(out))
		if inCapsule {
			sqe.DPTR.Type = nvme.SGLTypeInCapsule
			c.sendCapsule(&sqe, out)
		} else {
			sqe.DPTR.Type = nvme.SGLTypeTransport
			c.sendCapsule(&sqe, nil)
		}
	} else {
		if sqe.DPTR.Type == 0 {
			sqe.DPTR.Type = nvme.SGLTypeTransport
		}
		c.sendCapsule(&sqe, nil)
	}
	var res result
	for {
		p, err := c.readPDU()
		if err != nil {
			return res, err
		}
		switch p.h.Type {
		case nvme.PDUR2T:
			r2t, err := nvme.ParseR2T(p.hdr)
			if err != nil {
				return res, err
			}
			if r2t.CID != sqe.CID || uint64(r2t.Offset)+uint64(r2t.Length) > uint64(len(out)) {
				return res, fmt.Errorf("bad R2T %+v for CID %d with %d bytes", r2t, sqe.CID, len(out))
			}
			c.sendH2C(sqe.CID, r2t, out)
		case nvme.PDUC2HData:
			d, err := nvme.ParseDataPDU(p.hdr)
			if err != nil {
				return res, err
			}
			if d.CID != sqe.CID || int(d.Offset) != len(res.data) {
				return res, fmt.Errorf("C2HData %+v unexpected (have %d bytes)", d, len(res.data))
			}
			res.data = append(res.data, p.data...)
		case nvme.PDUCapsuleResp:
			cqe, err := nvme.ParseCapsuleResp(p.hdr)
			if err != nil {
				return res, err
			}
			if cqe.CID != sqe.CID {
				return res, fmt.Errorf("response for CID %d, waiting for %d", cqe.CID, sqe.CID)
			}
			res.cqe = cqe
			return res, nil
		case nvme.PDUC2HTermReq:
			tr, _ := nvme.ParseTermReq(append(p.hdr, p.data...))
			return res, fmt.Errorf("target terminated: FES %#x FEI %d", tr.FES, tr.FEI)
		default:
			return res, fmt.Errorf("unexpected %v", p.h.Type)
		}
	}
}

func (c *rawClient) sendH2C(cid uint16, r2t nvme.R2T, out []byte) {
	chunk := int(c.maxH2C)
	if c.h2cChunk > 0 && c.h2cChunk < chunk {
		chunk = c.h2cChunk
	}
	for off := r2t.Offset; off < r2t.Offset+r2t.Length; {
		n := min(uint32(chunk), r2t.Offset+r2t.Length-off)
		flags := uint8(0)
		if off+n == r2t.Offset+r2t.Length {
			flags = nvme.FlagDataLast
		}
		d := out[off : off+n]
		b := nvme.DataPDU{Type: nvme.PDUH2CData, Flags: flags, CID: cid, TTag: r2t.TTag, Offset: off, Length: n}.Append(nil, c.digest)
		b = append(b, d...)
		if c.digest&nvme.DigestData != 0 {
			b = nvme.AppendDigest(b, d)
		}
		c.write(b)
		off += n
	}
}

var (
	testHostID  = [16]byte{0xAA, 1}
	testHostID2 = [16]byte{0xBB, 2}
)

const (
	testHostNQN  = "nqn.2014-08.org.nvmexpress:uuid:host-one"
	testHostNQN2 = "nqn.2014-08.org.nvmexpress:uuid:host-two"
	testSubNQN   = "nqn.2026-01.io.tier0:array-a"
)

// connect sends Fabrics Connect and returns the CQE.
func (c *rawClient) connect(subnqn, hostnqn string, hostid [16]byte, qid, cntlid, sqsize uint16, kato uint32) nvme.CQE {
	c.t.Helper()
	d := nvme.ConnectData{HostID: hostid, CntlID: cntlid, SubNQN: subnqn, HostNQN: hostnqn}
	sqe := nvme.ConnectCmd{QID: qid, SQSize: sqsize, KATO: kato}.SQE(0)
	return c.do(sqe, d.Append(nil), true).cqe
}

func (c *rawClient) propSet(off uint32, v uint64) nvme.CQE {
	return c.do(nvme.PropertyCmd{Offset: off, Value: v}.SQE(0, true), nil, false).cqe
}

func (c *rawClient) propGet(off uint32, size8 bool) nvme.CQE {
	return c.do(nvme.PropertyCmd{Offset: off, Size8: size8}.SQE(0, false), nil, false).cqe
}

// enable sets CC.EN with 64/16-byte queue entries, as Linux does.
func (c *rawClient) enable() {
	c.t.Helper()
	if cqe := c.propSet(nvme.PropCC, 1|6<<16|4<<20); !cqe.Status.OK() {
		c.t.Fatalf("set CC: %v", cqe.Status)
	}
	if cqe := c.propGet(nvme.PropCSTS, false); cqe.DW0()&nvme.CSTSReady == 0 {
		c.t.Fatalf("CSTS %#x not ready after CC.EN", cqe.DW0())
	}
}

func (c *rawClient) identify(cns uint8, nsid uint32) result {
	return c.do(nvme.IdentifyCmd{CNS: cns, NSID: nsid}.SQE(0), nil, false)
}

func (c *rawClient) getLog(lid uint8, lsp uint8, n uint32, nsid uint32) result {
	s := nvme.GetLogPageCmd{LID: lid, LSP: lsp, Len: n, NSID: nsid}.SQE(0)
	return c.do(s, nil, false)
}

func (c *rawClient) setFeature(fid uint8, v uint32) nvme.CQE {
	return c.do(nvme.SQE{Opcode: nvme.AdminSetFeatures, CDW10: uint32(fid), CDW11: v}, nil, false).cqe
}

func rwSQE(op uint8, nsid uint32, slba uint64, nlb uint32) nvme.SQE {
	s := nvme.SQE{Opcode: op, NSID: nsid}
	s.SetRW(slba, nlb)
	return s
}

func (c *rawClient) read(nsid uint32, slba uint64, nlb uint32, bs int) result {
	s := rwSQE(nvme.CmdRead, nsid, slba, nlb)
	s.DPTR = nvme.SGL{Length: nlb * uint32(bs), Type: nvme.SGLTypeTransport}
	return c.do(s, nil, false)
}

func (c *rawClient) writeBlocks(nsid uint32, slba uint64, data []byte, bs int, inCapsule bool) result {
	s := rwSQE(nvme.CmdWrite, nsid, slba, uint32(len(data)/bs))
	return c.do(s, data, inCapsule)
}

// expectClosed waits for the target to end the connection, returning the
// TermReq it sent first, if any.
func (c *rawClient) expectClosed() *nvme.TermReq {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var term *nvme.TermReq
	for {
		p, err := c.readPDU()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatal("target did not close the connection")
			}
			return term
		}
		if p.h.Type == nvme.PDUC2HTermReq {
			tr, err := nvme.ParseTermReq(append(p.hdr, p.data...))
			if err != nil {
				c.t.Fatalf("bad TermReq: %v", err)
			}
			term = &tr
		}
	}
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
