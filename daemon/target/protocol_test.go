package target

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

func TestConnectRejections(t *testing.T) {
	tg, addr := newTarget(t, Config{}, nil)
	// A good host works throughout.
	good, cntlid := adminConnect(t, addr, 0, testHostNQN, testHostID)
	for _, tc := range []struct {
		name            string
		sub, host       string
		qid, cntl, sqsz uint16
		want            nvme.Status
		ipo             uint64
	}{
		{"host not allowed", testSubNQN, "nqn.intruder", 0, 0xFFFF, 31, nvme.StatusConnectInvalidHost | nvme.StatusDNR, 1<<16 | 512},
		{"unknown subsystem", "nqn.nope", testHostNQN, 0, 0xFFFF, 31, nvme.StatusConnectInvalidParam | nvme.StatusDNR, 1<<16 | 256},
		{"static cntlid", testSubNQN, testHostNQN, 0, 5, 31, nvme.StatusConnectInvalidParam | nvme.StatusDNR, 1<<16 | 16},
		{"sqsize zero", testSubNQN, testHostNQN, 0, 0xFFFF, 0, nvme.StatusConnectInvalidParam | nvme.StatusDNR, 44},
		{"I/O queue of unknown controller", testSubNQN, testHostNQN, 1, 0x999, 31, nvme.StatusConnectInvalidParam | nvme.StatusDNR, 1<<16 | 16},
		{"I/O queue of another host's controller", testSubNQN, testHostNQN2, 1, cntlid, 31, nvme.StatusConnectInvalidParam | nvme.StatusDNR, 1<<16 | 16},
		{"qid beyond granted queues", testSubNQN, testHostNQN, 100, cntlid, 31, nvme.StatusConnectInvalidParam | nvme.StatusDNR, 42},
	} {
		c := dialRaw(t, addr, 0)
		hid := testHostID
		if tc.host == testHostNQN2 {
			hid = testHostID2
		}
		cqe := c.connect(tc.sub, tc.host, hid, tc.qid, tc.cntl, tc.sqsz, 0)
		if cqe.Status != tc.want || cqe.Result != tc.ipo {
			t.Errorf("%s: status %v result %#x, want %v result %#x", tc.name, cqe.Status, cqe.Result, tc.want, tc.ipo)
		}
		// Still unconnected: anything but Connect is a sequence error.
		if r := c.identify(nvme.CNSController, 0); r.cqe.Status != nvme.StatusCmdSeqError|nvme.StatusDNR {
			t.Errorf("%s: command after failed connect: %v", tc.name, r.cqe.Status)
		}
	}
	// Disallowing a connected host disconnects it.
	if r := good.identify(nvme.CNSController, 0); !r.cqe.Status.OK() {
		t.Fatalf("good host broken by others' bad connects: %v", r.cqe.Status)
	}
	if err := tg.DisallowHost(testSubNQN, testHostNQN); err != nil {
		t.Fatal(err)
	}
	good.expectClosed()
}

// TestMalformedPDUs feeds bad PDUs and checks for a C2HTermReq and a
// closed connection, while a bystander connection keeps working.
func TestMalformedPDUs(t *testing.T) {
	_, addr := newTarget(t, Config{InlineDataSize: 4096}, nil)
	by, cntlid := adminConnect(t, addr, 0, testHostNQN2, testHostID2)
	byq := ioConnect(t, addr, 0, testHostNQN2, testHostID2, cntlid, 1)
	connected := func(digest uint8) *rawClient {
		a, id := adminConnect(t, addr, digest, testHostNQN, testHostID)
		_ = a
		return ioConnect(t, addr, digest, testHostNQN, testHostID, id, 1)
	}
	sqe := nvme.SQE{Opcode: nvme.CmdRead, NSID: 1, CID: 1, DPTR: nvme.SGL{Length: testBS, Type: nvme.SGLTypeTransport}}
	for _, tc := range []struct {
		name    string
		digest  uint8
		pre     bool // connect first
		payload func() []byte
		fes     uint16
	}{
		{"unknown PDU type", 0, true, func() []byte { return []byte{0x0B, 0, 24, 0, 24, 0, 0, 0} }, nvme.FESInvalidHeader},
		{"wrong hlen", 0, true, func() []byte { return []byte{4, 0, 70, 0, 72, 0, 0, 0} }, nvme.FESInvalidHeader},
		{"C2H type from host", 0, true, func() []byte { return nvme.R2T{}.Append(nil, 0) }, nvme.FESInvalidHeader},
		{"second ICReq", 0, true, func() []byte { return nvme.ICReq{}.Append(nil) }, nvme.FESInvalidHeader},
		{"in-capsule data over the limit", 0, true, func() []byte {
			s := sqe
			return append(nvme.AppendCapsuleCmd(nil, &s, 8192, 0), make([]byte, 8192)...)
		}, nvme.FESDataLimitExceeded},
		{"H2CData for no transfer", 0, true, func() []byte {
			return append(nvme.DataPDU{Type: nvme.PDUH2CData, CID: 9, TTag: 3, Length: 512}.Append(nil, 0), make([]byte, 512)...)
		}, nvme.FESInvalidHeader},
		{"header digest wrong", nvme.DigestHeader, true, func() []byte {
			s := sqe
			b := nvme.AppendCapsuleCmd(nil, &s, 0, nvme.DigestHeader)
			b[len(b)-1] ^= 0xFF
			return b
		}, nvme.FESHeaderDigest},
		{"digest flag missing", nvme.DigestHeader, true, func() []byte {
			s := sqe
			return nvme.AppendCapsuleCmd(nil, &s, 0, 0)
		}, nvme.FESInvalidHeader},
		{"pdo inside header", 0, true, func() []byte {
			s := sqe
			b := nvme.AppendCapsuleCmd(nil, &s, 16, 0)
			b[3] = 72 + 8
			b = append(b, make([]byte, 16)...)
			return b
		}, nvme.FESInvalidHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c *rawClient
			if tc.pre {
				c = connected(tc.digest)
			} else {
				c = dialRaw(t, addr, tc.digest)
			}
			c.write(tc.payload())
			term := c.expectClosed()
			if term == nil || term.FES != tc.fes {
				t.Fatalf("TermReq %+v, want FES %#x", term, tc.fes)
			}
			if r := byq.read(1, 0, 1, testBS); !r.cqe.Status.OK() {
				t.Fatalf("bystander I/O failed: %v", r.cqe.Status)
			}
		})
	}
	// A first PDU that is not an ICReq.
	nc := dialNoHandshake(t, addr)
	s := sqe
	nc.Write(nvme.AppendCapsuleCmd(nil, &s, 0, 0))
	if b, _ := readAllTimeout(nc); len(b) < nvme.TermReqHLen || nvme.PDUType(b[0]) != nvme.PDUC2HTermReq {
		t.Fatalf("non-ICReq first PDU: got % x", b)
	}
	// ICReq with HPDA != 0 is refused.
	nc = dialNoHandshake(t, addr)
	nc.Write(nvme.ICReq{HPDA: 3}.Append(nil))
	if b, _ := readAllTimeout(nc); len(b) < nvme.TermReqHLen || nvme.PDUType(b[0]) != nvme.PDUC2HTermReq {
		t.Fatalf("HPDA 3: got % x", b)
	}
	if r := by.identify(nvme.CNSController, 0); !r.cqe.Status.OK() {
		t.Fatalf("bystander admin queue broken: %v", r.cqe.Status)
	}
}

