package nvme

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

func TestCRC32CKnownVector(t *testing.T) {
	// The CRC-32C check value from RFC 3720 / iSCSI.
	if got := CRC32C([]byte("123456789")); got != 0xE3069283 {
		t.Fatalf("CRC32C(123456789) = %#x, want 0xe3069283", got)
	}
	if got := UpdateCRC32C(UpdateCRC32C(0, []byte("1234")), []byte("56789")); got != 0xE3069283 {
		t.Fatalf("split CRC32C = %#x, want 0xe3069283", got)
	}
	d := AppendDigest(nil, []byte("123456789"))
	if !bytes.Equal(d, []byte{0x83, 0x92, 0x06, 0xE3}) {
		t.Fatalf("digest bytes % x, want little endian 83 92 06 e3", d)
	}
	if !CheckDigest([]byte("123456789"), d) || CheckDigest([]byte("12345678"), d) {
		t.Fatal("CheckDigest disagrees with AppendDigest")
	}
}

func TestICReqBytes(t *testing.T) {
	b := ICReq{HPDA: 0, Digest: DigestHeader | DigestData, MaxR2T: 0}.Append(nil)
	if len(b) != 128 {
		t.Fatalf("ICReq is %d bytes, want 128", len(b))
	}
	want := []byte{0x00, 0x00, 128, 0, 128, 0, 0, 0, 0, 0, 0, 3}
	if !bytes.Equal(b[:12], want) {
		t.Fatalf("ICReq head % x, want % x", b[:12], want)
	}
	h, err := ParseHeader(b)
	if err != nil || h.Type != PDUICReq || h.PLen != 128 {
		t.Fatalf("ParseHeader = %+v, %v", h, err)
	}
	r, err := ParseICReq(b)
	if err != nil || r.Digest != 3 {
		t.Fatalf("ParseICReq = %+v, %v", r, err)
	}
	resp := ICResp{Digest: 1, MaxData: 0x400000}
	got, err := ParseICResp(resp.Append(nil))
	if err != nil || got != resp {
		t.Fatalf("ICResp round trip = %+v, %v; want %+v", got, err, resp)
	}
}

func TestHeaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", []byte{4, 0, 72}, ErrShort},
		{"unknown type", []byte{0x08, 0, 24, 0, 24, 0, 0, 0}, ErrMalformed},
		{"wrong hlen", []byte{4, 0, 71, 0, 72, 0, 0, 0}, ErrMalformed},
		{"plen below hlen", []byte{4, 0, 72, 0, 8, 0, 0, 0}, ErrMalformed},
		{"pdo past plen", []byte{4, 0, 72, 200, 100, 0, 0, 0}, ErrMalformed},
		{"pdo inside header", []byte{4, 0, 72, 10, 100, 0, 0, 0}, ErrMalformed},
	} {
		if _, err := ParseHeader(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestCapsuleCmdLayout(t *testing.T) {
	sqe := SQE{Opcode: CmdWrite, Flags: SQEFlagSGLMeta, CID: 7, NSID: 1, DPTR: SGL{Length: 4096, Type: SGLTypeInCapsule}}
	sqe.SetRW(0x1_0000_0010, 8)
	for _, tc := range []struct {
		digest uint8
		data   int
		plen   uint32
		pdo    uint8
		flags  uint8
	}{
		{0, 0, 72, 0, 0},
		{0, 4096, 72 + 4096, 72, 0},
		{DigestHeader, 0, 76, 0, FlagHDGST},
		{DigestHeader | DigestData, 4096, 76 + 4096 + 4, 76, FlagHDGST | FlagDDGST},
		{DigestData, 0, 72, 0, 0}, // no data, no data digest
	} {
		b := AppendCapsuleCmd(nil, &sqe, tc.data, tc.digest)
		h, err := ParseHeader(b)
		if err != nil {
			t.Fatal(err)
		}
		if h.PLen != tc.plen || h.PDO != tc.pdo || h.Flags != tc.flags || h.DataLen() != tc.data {
			t.Errorf("digest %d data %d: header %+v datalen %d; want plen %d pdo %d flags %#x", tc.digest, tc.data, h, h.DataLen(), tc.plen, tc.pdo, tc.flags)
		}
		if tc.digest&DigestHeader != 0 && !CheckDigest(b[:72], b[72:76]) {
			t.Errorf("digest %d: header digest wrong", tc.digest)
		}
		got, err := ParseCapsuleCmd(b)
		if err != nil || got != sqe {
			t.Errorf("SQE round trip: %+v, %v", got, err)
		}
		if got.SLBA() != 0x1_0000_0010 || got.NLB() != 8 {
			t.Errorf("SLBA %#x NLB %d", got.SLBA(), got.NLB())
		}
	}
}

func TestCQEStatusEncoding(t *testing.T) {
	c := CQE{Result: 0x1234, SQHead: 3, SQID: 1, CID: 9, Status: StatusReservationConflict | StatusDNR}
	b := AppendCapsuleResp(nil, &c, 0)
	if len(b) != 24 {
		t.Fatalf("CapsuleResp %d bytes", len(b))
	}
	if st := binary.LittleEndian.Uint16(b[22:]); st != 0x8106 {
		t.Fatalf("status field %#x, want 0x8106 (0x4083 << 1)", st)
	}
	got, err := ParseCapsuleResp(b)
	if err != nil || got != c {
		t.Fatalf("CQE round trip %+v %v", got, err)
	}
	if !got.Status.DNR() || got.Status.Code() != StatusReservationConflict || got.Status.SCT() != 0 || got.Status.SC() != 0x83 {
		t.Fatalf("status accessors wrong: %v", got.Status)
	}
	if s := StatusANAInaccessible; s.SCT() != SCTPath || s.SC() != 2 || !s.IsPathError() {
		t.Fatalf("ANA inaccessible: sct %d sc %d", s.SCT(), s.SC())
	}
	if StatusANATransition != 0x303 || StatusReservationConflict != 0x83 {
		t.Fatal("status constants do not match the kernel's values")
	}
	if e := (StatusANAInaccessible | StatusDNR).Error(); e != "nvme: ANA inaccessible (sct 0x3 sc 0x2, dnr)" {
		t.Fatalf("Error() = %q", e)
	}
}

func TestDataAndR2T(t *testing.T) {
	for _, dg := range []uint8{0, DigestHeader, DigestHeader | DigestData} {
		p := DataPDU{Type: PDUC2HData, Flags: FlagDataLast, CID: 5, Offset: 8192, Length: 4096}
		b := p.Append(nil, dg)
		got, err := ParseDataPDU(b)
		p2 := p
		p2.Flags = got.Flags
		if err != nil || got != p2 || got.Flags&FlagDataLast == 0 {
			t.Fatalf("digest %d: data PDU %+v, %v", dg, got, err)
		}
		r := R2T{CID: 5, TTag: 2, Offset: 4096, Length: 65536}
		gr, err := ParseR2T(r.Append(nil, dg))
		if err != nil || gr != r {
			t.Fatalf("R2T %+v %v", gr, err)
		}
	}
	// datal disagreeing with plen
	b := DataPDU{Type: PDUH2CData, Length: 512}.Append(nil, 0)
	binary.LittleEndian.PutUint32(b[16:], 1024)
	if _, err := ParseDataPDU(b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("inconsistent datal: %v", err)
	}
}

func TestTermReq(t *testing.T) {
	tr := TermReq{Type: PDUC2HTermReq, FES: FESInvalidHeader, FEI: 2, Data: bytes.Repeat([]byte{0xAB}, 200)}
	b := tr.Append(nil)
	if len(b) != TermReqHLen+MaxTermReqData {
		t.Fatalf("TermReq len %d", len(b))
	}
	got, err := ParseTermReq(b)
	if err != nil || got.FES != FESInvalidHeader || got.FEI != 2 || len(got.Data) != MaxTermReqData {
		t.Fatalf("TermReq %+v %v", got, err)
	}
}

func TestConnect(t *testing.T) {
	c := ConnectCmd{QID: 3, SQSize: 127, KATO: 5000}
	s := c.SQE(1)
	b := s.Append(nil)
	if b[4] != FabricsConnect || binary.LittleEndian.Uint16(b[42:]) != 3 || binary.LittleEndian.Uint16(b[44:]) != 127 || binary.LittleEndian.Uint32(b[48:]) != 5000 {
		t.Fatalf("connect SQE bytes wrong: % x", b[40:52])
	}
	s2, _ := ParseSQE(b)
	if got := ParseConnectCmd(&s2); got != c || s2.FCType() != FabricsConnect {
		t.Fatalf("connect cmd %+v", got)
	}
	d := ConnectData{HostID: [16]byte{1, 2, 3}, CntlID: CntlIDDynamic, SubNQN: "nqn.2026-01.io.tier0:array-a", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:x"}
	db := d.Append(nil)
	if len(db) != 1024 || string(db[256:256+len(d.SubNQN)]) != d.SubNQN || string(db[512:512+len(d.HostNQN)]) != d.HostNQN {
		t.Fatal("connect data layout wrong")
	}
	gd, err := ParseConnectData(db)
	if err != nil || gd != d {
		t.Fatalf("connect data %+v %v", gd, err)
	}
	for i := 256; i < 512; i++ {
		db[i] = 'x'
	}
	if _, err := ParseConnectData(db); !errors.Is(err, ErrMalformed) {
		t.Fatalf("unterminated NQN: %v", err)
	}
}

func TestPropertyAndLogCmds(t *testing.T) {
	p := PropertyCmd{Size8: true, Offset: PropCAP}
	s := p.SQE(2, false)
	if s.FCType() != FabricsPropertyGet || ParsePropertyCmd(&s) != p {
		t.Fatalf("property get %+v", s)
	}
	ps := PropertyCmd{Offset: PropCC, Value: 0x460001}
	s = ps.SQE(2, true)
	if s.FCType() != FabricsPropertySet || ParsePropertyCmd(&s) != ps {
		t.Fatal("property set")
	}
	g := GetLogPageCmd{LID: LogANA, LSP: LogANALSPGroupsOnly, RAE: true, Len: 0x40000 + 8, LSI: 3, Offset: 1 << 33}
	s = g.SQE(4)
	if got := ParseGetLogPageCmd(&s); got != g {
		t.Fatalf("get log page %+v, want %+v", got, g)
	}
	id := IdentifyCmd{CNS: CNSCSController, CntID: 5, CSI: 0, NSID: 0}
	s = id.SQE(1)
	if ParseIdentifyCmd(&s) != id {
		t.Fatal("identify cmd")
	}
	if AENResult(AENTypeNotice, AENNoticeANAChange, LogANA) != 0x0C0302 {
		t.Fatalf("AEN result %#x", AENResult(AENTypeNotice, AENNoticeANAChange, LogANA))
	}
}

func sampleIdentifyController() IdentifyController {
	return IdentifyController{VID: 0x1b36, SN: "tier0-abc", MN: "tier0", FR: "0.1", CMIC: CMICMultiPort | CMICMultiCtrl | CMICANA,
		MDTS: 8, CntlID: 0x101, Ver: 0x10400, OAES: OAESANAChange, CntrlType: CtrlTypeIO, AERL: 3, LPA: 1 << 2, KAS: 1,
		ANATT: 10, ANACAP: ANACAPOptimized | ANACAPInaccessible, ANAGRPMAX: 32, NANAGRPID: 32, CQT: 1250, SQES: 0x66, CQES: 0x44,
		MaxCmd: 128, NN: 1024, ONCS: ONCSDSM | ONCSWriteZeroes | ONCSReservations, VWC: 1, SGLS: 1 | 1<<2 | 1<<20, MNAN: 1024,
		SubNQN: "nqn.2026-01.io.tier0:array-a", IOCCSZ: 4 + 1024, IORCSZ: 1, CtrAttr: 0, MSDBD: 1}
}

func TestIdentifyController(t *testing.T) {
	c := sampleIdentifyController()
	b := c.Append(nil)
	if len(b) != 4096 || b[76] != 0x0B || b[343] != c.ANACAP || binary.LittleEndian.Uint32(b[540:]) != 1024 || string(b[4:13]) != "tier0-abc" || b[13] != ' ' ||
		binary.LittleEndian.Uint16(b[386:]) != 1250 {
		t.Fatal("identify controller layout wrong")
	}
	got, err := ParseIdentifyController(b)
	if err != nil || got != c {
		t.Fatalf("round trip\n got %+v\nwant %+v\n%v", got, c, err)
	}
}

// TestIdentifyControllerIncarnation: tier0's boot incarnation sits at
// IncarnationOff behind its magic and round-trips; a structure without
// the magic (another target's zeroes, or a foreign value there) reads as
// 0, unknown.
func TestIdentifyControllerIncarnation(t *testing.T) {
	c := sampleIdentifyController()
	c.Incarnation = 0x0123456789abcdef
	b := c.Append(nil)
	if string(b[3072:3080]) != "T0BOOT\x00\x01" || binary.LittleEndian.Uint64(b[3080:]) != c.Incarnation {
		t.Fatalf("vendor-specific bytes 3072-3087: % x, want the magic then %#x", b[3072:3088], c.Incarnation)
	}
	if got, err := ParseIdentifyController(b); err != nil || got.Incarnation != c.Incarnation {
		t.Fatalf("incarnation read back %#x (%v), want %#x", got.Incarnation, err, c.Incarnation)
	}
	b[3079] = 2 // another layout version
	if got, _ := ParseIdentifyController(b); got.Incarnation != 0 {
		t.Fatalf("incarnation behind an unknown magic read as %#x, want 0 (unknown)", got.Incarnation)
	}
	c.Incarnation = 0
	if b := c.Append(nil); !bytes.Equal(b[3072:3088], make([]byte, 16)) {
		t.Fatalf("no incarnation: vendor bytes % x, want zeroes", b[3072:3088])
	}
}

func TestIdentifyNamespace(t *testing.T) {
	n := IdentifyNamespace{NSZE: 1 << 20, NCAP: 1 << 20, NUSE: 1 << 20, NLBAF: 0, FLBAS: 0, NMIC: NMICShared, RESCAP: 0x7E,
		DLFEAT: DLFEATReadZeroes, ANAGRPID: 7, NGUID: [16]byte{9, 8, 7}, EUI64: [8]byte{1}, LBAF: []LBAFormat{{LBADS: 12}}}
	b := n.Append(nil)
	if b[30] != 1 || binary.LittleEndian.Uint32(b[92:]) != 7 || b[104] != 9 || b[130] != 12 {
		t.Fatal("identify namespace layout wrong")
	}
	got, err := ParseIdentifyNamespace(b)
	if err != nil || !reflect.DeepEqual(got, n) || got.BlockSize() != 4096 {
		t.Fatalf("round trip %+v %v", got, err)
	}
}

func TestNSListsAndDescs(t *testing.T) {
	b := AppendNSList(nil, []uint32{1, 2, 5, 9}, 1)
	ids, err := ParseNSList(b)
	if err != nil || !reflect.DeepEqual(ids, []uint32{2, 5, 9}) {
		t.Fatalf("ns list %v %v", ids, err)
	}
	descs := []NSDescriptor{{NIDTEUI64, make([]byte, 8)}, {NIDTNGUID, bytes.Repeat([]byte{1}, 16)}, {NIDTUUID, bytes.Repeat([]byte{2}, 16)}, {NIDTCSI, []byte{0}}}
	db := AppendNSDescList(nil, descs)
	if db[0] != 1 || db[1] != 8 || db[12] != 2 || db[13] != 16 {
		t.Fatalf("desc layout % x", db[:16])
	}
	got, err := ParseNSDescList(db)
	if err != nil || !reflect.DeepEqual(got, descs) {
		t.Fatalf("descs %v %v", got, err)
	}
	db[1] = 9
	if _, err := ParseNSDescList(db); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad length: %v", err)
	}
}

func TestANALog(t *testing.T) {
	l := ANALog{ChangeCount: 3, Groups: []ANAGroupDesc{{GroupID: 1, ChangeCount: 2, State: ANAOptimized, NSIDs: []uint32{1, 2}}, {GroupID: 2, ChangeCount: 1, State: ANAInaccessible, NSIDs: []uint32{3}}}}
	b := l.Append(nil, false)
	if len(b) != l.Len(false) || len(b) != 16+32+8+32+4 || b[16+16] != 1 {
		t.Fatalf("ANA log len %d", len(b))
	}
	got, err := ParseANALog(b)
	if err != nil || !reflect.DeepEqual(got, l) {
		t.Fatalf("ANA log %+v %v", got, err)
	}
	rgo := l.Append(nil, true)
	if len(rgo) != l.Len(true) || len(rgo) != 16+64 {
		t.Fatalf("RGO len %d", len(rgo))
	}
	if _, err := ParseANALog(b[:40]); !errors.Is(err, ErrShort) {
		t.Fatalf("truncated: %v", err)
	}
	for _, s := range []ANAState{ANAOptimized, ANANonOptimized, ANAInaccessible, ANAPersistentLoss, ANAChange} {
		if p, err := ParseANAState(s.String()); err != nil || p != s {
			t.Fatalf("ParseANAState(%v) = %v %v", s, p, err)
		}
	}
	if ANAInaccessible.IOStatus() != StatusANAInaccessible || ANAChange.IOStatus() != StatusANATransition || !ANANonOptimized.IOStatus().OK() {
		t.Fatal("ANA IOStatus mapping")
	}
}

func TestDiscoveryLog(t *testing.T) {
	l := DiscoveryLog{GenCtr: 4, NumRec: 2, Entries: []DiscoveryEntry{
		{TrType: TrTypeTCP, AdrFam: AdrFamIPv4, SubType: SubTypeCurDisc, TReq: TReqNotSpecified, PortID: 1, CntlID: 0xFFFF, ASQSZ: 32, TrSvcID: "8009", SubNQN: DiscoveryNQN, TrAddr: "127.0.0.1"},
		{TrType: TrTypeTCP, AdrFam: AdrFamIPv4, SubType: SubTypeNVMe, PortID: 1, CntlID: 0xFFFF, ASQSZ: 32, TrSvcID: "4420", SubNQN: "nqn.x:a", TrAddr: "10.0.0.1"}}}
	b := l.Append(nil)
	if len(b) != 3072 || b[1024+2] != 3 || string(b[2048+32:2048+36]) != "4420" {
		t.Fatal("discovery layout")
	}
	got, err := ParseDiscoveryLog(b)
	if err != nil || !reflect.DeepEqual(got, l) {
		t.Fatalf("discovery %+v %v", got, err)
	}
	hdr, err := ParseDiscoveryLog(b[:1024])
	if err != nil || hdr.NumRec != 2 || len(hdr.Entries) != 0 {
		t.Fatalf("header only: %+v %v", hdr, err)
	}
}

func TestLogsSmall(t *testing.T) {
	e := ErrorLogEntry{ErrorCount: 1, SQID: 1, CID: 2, Status: StatusLBARange | StatusDNR, LBA: 99, NSID: 1, TrType: TrTypeTCP}
	if got, err := ParseErrorLogEntry(e.Append(nil)); err != nil || got != e {
		t.Fatalf("error log %+v %v", got, err)
	}
	s := SMARTLog{Temperature: 300, AvailSpare: 100, DataUnitsRead: 5, HostWrites: 7, PowerOnHours: 1}
	sb := s.Append(nil)
	if len(sb) != 512 || binary.LittleEndian.Uint16(sb[1:]) != 300 || sb[32] != 5 || sb[80] != 7 {
		t.Fatal("SMART layout")
	}
	if got, err := ParseSMARTLog(sb); err != nil || got != s {
		t.Fatalf("SMART %+v %v", got, err)
	}
	r := ResvNotification{LogPageCount: 2, Type: ResvNotifResvPreempted, NSID: 1}
	if got, err := ParseResvNotification(r.Append(nil)); err != nil || got != r {
		t.Fatalf("resv notif %+v %v", got, err)
	}
	ranges := []DSMRange{{NLB: 8, SLBA: 16}, {CAttr: 1, NLB: 1, SLBA: 1 << 40}}
	var db []byte
	for _, r := range ranges {
		db = r.Append(db)
	}
	if got, err := ParseDSMRanges(db, 2); err != nil || !reflect.DeepEqual(got, ranges) {
		t.Fatalf("DSM %v %v", got, err)
	}
	if _, err := ParseDSMRanges(db, 3); !errors.Is(err, ErrShort) {
		t.Fatalf("DSM short: %v", err)
	}
}

func TestReservations(t *testing.T) {
	c := ResvCmd{Action: ResvPreemptAndAbort, IEKey: true, Type: ResvWriteExclusive}
	if c.CDW10() != 0x10A || ParseResvCmd(c.CDW10()) != c {
		t.Fatalf("resv cdw10 %#x", c.CDW10())
	}
	k := ResvKeys{CRKey: 5, Key2: 9}
	if got, err := ParseResvKeys(k.Append(nil)); err != nil || got != k {
		t.Fatalf("keys %+v %v", got, err)
	}
	st := ResvStatus{Gen: 3, Type: ResvWriteExclusive, Registrants: []Registrant{{CntlID: 1, Holder: true, HostID: [16]byte{1}, RKey: 10}, {CntlID: 0xFFFF, HostID: [16]byte{2}, RKey: 11}}}
	b := st.Append(nil)
	if len(b) != 64+128 || binary.LittleEndian.Uint16(b[5:]) != 2 || b[64+2] != 1 || b[64+16] != 1 {
		t.Fatal("resv status layout")
	}
	if got, err := ParseResvStatus(b); err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("resv status %+v %v", got, err)
	}
	for _, tc := range []struct {
		t                         ResvType
		write, holder, registered bool
		want                      bool
	}{
		{ResvWriteExclusive, false, false, true, true},
		{ResvWriteExclusive, true, false, true, false},
		{ResvWriteExclusive, true, true, true, true},
		{ResvExclusiveAccess, false, false, true, false},
		{ResvWriteExclusiveRO, true, false, true, true},
		{ResvWriteExclusiveRO, true, false, false, false},
		{ResvExclusiveAccessAll, false, false, false, false},
		{ResvExclusiveAccessAll, false, false, true, true},
		{ResvNone, true, false, false, true},
	} {
		if got := tc.t.Allows(tc.write, tc.holder, tc.registered); got != tc.want {
			t.Errorf("%v write=%v holder=%v reg=%v: %v, want %v", tc.t, tc.write, tc.holder, tc.registered, got, tc.want)
		}
	}
}
