package nvme

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var updateCorpus = flag.Bool("update-fuzz-corpus", false, "rewrite testdata/fuzz/<FuzzName>/seed-* from the table-test seeds")

// seeds returns, per fuzz target, inputs taken from the table tests.
func seeds() map[string][][]byte {
	sqe := SQE{Opcode: CmdWrite, Flags: SQEFlagSGLMeta, CID: 7, NSID: 1, DPTR: SGL{Length: 4096, Type: SGLTypeInCapsule}}
	sqe.SetRW(16, 8)
	cqe := CQE{Result: 1, SQHead: 2, SQID: 1, CID: 7, Status: StatusReservationConflict | StatusDNR}
	ic := sampleIdentifyController()
	ns := IdentifyNamespace{NSZE: 1 << 20, NMIC: 1, ANAGRPID: 1, LBAF: []LBAFormat{{LBADS: 9}}}
	ana := ANALog{ChangeCount: 3, Groups: []ANAGroupDesc{{GroupID: 1, ChangeCount: 2, State: ANAOptimized, NSIDs: []uint32{1, 2}}}}
	disc := DiscoveryLog{GenCtr: 1, Entries: []DiscoveryEntry{{TrType: TrTypeTCP, AdrFam: AdrFamIPv4, SubType: SubTypeNVMe, TrSvcID: "4420", SubNQN: "nqn.x:a", TrAddr: "127.0.0.1"}}}
	cd := ConnectData{HostID: [16]byte{1}, CntlID: 0xFFFF, SubNQN: "nqn.x:a", HostNQN: "nqn.h"}
	rs := ResvStatus{Gen: 1, Type: ResvWriteExclusive, Registrants: []Registrant{{CntlID: 1, Holder: true, RKey: 5}}}
	el := ErrorLogEntry{ErrorCount: 1, Status: StatusLBARange}
	sm := SMARTLog{Temperature: 300}
	rn := ResvNotification{LogPageCount: 1, Type: 1, NSID: 1}
	return map[string][][]byte{
		"FuzzParseHeader":             {AppendCapsuleCmd(nil, &sqe, 4096, 3), ICReq{}.Append(nil), {4, 0, 71, 0, 72, 0, 0, 0}},
		"FuzzParseICReq":              {ICReq{Digest: 3}.Append(nil)},
		"FuzzParseICResp":             {ICResp{Digest: 1, MaxData: 1 << 22}.Append(nil)},
		"FuzzParseTermReq":            {TermReq{Type: PDUC2HTermReq, FES: 1, FEI: 2, Data: []byte{1, 2, 3}}.Append(nil)},
		"FuzzParseCapsuleCmd":         {AppendCapsuleCmd(nil, &sqe, 0, 0), AppendCapsuleCmd(nil, &sqe, 512, 1)},
		"FuzzParseCapsuleResp":        {AppendCapsuleResp(nil, &cqe, 0)},
		"FuzzParseDataPDU":            {DataPDU{Type: PDUC2HData, Flags: FlagDataLast, CID: 1, Length: 16}.Append(nil, 3), DataPDU{Type: PDUH2CData, Length: 8}.Append(nil, 0)},
		"FuzzParseR2T":                {R2T{CID: 1, TTag: 2, Offset: 4096, Length: 8192}.Append(nil, 1)},
		"FuzzParseConnectData":        {cd.Append(nil)},
		"FuzzParseIdentifyController": {ic.Append(nil)},
		"FuzzParseIdentifyNamespace":  {ns.Append(nil)},
		"FuzzParseNSList":             {AppendNSList(nil, []uint32{1, 2, 3}, 0)},
		"FuzzParseNSDescList":         {AppendNSDescList(nil, []NSDescriptor{{NIDTNGUID, make([]byte, 16)}, {NIDTCSI, []byte{0}}}), {1, 9, 0, 0}},
		"FuzzParseANALog":             {ana.Append(nil, false), ana.Append(nil, true)},
		"FuzzParseDiscoveryLog":       {disc.Append(nil), disc.Append(nil)[:1024]},
		"FuzzParseErrorLogEntry":      {el.Append(nil)},
		"FuzzParseSMARTLog":           {sm.Append(nil)},
		"FuzzParseResvNotification":   {rn.Append(nil)},
		"FuzzParseResvKeys":           {ResvKeys{CRKey: 1, Key2: 2}.Append(nil), {1, 2, 3, 4, 5, 6, 7, 8}},
		"FuzzParseResvStatus":         {rs.Append(nil)},
		"FuzzParseDSMRanges":          {DSMRange{NLB: 8, SLBA: 16}.Append(nil)},
	}
}