// TestHostTermReqAndDisconnect: a host TermReq or Fabrics Disconnect on an
// I/O queue closes that queue only.
func TestHostTermReqAndDisconnect(t *testing.T) {
	_, addr := newTarget(t, Config{}, nil)
	a, cntlid := adminConnect(t, addr, 0, testHostNQN, testHostID)
	q1 := ioConnect(t, addr, 0, testHostNQN, testHostID, cntlid, 1)
	q1.write(nvme.TermReq{Type: nvme.PDUH2CTermReq, FES: nvme.FESPDUSequence}.Append(nil))
	q1.expectClosed()
	q2 := ioConnect(t, addr, 0, testHostNQN, testHostID, cntlid, 1) // qid 1 is free again
	if r := q2.do(nvme.SQE{Opcode: nvme.AdminFabrics, NSID: uint32(nvme.FabricsDisconnect)}, nil, false); !r.cqe.Status.OK() {
		t.Fatalf("disconnect: %v", r.cqe.Status)
	}
	q2.expectClosed()
	if r := a.identify(nvme.CNSController, 0); !r.cqe.Status.OK() {
		t.Fatalf("admin queue after I/O queue disconnects: %v", r.cqe.Status)
	}
}

// TestQueueDepthPipelined keeps a full queue of reads and writes in flight
// to exercise the worker set and response batching.
func TestQueueDepthPipelined(t *testing.T) {
	dev := blockdev.NewMem(testSize, testBS)
	_, addr := newTarget(t, Config{WorkersPerQueue: 3}, dev)
	_, cntlid := adminConnect(t, addr, 0, testHostNQN, testHostID)
	q := dialRaw(t, addr, 0)
	if c := q.connect(testSubNQN, testHostNQN, testHostID, 1, cntlid, 15, 0); !c.Status.OK() {
		t.Fatal(c.Status)
	}
	const depth = 16
	data := randBytes(t, depth*4096)
	for i := 0; i < depth; i++ {
		s := rwSQE(nvme.CmdWrite, 1, uint64(i*8), 8)
		s.CID = uint16(100 + i)
		s.Flags = nvme.SQEFlagSGLMeta
		s.DPTR = nvme.SGL{Length: 4096, Type: nvme.SGLTypeInCapsule}
		q.sendCapsule(&s, data[i*4096:(i+1)*4096])
	}
	seen := map[uint16]bool{}
	for len(seen) < depth {
		p, err := q.readPDU()
		if err != nil {
			t.Fatal(err)
		}
		cqe, err := nvme.ParseCapsuleResp(p.hdr)
		if err != nil || !cqe.Status.OK() || cqe.SQID != 1 {
			t.Fatalf("pipelined write completion %+v %v", cqe, err)
		}
		seen[cqe.CID] = true
	}
	got := make([]byte, len(data))
	dev.ReadAt(got, 0)
	if !bytes.Equal(got, data) {
		t.Fatal("pipelined writes landed wrong")
	}
	// One more than the queue depth is a protocol error.
	for i := 0; i <= depth; i++ {
		s := rwSQE(nvme.CmdRead, 1, 0, 8)
		s.CID = uint16(200 + i)
		s.Flags = nvme.SQEFlagSGLMeta
		s.DPTR = nvme.SGL{Length: 4096, Type: nvme.SGLTypeTransport}
		q.sendCapsule(&s, nil)
	}
	// Either all complete quickly (slots freed in time) or the target
	// terminates; it must never hang.
	_ = q.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for n := 0; n <= depth; {
		p, err := q.readPDU()
		if err != nil {
			var ne interface{ Timeout() bool }
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("target hung on an overfull queue")
			}
			break
		}
		if p.h.Type == nvme.PDUCapsuleResp {
			n++
		}
		if p.h.Type == nvme.PDUC2HTermReq {
			break
		}
	}
}
