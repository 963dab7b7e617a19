package target

import (
	"bytes"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/blockdevtest"
	"tier0/daemon/clock"
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
	if tt, ok := t.(*testing.T); ok {
		// first, so that its check runs after the target's Close and
		// every connection's cleanup: nothing of the target outlives it
		blockdevtest.NoLeaks(tt)
	}
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
			sm, _ := nvme.ParseSMARTLog(a.getLog(nvme.LogSMART, 0, 512, 1).data)
			if sm.HostWrites != 2 || sm.HostReads != 2 || sm.DataUnitsWritten != uint64((4096+256<<10)/512+999)/1000 {
				t.Fatalf("SMART counters %+v after 2 writes and 2 reads", sm)
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

func TestKeepAliveTimeoutTearsDownController(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
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
	// Teardown closes the connections first and then removes the
	// controller, so the list may lag the closed socket a moment.
	listed := func() bool {
		for _, ci := range tg.Controllers() {
			if ci.CntlID == silentID {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); listed(); {
		if time.Now().After(deadline) {
			t.Fatalf("controller %d still listed 10s after its keep-alive timeout closed its connections", silentID)
		}
		time.Sleep(5 * time.Millisecond)
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

func TestRuntimeAPI(t *testing.T) {
	tg, addr := newTarget(t, Config{}, nil)
	if err := tg.AddSubsystem(SubsystemConfig{NQN: testSubNQN}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate subsystem: %v", err)
	}
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 1, Device: blockdev.NewMem(1<<20, 512)}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate namespace: %v", err)
	}
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 0, Device: blockdev.NewMem(1<<20, 512)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nsid 0: %v", err)
	}
	if _, err := New(Config{CntlIDBase: 0xFFF0, CntlIDCount: 100}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("cntlid range past 0xffef: %v", err)
	}
	a, _ := adminConnect(t, addr, 0, testHostNQN, testHostID)
	a.setFeature(nvme.FeatAsyncEventCfg, nvme.OAESNSAttr)
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 5, Device: blockdev.NewMem(1<<20, 4096), ANAGroup: 2}); err != nil {
		t.Fatal(err)
	}
	r := a.do(nvme.SQE{Opcode: nvme.AdminAsyncEvent}, nil, false)
	if r.cqe.DW0() != nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeNSChanged, nvme.LogChangedNSList) {
		t.Fatalf("namespace-changed AEN %#x", r.cqe.DW0())
	}
	ch := a.getLog(nvme.LogChangedNSList, 0, 4096, 0xFFFFFFFF)
	if le32(ch.data) != 5 {
		t.Fatalf("changed namespace list starts with %d", le32(ch.data))
	}
	ids, _ := nvme.ParseNSList(a.identify(nvme.CNSActiveNSList, 0).data)
	if len(ids) != 2 || ids[1] != 5 {
		t.Fatalf("active namespaces %v", ids)
	}
	ns, _ := nvme.ParseIdentifyNamespace(a.identify(nvme.CNSNamespace, 5).data)
	if ns.BlockSize() != 4096 || ns.ANAGRPID != 2 {
		t.Fatalf("namespace 5: %+v", ns)
	}
	l, _ := nvme.ParseANALog(a.getLog(nvme.LogANA, 0, 4096, 0).data)
	if len(l.Groups) != 2 {
		t.Fatalf("ANA groups %+v", l.Groups)
	}
	if err := tg.RemoveNamespace(testSubNQN, 5); err != nil {
		t.Fatal(err)
	}
	if err := tg.RemoveNamespace(testSubNQN, 5); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	if ns, _ := nvme.ParseIdentifyNamespace(a.identify(nvme.CNSNamespace, 5).data); ns.NCAP != 0 {
		t.Fatal("removed namespace still identifies")
	}
	sup := a.getLog(nvme.LogSupportedPages, 0, 1024, 0).data
	if sup[4*int(nvme.LogANA)] != 1 || sup[4*int(nvme.LogDiscovery)] != 0 {
		t.Fatal("supported log pages list is wrong")
	}
	if r := a.getLog(0x77, 0, 512, 0); r.cqe.Status != nvme.StatusInvalidLogPage|nvme.StatusDNR {
		t.Fatalf("unknown log page: %v", r.cqe.Status)
	}
	if r := a.getLog(nvme.LogSMART, 0, 512, 0xFFFFFFFF); !r.cqe.Status.OK() || len(r.data) != 512 {
		t.Fatalf("SMART log: %v", r.cqe.Status)
	}
	if err := tg.RemoveSubsystem(testSubNQN); err != nil {
		t.Fatal(err)
	}
	a.expectClosed()
}

