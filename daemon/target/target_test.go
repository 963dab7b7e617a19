package target

import (
	"bytes"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

const (
	testBS   = 512
	testSize = 8 << 20
)

var testNGUID = [16]byte{0x10, 0x20, 0x30, 0x40, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
var testUUID = [16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// newTarget starts a target on loopback serving testSubNQN with one
// namespace backed by dev (a fresh Mem when nil).
func newTarget(t testing.TB, cfg Config, dev blockdev.Device) (*Target, string) {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	tg, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	if err := tg.AddSubsystem(SubsystemConfig{NQN: testSubNQN, AllowedHosts: []string{testHostNQN, testHostNQN2}}); err != nil {
		t.Fatal(err)
	}
	if dev == nil {
		dev = blockdev.NewMem(testSize, testBS)
	}
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 1, Device: dev, NGUID: testNGUID, UUID: testUUID, ANAGroup: 1}); err != nil {
		t.Fatal(err)
	}
	return tg, tg.Addr().String()
}

// adminConnect opens an enabled admin queue and returns it with the
// controller ID.
func adminConnect(t testing.TB, addr string, digest uint8, hostnqn string, hostid [16]byte) (*rawClient, uint16) {
	t.Helper()
	a := dialRaw(t, addr, digest)
	cqe := a.connect(testSubNQN, hostnqn, hostid, 0, nvme.CntlIDDynamic, 31, 0)
	if !cqe.Status.OK() {
		t.Fatalf("admin connect: %v", cqe.Status)
	}
	a.enable()
	return a, uint16(cqe.DW0())
}

func ioConnect(t testing.TB, addr string, digest uint8, hostnqn string, hostid [16]byte, cntlid, qid uint16) *rawClient {
	t.Helper()
	q := dialRaw(t, addr, digest)
	if cqe := q.connect(testSubNQN, hostnqn, hostid, qid, cntlid, 127, 0); !cqe.Status.OK() {
		t.Fatalf("I/O queue %d connect: %v", qid, cqe.Status)
	}
	return q
}

func TestIdentifyForLinuxMultipath(t *testing.T) {
	tg, addr := newTarget(t, Config{CntlIDBase: 0x200, CntlIDCount: 16}, nil)
	a := dialRaw(t, addr, 0)
	cqe := a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 5000)
	if !cqe.Status.OK() {
		t.Fatalf("connect: %v", cqe.Status)
	}
	cntlid := uint16(cqe.DW0())
	if cntlid < 0x200 || cntlid >= 0x210 {
		t.Fatalf("cntlid %#x outside the configured range [0x200, 0x210)", cntlid)
	}
	// Before CC.EN, only fabrics commands work.
	if r := a.identify(nvme.CNSController, 0); r.cqe.Status != nvme.StatusCmdSeqError|nvme.StatusDNR {
		t.Fatalf("identify before CC.EN: %v", r.cqe.Status)
	}
	capv := a.propGet(nvme.PropCAP, true).Result
	if capv&0xFFFF < 31 || capv>>37&1 != 1 {
		t.Fatalf("CAP %#x: MQES must cover the admin queue and CSS must include NVM", capv)
	}
	if vs := a.propGet(nvme.PropVS, false).DW0(); vs < 0x10300 {
		t.Fatalf("VS %#x below 1.3", vs)
	}
	a.enable()
	r := a.identify(nvme.CNSController, 0)
	if !r.cqe.Status.OK() || len(r.data) != 4096 {
		t.Fatalf("identify controller: %v, %d bytes", r.cqe.Status, len(r.data))
	}
	ic, _ := nvme.ParseIdentifyController(r.data)
	if ic.CntlID != cntlid || ic.SubNQN != testSubNQN || ic.CntrlType != nvme.CtrlTypeIO {
		t.Fatalf("identify controller: cntlid %#x subnqn %q type %d", ic.CntlID, ic.SubNQN, ic.CntrlType)
	}
	if ic.CMIC != nvme.CMICMultiPort|nvme.CMICMultiCtrl|nvme.CMICANA {
		t.Errorf("CMIC %#x, want multi-port|multi-controller|ANA", ic.CMIC)
	}
	if ic.MNAN == 0 || ic.MNAN > ic.NN {
		t.Errorf("MNAN %d NN %d: Linux needs 0 < MNAN <= NN", ic.MNAN, ic.NN)
	}
	if ic.ANACAP&0x1F != 0x1F || ic.ANATT == 0 || ic.ANAGRPMAX == 0 || ic.NANAGRPID == 0 || ic.NANAGRPID > ic.ANAGRPMAX {
		t.Errorf("ANA fields: ANACAP %#x ANATT %d ANAGRPMAX %d NANAGRPID %d", ic.ANACAP, ic.ANATT, ic.ANAGRPMAX, ic.NANAGRPID)
	}
	if ic.OAES&nvme.OAESANAChange == 0 || ic.SQES != 0x66 || ic.CQES != 0x44 || ic.ONCS&nvme.ONCSReservations == 0 {
		t.Errorf("OAES %#x SQES %#x CQES %#x ONCS %#x", ic.OAES, ic.SQES, ic.CQES, ic.ONCS)
	}
	if ic.IOCCSZ*16 < 64+1024 || ic.MDTS == 0 || ic.SN == "" {
		t.Errorf("IOCCSZ %d MDTS %d SN %q", ic.IOCCSZ, ic.MDTS, ic.SN)
	}
	// ANA log must fit MDTS with the host's sizing.
	anaSize := 16 + int(ic.NANAGRPID)*32 + int(ic.MNAN)*4
	if anaSize > 4096<<ic.MDTS {
		t.Errorf("ANA log size %d exceeds MDTS %d", anaSize, 4096<<ic.MDTS)
	}
	r = a.identify(nvme.CNSNamespace, 1)
	ns, _ := nvme.ParseIdentifyNamespace(r.data)
	if ns.NSZE != testSize/testBS || ns.BlockSize() != testBS || ns.NMIC&nvme.NMICShared == 0 || ns.ANAGRPID != 1 || ns.NGUID != testNGUID || ns.RESCAP == 0 {
		t.Fatalf("identify namespace: %+v", ns)
	}
	r = a.identify(nvme.CNSActiveNSList, 0)
	if ids, _ := nvme.ParseNSList(r.data); len(ids) != 1 || ids[0] != 1 {
		t.Fatalf("active namespaces %v", ids)
	}
	r = a.identify(nvme.CNSNSDescList, 1)
	descs, err := nvme.ParseNSDescList(r.data)
	if err != nil {
		t.Fatal(err)
	}
	var gotNGUID, gotUUID bool
	for _, d := range descs {
		gotNGUID = gotNGUID || (d.Type == nvme.NIDTNGUID && bytes.Equal(d.ID, testNGUID[:]))
		gotUUID = gotUUID || (d.Type == nvme.NIDTUUID && bytes.Equal(d.ID, testUUID[:]))
	}
	if !gotNGUID || !gotUUID {
		t.Fatalf("descriptor list %v lacks the configured NGUID/UUID", descs)
	}
	if r := a.identify(nvme.CNSNamespace, 0xFFFFFFFF); r.cqe.Status != nvme.StatusInvalidNS|nvme.StatusDNR {
		t.Fatalf("identify NSID all: %v", r.cqe.Status)
	}
	if r := a.identify(0x42, 0); r.cqe.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("unknown CNS: %v", r.cqe.Status)
	}
	if r := a.identify(nvme.CNSCSController, 0); !r.cqe.Status.OK() {
		t.Fatalf("CNS 6 CSI NVM: %v", r.cqe.Status)
	}
	// Features the Linux host sets.
	if c := a.setFeature(nvme.FeatNumQueues, 3|3<<16); !c.Status.OK() || c.DW0() != 3|3<<16 {
		t.Fatalf("number of queues: %v %#x", c.Status, c.DW0())
	}
	if c := a.setFeature(nvme.FeatAsyncEventCfg, 0xFFFFFFFF); !c.Status.OK() || c.DW0() != nvme.OAESANAChange|nvme.OAESNSAttr {
		t.Fatalf("async event config: %v %#x", c.Status, c.DW0())
	}
	if c := a.do(nvme.SQE{Opcode: nvme.AdminKeepAlive}, nil, false).cqe; !c.Status.OK() {
		t.Fatalf("keep alive: %v", c.Status)
	}
	if c := a.do(nvme.SQE{Opcode: 0xC5}, nil, false).cqe; c.Status != nvme.StatusInvalidOpcode|nvme.StatusDNR {
		t.Fatalf("unknown admin opcode: %v", c.Status)
	}
	if infos := tg.Controllers(); len(infos) != 1 || infos[0].CntlID != cntlid || infos[0].HostNQN != testHostNQN || infos[0].KATO != 5*time.Second {
		t.Fatalf("Controllers() = %+v", infos)
	}
}