// TestWriteFuzzCorpus keeps testdata/fuzz in step with seeds(); it only
// writes with -update-fuzz-corpus and otherwise checks that every seed is
// checked in.
func TestWriteFuzzCorpus(t *testing.T) {
	for name, ins := range seeds() {
		for i, in := range ins {
			p := filepath.Join("testdata", "fuzz", name, fmt.Sprintf("seed-%d", i))
			content := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", in)
			if *updateCorpus {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, content, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(got, content) {
				t.Errorf("%s is missing or stale; run go test ./daemon/nvme -run TestWriteFuzzCorpus -update-fuzz-corpus", p)
			}
		}
	}
}

func addSeeds(f *testing.F) {
	for _, s := range seeds()[f.Name()] {
		f.Add(s)
	}
}

// roundTrip checks that a value decoded from arbitrary bytes encodes to
// bytes that decode to the same value.
func roundTrip[T any](t *testing.T, v T, enc func(T) []byte, dec func([]byte) (T, error)) {
	t.Helper()
	b := enc(v)
	w, err := dec(b)
	if err != nil {
		t.Fatalf("re-decoding an encoded value failed: %v", err)
	}
	if !reflect.DeepEqual(normalize(v), normalize(w)) {
		t.Fatalf("round trip changed the value:\n%+v\n%+v", v, w)
	}
}

func normalize(v any) any { return fmt.Sprintf("%+v", v) }

func FuzzParseHeader(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		if n := h.DataLen(); n > int(h.PLen) {
			t.Fatalf("data length %d exceeds plen %d", n, h.PLen)
		}
		roundTrip(t, h, func(h Header) []byte { return h.Append(nil) }, ParseHeader)
	})
}

func FuzzParseICReq(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseICReq(b); err == nil {
			roundTrip(t, v, func(v ICReq) []byte { return v.Append(nil) }, ParseICReq)
		}
	})
}

func FuzzParseICResp(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseICResp(b); err == nil {
			roundTrip(t, v, func(v ICResp) []byte { return v.Append(nil) }, ParseICResp)
		}
	})
}

func FuzzParseTermReq(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseTermReq(b); err == nil {
			roundTrip(t, v, func(v TermReq) []byte { return v.Append(nil) }, ParseTermReq)
		}
	})
}

func FuzzParseCapsuleCmd(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseCapsuleCmd(b); err == nil {
			roundTrip(t, v, func(v SQE) []byte { return AppendCapsuleCmd(nil, &v, 0, 0) }, ParseCapsuleCmd)
			_ = ParseConnectCmd(&v)
			_ = ParseGetLogPageCmd(&v)
			_ = ParseIdentifyCmd(&v)
		}
	})
}

func FuzzParseCapsuleResp(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseCapsuleResp(b); err == nil {
			_ = v.Status.String()
			roundTrip(t, v, func(v CQE) []byte { return AppendCapsuleResp(nil, &v, 0) }, ParseCapsuleResp)
		}
	})
}

func FuzzParseDataPDU(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParseDataPDU(b)
		if err != nil {
			return
		}
		h, _ := ParseHeader(b)
		dg := uint8(0)
		if h.Flags&FlagHDGST != 0 {
			dg |= DigestHeader
		}
		if h.Flags&FlagDDGST != 0 {
			dg |= DigestData
		}
		if v.Length > 1<<20 {
			// The header alone parsed; re-encoding with a payload that
			// large would only test the fuzzer's memory (4 GiB at most).
			return
		}
		enc := v.Append(nil, dg)
		w, err := ParseDataPDU(append(enc, make([]byte, v.Length)...))
		if err != nil || w.CID != v.CID || w.Length != v.Length || w.Offset != v.Offset {
			t.Fatalf("re-encode: %+v vs %+v: %v", v, w, err)
		}
	})
}

func FuzzParseR2T(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseR2T(b); err == nil {
			roundTrip(t, v, func(v R2T) []byte { return v.Append(nil, 0) }, ParseR2T)
		}
	})
}

func FuzzParseConnectData(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseConnectData(b); err == nil && len(v.SubNQN) < NQNLen && len(v.HostNQN) < NQNLen {
			roundTrip(t, v, func(v ConnectData) []byte { return v.Append(nil) }, ParseConnectData)
		}
	})
}

func FuzzParseIdentifyController(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseIdentifyController(b)
	})
}

func FuzzParseIdentifyNamespace(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseIdentifyNamespace(b); err == nil {
			_ = v.BlockSize()
			roundTrip(t, v, func(v IdentifyNamespace) []byte { return v.Append(nil) }, ParseIdentifyNamespace)
		}
	})
}

func FuzzParseNSList(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseNSList(b)
	})
}

func FuzzParseNSDescList(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseNSDescList(b)
	})
}

func FuzzParseANALog(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseANALog(b); err == nil {
			roundTrip(t, v, func(v ANALog) []byte { return v.Append(nil, false) }, ParseANALog)
		}
	})
}

func FuzzParseDiscoveryLog(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseDiscoveryLog(b)
	})
}

func FuzzParseErrorLogEntry(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseErrorLogEntry(b); err == nil {
			roundTrip(t, v, func(v ErrorLogEntry) []byte { return v.Append(nil) }, ParseErrorLogEntry)
		}
	})
}

func FuzzParseSMARTLog(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := ParseSMARTLog(b); err == nil {
			roundTrip(t, v, func(v SMARTLog) []byte { return v.Append(nil) }, ParseSMARTLog)
		}
	})
}

func FuzzParseResvNotification(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseResvNotification(b)
	})
}

func FuzzParseResvKeys(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseResvKeys(b)
	})
}

func FuzzParseResvStatus(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseResvStatus(b)
	})
}

func FuzzParseDSMRanges(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseDSMRanges(b, len(b)/DSMRangeLen)
	})
}
