package host

import (
	"bufio"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"tier0/daemon/nvme"
)

// fakeTarget is a small in-test NVMe/TCP controller over a memory
// namespace: enough of the protocol to drive the host's paths (in-capsule
// and R2T writes in several chunks, C2HData reads in several PDUs, digests,
// AER/ANA, reservations with conflicts) and to inject faults (drop every
// connection, stall completions). It is not tier0's target (package
// target); the acceptance tests in test/fabric use that and Linux.
type fakeTarget struct {
	t          *testing.T
	l          net.Listener
	nqn        string
	bs         int
	data       []byte
	dataMu     sync.Mutex
	maxH2C     uint32
	r2tMax     uint32 // largest R2T the fake asks for
	c2hMax     uint32 // largest C2HData it sends
	inline     int    // IOCCSZ-derived in-capsule limit
	cntlid     atomic.Uint32
	mu         sync.Mutex
	conns      map[net.Conn]bool
	ana        nvme.ANAState
	aers       []func(uint32) // outstanding AERs (complete with dw0)
	pendingAEN bool           // an ANA change not yet reported
	stall      atomic.Bool    // swallow I/O commands
	stalled    chan uint8     // receives the opcode of each swallowed command (when non-nil)
	cqt        uint16         // Identify Controller CQT reported (ms)
	handled    atomic.Int64   // writes (Write, Write Zeroes) executed
	dropAt     atomic.Int64   // when > 0: drop every connection when cmds reaches it
	refuse     atomic.Bool    // refuse new connections
	cmds       atomic.Int64
	writes     atomic.Int64 // socket writes of the fake
	kas        atomic.Int64 // keep alives received
	holder     [16]byte     // reservation holder host ID (zero: none)
	regs       map[[16]byte]uint64
	rtype      nvme.ResvType
	// lateRead, when non-nil, holds the C2HData of every read until the
	// test closes it; lateSent then receives each send's outcome.
	lateRead chan struct{}
	lateSent chan error
}

func newFakeTarget(t *testing.T, nqn string, size int) *fakeTarget {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeTarget{t: t, l: l, nqn: nqn, bs: 512, data: make([]byte, size), maxH2C: 32 << 10, r2tMax: 64 << 10, c2hMax: 48 << 10,
		inline: 4096, conns: map[net.Conn]bool{}, ana: nvme.ANAOptimized, regs: map[[16]byte]uint64{}}
	go f.accept()
	t.Cleanup(func() { l.Close(); f.dropAll() })
	return f
}

func (f *fakeTarget) addr() string { return f.l.Addr().String() }

func (f *fakeTarget) accept() {
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		if f.refuse.Load() {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns[c] = true
		f.mu.Unlock()
		go f.serve(c)
	}
}

func (f *fakeTarget) dropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
	f.aers = nil
}

// setANA changes the state and completes the outstanding AERs.
func (f *fakeTarget) setANA(s nvme.ANAState) {
	f.mu.Lock()
	f.ana = s
	aers := f.aers
	f.aers = nil
	if len(aers) == 0 {
		// no AER outstanding: report on the next one, as a controller
		// must
		f.pendingAEN = true
	}
	f.mu.Unlock()
	for _, a := range aers {
		a(nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeANAChange, nvme.LogANA))
	}
}

type countWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countWriter) Write(p []byte) (int, error) { c.n.Add(1); return c.w.Write(p) }