func TestReadWriteAllDigests(t *testing.T) {
	for _, dg := range []uint8{0, nvme.DigestHeader, nvme.DigestData, nvme.DigestHeader | nvme.DigestData} {
		t.Run(map[uint8]string{0: "none", 1: "header", 2: "data", 3: "both"}[dg], func(t *testing.T) {
			dev := blockdev.NewMem(testSize, testBS)
			_, addr := newTarget(t, Config{MaxDataTransfer: 256 << 10, InlineDataSize: 8192}, dev)
			a, cntlid := adminConnect(t, addr, dg, testHostNQN, testHostID)
			a.setFeature(nvme.FeatNumQueues, 1|1<<16)
			q := ioConnect(t, addr, dg, testHostNQN, testHostID, cntlid, 1)
			q.h2cChunk = 16 << 10
			small := randBytes(t, 4096)
			if r := q.writeBlocks(1, 10, small, testBS, true); !r.cqe.Status.OK() {
				t.Fatalf("in-capsule write: %v", r.cqe.Status)
			}
			big := randBytes(t, 256<<10)
			if r := q.writeBlocks(1, 1000, big, testBS, false); !r.cqe.Status.OK() {
				t.Fatalf("R2T write: %v", r.cqe.Status)
			}
			if r := q.read(1, 10, 8, testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, small) {
				t.Fatalf("read back small: %v, equal %v", r.cqe.Status, bytes.Equal(r.data, small))
			}
			if r := q.read(1, 1000, uint32(len(big)/testBS), testBS); !r.cqe.Status.OK() || !bytes.Equal(r.data, big) {
				t.Fatalf("read back big: %v, equal %v", r.cqe.Status, bytes.Equal(r.data, big))
			}
			got := make([]byte, len(big))
			dev.ReadAt(got, 1000*testBS)
			if !bytes.Equal(got, big) {
				t.Fatal("device content differs from what was written")
			}
			if r := q.do(nvme.SQE{Opcode: nvme.CmdFlush, NSID: 1}, nil, false); !r.cqe.Status.OK() {
				t.Fatalf("flush: %v", r.cqe.Status)
			}
			wz := rwSQE(nvme.CmdWriteZeroes, 1, 10, 4)
			if r := q.do(wz, nil, false); !r.cqe.Status.OK() {
				t.Fatalf("write zeroes: %v", r.cqe.Status)
			}
			var dsm []byte
			dsm = nvme.DSMRange{NLB: 8, SLBA: 1000}.Append(dsm)
			dsm = nvme.DSMRange{NLB: 8, SLBA: 1016}.Append(dsm)
			if r := q.do(nvme.SQE{Opcode: nvme.CmdDSM, NSID: 1, CDW10: 1, CDW11: nvme.DSMDeallocate}, dsm, true); !r.cqe.Status.OK() {
				t.Fatalf("DSM deallocate: %v", r.cqe.Status)
			}
			r := q.read(1, 10, 8, testBS)
			want := append(make([]byte, 4*testBS), small[4*testBS:]...)
			if !bytes.Equal(r.data, want) {
				t.Fatal("write zeroes did not zero exactly 4 blocks")
			}
			r = q.read(1, 1000, 32, testBS)
			want = append(make([]byte, 8*testBS), big[8*testBS:16*testBS]...)
			want = append(want, make([]byte, 8*testBS)...)
			want = append(want, big[24*testBS:32*testBS]...)
			if !bytes.Equal(r.data, want) {
				t.Fatal("DSM did not deallocate exactly the two ranges")
			}
		})
	}
}