func TestWithPort(t *testing.T) {
	for in, want := range map[string]string{"10.0.0.1": "10.0.0.1:8009", ":9": ":9", "[::1]": "[::1]:8009", "::1": "[::1]:8009", "h:1": "h:1"} {
		if got := withPort(in, DefaultDiscoveryPort); got != want {
			t.Errorf("withPort(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestControllerRegistersAndFeatures(t *testing.T) {
	_, addr := newTarget(t, Config{StateDir: t.TempDir()}, nil)
	a := dialRaw(t, addr, 0)
	if c := a.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0); !c.Status.OK() {
		t.Fatal(c.Status)
	}
	// 128-byte SQEs are not supported: CSTS.CFS, not RDY.
	a.propSet(nvme.PropCC, 1|7<<16|4<<20)
	if csts := a.propGet(nvme.PropCSTS, false).DW0(); csts&nvme.CSTSFatal == 0 || csts&nvme.CSTSReady != 0 {
		t.Fatalf("CSTS %#x after CC with IOSQES 7", csts)
	}
	a.propSet(nvme.PropCC, 0)
	a.enable()
	if c := a.propSet(nvme.PropVS, 1); c.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("property set VS: %v", c.Status)
	}
	// Shutdown notification completes at once.
	a.propSet(nvme.PropCC, 1|6<<16|4<<20|1<<14)
	if csts := a.propGet(nvme.PropCSTS, false).DW0(); csts&(3<<2) != nvme.CSTSShutdownDone {
		t.Fatalf("CSTS %#x after CC.SHN", csts)
	}
	a.propSet(nvme.PropCC, 0)
	a.enable()
	r := a.do(nvme.SQE{Opcode: nvme.AdminGetFeatures, CDW10: uint32(nvme.FeatHostID), CDW11: 1, DPTR: nvme.SGL{Length: 16}}, nil, false)
	if !r.cqe.Status.OK() || !bytes.Equal(r.data, testHostID[:]) {
		t.Fatalf("host identifier feature: %v % x", r.cqe.Status, r.data)
	}
	if c := a.setFeature(nvme.FeatKeepAlive, 15000); !c.Status.OK() {
		t.Fatal(c.Status)
	}
	if c := a.do(nvme.SQE{Opcode: nvme.AdminGetFeatures, CDW10: uint32(nvme.FeatKeepAlive)}, nil, false).cqe; c.DW0() != 15000 {
		t.Fatalf("KATO read back %d", c.DW0())
	}
	if c := a.do(nvme.SQE{Opcode: nvme.AdminGetFeatures, CDW10: uint32(nvme.FeatResvPersistence)}, nil, false).cqe; c.DW0() != 1 {
		t.Fatalf("PTPL with a state dir: %d", c.DW0())
	}
	if c := a.do(nvme.SQE{Opcode: nvme.AdminAbort}, nil, false).cqe; !c.Status.OK() || c.DW0()&1 != 1 {
		t.Fatalf("abort: %v %#x", c.Status, c.DW0())
	}
	if c := a.setFeature(0xEE, 0); c.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("unknown feature: %v", c.Status)
	}
	// More than four outstanding AERs.
	for i := 0; i < maxAERs; i++ {
		a.cid++
		s := nvme.SQE{Opcode: nvme.AdminAsyncEvent, CID: a.cid, Flags: nvme.SQEFlagSGLMeta, DPTR: nvme.SGL{Type: nvme.SGLTypeTransport}}
		a.sendCapsule(&s, nil)
	}
	if c := a.do(nvme.SQE{Opcode: nvme.AdminAsyncEvent}, nil, false).cqe; c.Status != nvme.StatusAsyncLimit|nvme.StatusDNR {
		t.Fatalf("fifth AER: %v", c.Status)
	}
}

func TestRateLimiter(t *testing.T) {
	r := newRateLimiter(clock.Real, time.Hour)
	if ok, _ := r.allow("a"); !ok {
		t.Fatal("first line suppressed")
	}
	for i := 0; i < 3; i++ {
		if ok, _ := r.allow("a"); ok {
			t.Fatal("repeat within the interval let through")
		}
	}
	if ok, _ := r.allow("b"); !ok {
		t.Fatal("another key suppressed")
	}
	r.last["a"] = time.Now().Add(-2 * time.Hour)
	if ok, n := r.allow("a"); !ok || n != 3 {
		t.Fatalf("after the interval: ok %v suppressed %d, want true 3", ok, n)
	}
}