func (f *fakeTarget) serve(c net.Conn) {
	defer func() {
		c.Close()
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	bw := bufio.NewWriterSize(countWriter{c, &f.writes}, 256<<10)
	var wmu sync.Mutex
	send := func(b ...[]byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		for _, p := range b {
			bw.Write(p)
		}
		return bw.Flush()
	}
	ic := make([]byte, nvme.ICReqLen)
	if _, err := io.ReadFull(br, ic); err != nil {
		return
	}
	req, err := nvme.ParseICReq(ic)
	if err != nil {
		return
	}
	dg := req.Digest
	send(nvme.ICResp{Digest: dg, MaxData: f.maxH2C}.Append(nil))
	hd := 0
	if dg&nvme.DigestHeader != 0 {
		hd = 4
	}
	var qid uint16
	var hostID [16]byte
	ready := uint32(0)
	// pending R2T writes by CID
	type wstate struct {
		sqe  nvme.SQE
		buf  []byte
		got  uint32
		next uint32
	}
	writes := map[uint16]*wstate{}
	resp := func(cid uint16, st nvme.Status, dw0 uint64) {
		cqe := nvme.CQE{CID: cid, SQID: qid, Status: st, Result: dw0}
		send(nvme.AppendCapsuleResp(nil, &cqe, dg))
	}
	r2t := func(w *wstate) {
		n := min(uint32(len(w.buf))-w.next, f.r2tMax)
		send(nvme.R2T{CID: w.sqe.CID, TTag: w.sqe.CID, Offset: w.next, Length: n}.Append(nil, dg))
		w.next += n
	}
	dataPDU := func(p []byte) []byte {
		out := p
		if dg&nvme.DigestData != 0 {
			out = nvme.AppendDigest(append([]byte(nil), p...), p)
		}
		return out
	}
	handleIO := func(sqe nvme.SQE, data []byte) {
		if n := f.cmds.Add(1); n == f.dropAt.Load() {
			f.dropAll()
			return
		}
		bs := uint64(f.bs)
		switch sqe.Opcode {
		case nvme.CmdRead, nvme.CmdWrite, nvme.CmdWriteZeroes:
			off, n := sqe.SLBA()*bs, uint64(sqe.NLB())*bs
			if off+n > uint64(len(f.data)) {
				resp(sqe.CID, nvme.StatusLBARange|nvme.StatusDNR, 0)
				return
			}
			f.mu.Lock()
			st := f.ana
			fenced := sqe.Opcode != nvme.CmdRead && f.rtype != 0 && f.holder != hostID
			f.mu.Unlock()
			if st.IOStatus() != nvme.StatusSuccess {
				resp(sqe.CID, st.IOStatus(), 0)
				return
			}
			if fenced {
				resp(sqe.CID, nvme.StatusReservationConflict|nvme.StatusDNR, 0)
				return
			}
			switch sqe.Opcode {
			case nvme.CmdRead:
				f.dataMu.Lock()
				src := append([]byte(nil), f.data[off:off+n]...)
				f.dataMu.Unlock()
				if f.lateRead != nil {
					<-f.lateRead
					p := nvme.DataPDU{Type: nvme.PDUC2HData, CID: sqe.CID, Length: uint32(n), Flags: nvme.FlagDataLast | nvme.FlagDataSuccess}
					err := send(p.Append(nil, dg), dataPDU(src))
					select {
					case f.lateSent <- err:
					default:
					}
					return
				}
				for o := uint32(0); o < uint32(n); {
					k := min(uint32(n)-o, f.c2hMax)
					p := nvme.DataPDU{Type: nvme.PDUC2HData, CID: sqe.CID, Offset: o, Length: k}
					if o+k == uint32(n) {
						p.Flags = nvme.FlagDataLast
						if sqe.CID%2 == 0 {
							p.Flags |= nvme.FlagDataSuccess
						}
					}
					send(p.Append(nil, dg), dataPDU(src[o:o+k]))
					o += k
				}
				if sqe.CID%2 == 1 {
					resp(sqe.CID, 0, 0)
				}
			case nvme.CmdWrite:
				f.dataMu.Lock()
				copy(f.data[off:], data)
				f.dataMu.Unlock()
				f.handled.Add(1)
				resp(sqe.CID, 0, 0)
			case nvme.CmdWriteZeroes:
				f.dataMu.Lock()
				clear(f.data[off : off+n])
				f.dataMu.Unlock()
				f.handled.Add(1)
				resp(sqe.CID, 0, 0)
			}
		case nvme.CmdFlush:
			resp(sqe.CID, 0, 0)
		case nvme.CmdResvRegister, nvme.CmdResvAcquire, nvme.CmdResvRelease:
			rc := nvme.ParseResvCmd(sqe.CDW10)
			k, _ := nvme.ParseResvKeys(data)
			f.mu.Lock()
			st := nvme.StatusSuccess
			switch sqe.Opcode {
			case nvme.CmdResvRegister:
				if rc.Action == nvme.ResvRegister {
					f.regs[hostID] = k.Key2
				} else if rc.Action == nvme.ResvUnregister {
					delete(f.regs, hostID)
				}
			case nvme.CmdResvAcquire:
				if f.regs[hostID] != k.CRKey {
					st = nvme.StatusReservationConflict | nvme.StatusDNR
				} else if rc.Action == nvme.ResvAcquire {
					if f.rtype != 0 && f.holder != hostID {
						st = nvme.StatusReservationConflict | nvme.StatusDNR
					} else {
						f.holder, f.rtype = hostID, rc.Type
					}
				} else {
					for h, key := range f.regs {
						if key == k.Key2 {
							delete(f.regs, h)
						}
					}
					f.holder, f.rtype = hostID, rc.Type
				}
			case nvme.CmdResvRelease:
				if f.holder == hostID {
					f.holder, f.rtype = [16]byte{}, 0
				}
			}
			f.mu.Unlock()
			resp(sqe.CID, st, 0)
		default:
			resp(sqe.CID, nvme.StatusInvalidOpcode|nvme.StatusDNR, 0)
		}
	}
	hb := make([]byte, 128+8)
	for {
		if _, err := io.ReadFull(br, hb[:8]); err != nil {
			return
		}
		h, err := nvme.ParseHeader(hb[:8])
		if err != nil {
			return
		}
		if _, err := io.ReadFull(br, hb[8:int(h.HLen)+hd]); err != nil {
			return
		}
		if hd > 0 && !nvme.CheckDigest(hb[:h.HLen], hb[h.HLen:int(h.HLen)+hd]) {
			f.t.Errorf("fake target: bad header digest")
			return
		}
		var data []byte
		if dl := h.DataLen(); dl > 0 {
			if pad := int(h.PDO) - int(h.HLen) - hd; pad > 0 {
				br.Discard(pad)
			}
			data = make([]byte, dl)
			if _, err := io.ReadFull(br, data); err != nil {
				return
			}
			if h.Flags&nvme.FlagDDGST != 0 {
				var d [4]byte
				io.ReadFull(br, d[:])
				if !nvme.CheckDigest(data, d[:]) {
					f.t.Errorf("fake target: bad data digest")
					return
				}
			}
		}
		switch h.Type {
		case nvme.PDUH2CData:
			p, err := nvme.ParseDataPDU(hb[:h.HLen])
			if err != nil {
				f.t.Errorf("fake target: %v", err)
				return
			}
			w := writes[p.CID]
			if w == nil || p.Offset != w.got || uint64(p.Offset)+uint64(len(data)) > uint64(len(w.buf)) || len(data) > int(f.maxH2C) {
				f.t.Errorf("fake target: unexpected H2CData cid %d off %d len %d", p.CID, p.Offset, len(data))
				return
			}
			copy(w.buf[p.Offset:], data)
			w.got += uint32(len(data))
			if w.got == uint32(len(w.buf)) {
				if p.Flags&nvme.FlagDataLast == 0 {
					f.t.Errorf("fake target: H2CData completing cid %d without LAST", p.CID)
				}
				delete(writes, p.CID)
				handleIO(w.sqe, w.buf)
			} else if w.got == w.next {
				r2t(w)
			}
			continue
		case nvme.PDUCapsuleCmd:
		default:
			f.t.Errorf("fake target: unexpected %v", h.Type)
			return
		}
		sqe, _ := nvme.ParseCapsuleCmd(hb[:h.HLen])
		switch {
		case sqe.Opcode == nvme.AdminFabrics:
			switch sqe.FCType() {
			case nvme.FabricsConnect:
				cc := nvme.ParseConnectCmd(&sqe)
				d, _ := nvme.ParseConnectData(data)
				if d.SubNQN != f.nqn {
					resp(sqe.CID, nvme.StatusConnectInvalidParam|nvme.StatusDNR, 0)
					continue
				}
				qid, hostID = cc.QID, d.HostID
				id := uint64(d.CntlID)
				if qid == 0 {
					id = uint64(f.cntlid.Add(1))
				}
				resp(sqe.CID, 0, id)
			case nvme.FabricsPropertyGet:
				p := nvme.ParsePropertyCmd(&sqe)
				v := uint64(0)
				switch p.Offset {
				case nvme.PropCAP:
					v = 127
				case nvme.PropCSTS:
					v = uint64(ready)
				}
				resp(sqe.CID, 0, v)
			case nvme.FabricsPropertySet:
				p := nvme.ParsePropertyCmd(&sqe)
				if p.Offset == nvme.PropCC && uint32(p.Value)&nvme.CCEnable != 0 {
					ready = 1
				}
				resp(sqe.CID, 0, 0)
			default:
				resp(sqe.CID, nvme.StatusInvalidOpcode|nvme.StatusDNR, 0)
			}
		case qid == 0:
			switch sqe.Opcode {
			case nvme.AdminIdentify:
				ic := nvme.ParseIdentifyCmd(&sqe)
				var b []byte
				switch ic.CNS {
				case nvme.CNSController:
					id := nvme.IdentifyController{MN: "fake", CntlID: 1, OAES: nvme.OAESANAChange, ANACAP: 0x1F, ANAGRPMAX: 1, NANAGRPID: 1, CQT: f.cqt,
						NN: 1, MNAN: 1, CMIC: 0x0B, MDTS: 5, SubNQN: f.nqn, IOCCSZ: uint32(f.inline+64) / 16, SQES: 0x66, CQES: 0x44}
					b = id.Append(nil)
				case nvme.CNSNamespace:
					ns := nvme.IdentifyNamespace{NSZE: uint64(len(f.data) / f.bs), NCAP: uint64(len(f.data) / f.bs), NMIC: 1, ANAGRPID: 1,
						LBAF: []nvme.LBAFormat{{LBADS: 9}}}
					b = ns.Append(nil)
				default:
					b = make([]byte, 4096)
				}
				f.c2h(send, dataPDU, dg, sqe.CID, b)
				resp(sqe.CID, 0, 0)
			case nvme.AdminSetFeatures, nvme.AdminKeepAlive:
				if sqe.Opcode == nvme.AdminKeepAlive {
					f.kas.Add(1)
				}
				resp(sqe.CID, 0, 0x00030003)
			case nvme.AdminAsyncEvent:
				cid := sqe.CID
				f.mu.Lock()
				pending := f.pendingAEN
				f.pendingAEN = false
				if !pending {
					f.aers = append(f.aers, func(dw0 uint32) { resp(cid, 0, uint64(dw0)) })
				}
				f.mu.Unlock()
				if pending {
					resp(cid, 0, uint64(nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeANAChange, nvme.LogANA)))
				}
			case nvme.AdminGetLogPage:
				lp := nvme.ParseGetLogPageCmd(&sqe)
				f.mu.Lock()
				l := nvme.ANALog{ChangeCount: 1, Groups: []nvme.ANAGroupDesc{{GroupID: 1, State: f.ana, NSIDs: []uint32{1}}}}
				f.mu.Unlock()
				b := l.Append(nil, false)
				out := make([]byte, lp.Len)
				copy(out, b)
				f.c2h(send, dataPDU, dg, sqe.CID, out)
				resp(sqe.CID, 0, 0)
			default:
				resp(sqe.CID, nvme.StatusInvalidOpcode|nvme.StatusDNR, 0)
			}
		default:
			if f.stall.Load() {
				if f.stalled != nil {
					select {
					case f.stalled <- sqe.Opcode:
					default:
					}
				}
				continue
			}
			if sqe.Opcode == nvme.CmdWrite || (sqe.DPTR.Type == nvme.SGLTypeTransport && sqe.DPTR.Length > 0 && sqe.Opcode != nvme.CmdRead && sqe.Opcode != nvme.CmdResvReport) {
				if len(data) == 0 && sqe.DPTR.Length > 0 {
					w := &wstate{sqe: sqe, buf: make([]byte, sqe.DPTR.Length)}
					writes[sqe.CID] = w
					r2t(w)
					continue
				}
				if len(data) > f.inline {
					f.t.Errorf("fake target: %d bytes in capsule, over the %d advertised", len(data), f.inline)
				}
			}
			handleIO(sqe, data)
		}
	}
}

func (f *fakeTarget) c2h(send func(...[]byte) error, dataPDU func([]byte) []byte, dg uint8, cid uint16, b []byte) {
	p := nvme.DataPDU{Type: nvme.PDUC2HData, CID: cid, Length: uint32(len(b)), Flags: nvme.FlagDataLast}
	send(p.Append(nil, dg), dataPDU(b))
}