func TestIOErrorsAreNVMeStatuses(t *testing.T) {
	_, addr := newTarget(t, Config{MaxDataTransfer: 64 << 10}, nil)
	a, cntlid := adminConnect(t, addr, 0, testHostNQN, testHostID)
	_ = a
	q := ioConnect(t, addr, 0, testHostNQN, testHostID, cntlid, 1)
	last := uint64(testSize/testBS - 1)
	for _, tc := range []struct {
		name string
		sqe  nvme.SQE
		out  []byte
		want nvme.Status
	}{
		{"read past end", func() nvme.SQE {
			s := rwSQE(nvme.CmdRead, 1, last, 2)
			s.DPTR.Length = 2 * testBS
			return s
		}(), nil, nvme.StatusLBARange | nvme.StatusDNR},
		{"slba overflow", func() nvme.SQE {
			s := rwSQE(nvme.CmdRead, 1, ^uint64(0), 2)
			s.DPTR.Length = 2 * testBS
			return s
		}(), nil, nvme.StatusLBARange | nvme.StatusDNR},
		{"read over MDTS", func() nvme.SQE {
			s := rwSQE(nvme.CmdRead, 1, 0, 256)
			s.DPTR.Length = 256 * testBS
			return s
		}(), nil, nvme.StatusInvalidField | nvme.StatusDNR},
		{"SGL length mismatch", func() nvme.SQE {
			s := rwSQE(nvme.CmdRead, 1, 0, 2)
			s.DPTR.Length = testBS
			return s
		}(), nil, nvme.StatusSGLInvalidData | nvme.StatusDNR},
		{"unknown namespace", func() nvme.SQE {
			s := rwSQE(nvme.CmdRead, 7, 0, 1)
			s.DPTR.Length = testBS
			return s
		}(), nil, nvme.StatusInvalidNS | nvme.StatusDNR},
		{"unknown opcode", nvme.SQE{Opcode: 0x7E, NSID: 1}, nil, nvme.StatusInvalidOpcode | nvme.StatusDNR},
		{"compare unsupported", nvme.SQE{Opcode: nvme.CmdCompare, NSID: 1}, nil, nvme.StatusInvalidOpcode | nvme.StatusDNR},
		{"write data shorter than NLB", rwSQE(nvme.CmdWrite, 1, 0, 4), make([]byte, testBS), nvme.StatusSGLInvalidData | nvme.StatusDNR},
		{"property get on I/O queue", nvme.PropertyCmd{Offset: nvme.PropCAP}.SQE(0, false), nil, nvme.StatusInvalidOpcode | nvme.StatusDNR},
		{"DSM range past end", nvme.SQE{Opcode: nvme.CmdDSM, NSID: 1, CDW11: nvme.DSMDeallocate}, nvme.DSMRange{NLB: 2, SLBA: last}.Append(nil), nvme.StatusLBARange | nvme.StatusDNR},
		{"write over MDTS by R2T", rwSQE(nvme.CmdWrite, 1, 0, 256), nil, nvme.StatusInvalidField | nvme.StatusDNR},
	} {
		sqe := tc.sqe
		out := tc.out
		inCapsule := true
		if tc.name == "write over MDTS by R2T" {
			sqe.DPTR = nvme.SGL{Length: 256 * testBS, Type: nvme.SGLTypeTransport}
			r := q.do(sqe, nil, false)
			if r.cqe.Status != tc.want {
				t.Errorf("%s: %v, want %v", tc.name, r.cqe.Status, tc.want)
			}
			continue
		}
		r := q.do(sqe, out, inCapsule)
		if r.cqe.Status != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, r.cqe.Status, tc.want)
		}
	}
	// The queue still works.
	if r := q.read(1, 0, 1, testBS); !r.cqe.Status.OK() {
		t.Fatalf("read after errors: %v", r.cqe.Status)
	}
}

func randBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeClock is a settable Clock.
type fakeClock struct{ ns atomic.Int64 }

func (f *fakeClock) Now() time.Time          { return time.Unix(0, f.ns.Load()) }
func (f *fakeClock) Advance(d time.Duration) { f.ns.Add(int64(d)) }

func TestKeepAliveTimeoutTearsDownController(t *testing.T) {
	clk := &fakeClock{}
	clk.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	tg, addr := newTarget(t, Config{Clock: clk, KeepAliveSweep: 5 * time.Millisecond}, nil)
	// Controller 1 keeps alive, controller 2 falls silent.
	alive := dialRaw(t, addr, 0)
	if c := alive.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 1000); !c.Status.OK() {
		t.Fatal(c.Status)
	}
	alive.enable()
	silent := dialRaw(t, addr, 0)
	c := silent.connect(testSubNQN, testHostNQN2, testHostID2, 0, nvme.CntlIDDynamic, 31, 1000)
	if !c.Status.OK() {
		t.Fatal(c.Status)
	}
	silentID := uint16(c.DW0())
	sq := ioConnect(t, addr, 0, testHostNQN2, testHostID2, silentID, 1)
	for i := 0; i < 3; i++ {
		clk.Advance(600 * time.Millisecond)
		if r := alive.do(nvme.SQE{Opcode: nvme.AdminKeepAlive}, nil, false); !r.cqe.Status.OK() {
			t.Fatalf("keep alive %d: %v", i, r.cqe.Status)
		}
	}
	silent.expectClosed()
	sq.expectClosed()
	if r := alive.do(nvme.SQE{Opcode: nvme.AdminKeepAlive}, nil, false); !r.cqe.Status.OK() {
		t.Fatalf("the live controller was torn down too: %v", r.cqe.Status)
	}
	for _, ci := range tg.Controllers() {
		if ci.CntlID == silentID {
			t.Fatalf("controller %d still listed after its keep-alive timeout", silentID)
		}
	}
}

func TestDiscovery(t *testing.T) {
	tg, addr := newTarget(t, Config{Advertise: "192.0.2.7:4420", PortID: 3}, nil)
	if err := tg.AddSubsystem(SubsystemConfig{NQN: "nqn.2026-01.io.tier0:private", AllowedHosts: []string{"nqn.other"}}); err != nil {
		t.Fatal(err)
	}
	d := dialRaw(t, addr, 0)
	c := d.connect(nvme.DiscoveryNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0)
	if !c.Status.OK() {
		t.Fatalf("discovery connect: %v", c.Status)
	}
	d.enable()
	ic, _ := nvme.ParseIdentifyController(d.identify(nvme.CNSController, 0).data)
	if ic.CntrlType != nvme.CtrlTypeDiscovery || ic.SubNQN != nvme.DiscoveryNQN {
		t.Fatalf("discovery identify: type %d subnqn %q", ic.CntrlType, ic.SubNQN)
	}
	hdr := d.getLog(nvme.LogDiscovery, 0, 1024, 0)
	l, _ := nvme.ParseDiscoveryLog(hdr.data)
	if l.NumRec != 2 {
		t.Fatalf("NUMREC %d, want 2 (current discovery subsystem + the one allowed subsystem)", l.NumRec)
	}
	full := d.getLog(nvme.LogDiscovery, 0, uint32(1024+1024*l.NumRec), 0)
	l, _ = nvme.ParseDiscoveryLog(full.data)
	if len(l.Entries) != 2 {
		t.Fatalf("entries %+v", l.Entries)
	}
	e := l.Entries[1]
	if e.SubNQN != testSubNQN || e.TrAddr != "192.0.2.7" || e.TrSvcID != "4420" || e.TrType != nvme.TrTypeTCP || e.AdrFam != nvme.AdrFamIPv4 || e.SubType != nvme.SubTypeNVMe || e.PortID != 3 {
		t.Fatalf("entry %+v", e)
	}
	if l.Entries[0].SubType != nvme.SubTypeCurDisc {
		t.Fatalf("first entry %+v is not the current discovery subsystem", l.Entries[0])
	}
	// Allow-list changes bump the generation counter.
	if err := tg.AllowHost("nqn.2026-01.io.tier0:private", testHostNQN); err != nil {
		t.Fatal(err)
	}
	l2, _ := nvme.ParseDiscoveryLog(d.getLog(nvme.LogDiscovery, 0, 1024, 0).data)
	if l2.NumRec != 3 || l2.GenCtr == l.GenCtr {
		t.Fatalf("after AllowHost: numrec %d genctr %d (was %d)", l2.NumRec, l2.GenCtr, l.GenCtr)
	}
	if r := d.do(rwSQE(nvme.CmdRead, 1, 0, 1), nil, false); r.cqe.Status.OK() {
		t.Fatal("a discovery controller accepted an I/O opcode on its admin queue")
	}
}

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

// gatedDevice blocks writes while gate is held, to keep commands in flight.
type gatedDevice struct {
	blockdev.Device
	mu      sync.RWMutex
	entered chan struct{}
}

func (g *gatedDevice) WriteAt(p []byte, off int64) (int, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.Device.WriteAt(p, off)
}

var _ = errors.Is
