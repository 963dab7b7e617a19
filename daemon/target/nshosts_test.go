package target

import (
	"errors"
	"slices"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// nsView is what one host's controller sees of the subsystem's namespaces.
type nsView struct {
	active []uint32 // the Active Namespace ID list
	ana    []uint32 // the NSIDs in the ANA log's group 1
}

func viewOf(t *testing.T, a *rawClient) nsView {
	t.Helper()
	ids, err := nvme.ParseNSList(a.identify(nvme.CNSActiveNSList, 0).data)
	if err != nil {
		t.Fatal(err)
	}
	l, err := nvme.ParseANALog(a.getLog(nvme.LogANA, 0, 4096, 0).data)
	if err != nil {
		t.Fatal(err)
	}
	var ana []uint32
	for _, g := range l.Groups {
		if g.GroupID == 1 {
			ana = g.NSIDs
		}
	}
	return nsView{active: ids, ana: ana}
}

// TestNamespaceHostAllowList: a namespace limited to one host is, for
// another host the subsystem admits, an inactive NSID over a real
// connection: not in the Active Namespace ID list nor the ANA log, Identify
// Namespace all zeroes, and read, write, flush and reservation commands
// fail with Invalid Namespace; the allowed host uses it. Changing the list
// online tells both hosts (namespace-attribute-changed) and swaps who sees
// it; an empty list admits every host again.
func TestNamespaceHostAllowList(t *testing.T) {
	tg, addr := newTarget(t, Config{}, nil)
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 2, Device: blockdev.NewMem(testSize, testBS), NGUID: [16]byte{2}, ANAGroup: 1,
		Hosts: []string{testHostNQN}}); err != nil {
		t.Fatal(err)
	}
	a1, c1 := adminConnect(t, addr, 0, testHostNQN, testHostID)
	a2, c2 := adminConnect(t, addr, 0, testHostNQN2, testHostID2)
	q1 := ioConnect(t, addr, 0, testHostNQN, testHostID, c1, 1)
	q2 := ioConnect(t, addr, 0, testHostNQN2, testHostID2, c2, 1)

	if v := viewOf(t, a1); !slices.Equal(v.active, []uint32{1, 2}) || !slices.Equal(v.ana, []uint32{1, 2}) {
		t.Fatalf("allowed host sees %+v, want namespaces 1 and 2", v)
	}
	if v := viewOf(t, a2); !slices.Equal(v.active, []uint32{1}) || !slices.Equal(v.ana, []uint32{1}) {
		t.Fatalf("host not on namespace 2's list sees %+v, want namespace 1 only", v)
	}
	if in := a2.identify(nvme.CNSNamespace, 2); !in.cqe.Status.OK() || slices.ContainsFunc(in.data, func(b byte) bool { return b != 0 }) {
		t.Fatalf("Identify Namespace 2 for the other host: %v, want success with all-zero data (inactive NSID)", in.cqe.Status)
	}
	if st := a2.identify(nvme.CNSNSDescList, 2).cqe.Status; st != nvme.StatusInvalidNS|nvme.StatusDNR {
		t.Fatalf("NS descriptor list of namespace 2 for the other host: %v, want Invalid Namespace", st)
	}
	data := randBytes(t, testBS)
	if st := q1.writeBlocks(2, 0, data, testBS, true).cqe.Status; !st.OK() {
		t.Fatalf("allowed host's write to namespace 2: %v", st)
	}
	if r := q1.read(2, 0, 1, testBS); !r.cqe.Status.OK() || !slices.Equal(r.data, data) {
		t.Fatalf("allowed host's read of namespace 2: %v", r.cqe.Status)
	}
	deny := map[string]nvme.Status{
		"read":  q2.read(2, 0, 1, testBS).cqe.Status,
		"write": q2.writeBlocks(2, 0, data, testBS, true).cqe.Status,
		"flush": q2.do(nvme.SQE{Opcode: nvme.CmdFlush, NSID: 2}, nil, false).cqe.Status,
		"resv-register": q2.do(nvme.SQE{Opcode: nvme.CmdResvRegister, NSID: 2, CDW10: nvme.ResvCmd{Action: nvme.ResvRegister}.CDW10()},
			nvme.ResvKeys{Key2: 7}.Append(nil), true).cqe.Status,
		"resv-report": q2.do(nvme.SQE{Opcode: nvme.CmdResvReport, NSID: 2, CDW10: 4096/4 - 1, CDW11: 1, DPTR: nvme.SGL{Length: 4096}}, nil, false).cqe.Status,
	}
	for op, st := range deny {
		if st != nvme.StatusInvalidNS|nvme.StatusDNR {
			t.Errorf("other host's %s on namespace 2: %v, want Invalid Namespace or Format", op, st)
		}
	}
	if st := q2.writeBlocks(1, 0, data, testBS, true).cqe.Status; !st.OK() {
		t.Fatalf("other host's write to namespace 1 (no list): %v", st)
	}
	if st := q2.do(nvme.SQE{Opcode: nvme.CmdFlush, NSID: 0xFFFFFFFF}, nil, false).cqe.Status; !st.OK() {
		t.Fatalf("other host's flush of all namespaces: %v", st)
	}

	// Online: the list moves to host two.
	for _, a := range []*rawClient{a1, a2} {
		a.setFeature(nvme.FeatAsyncEventCfg, nvme.OAESNSAttr)
	}
	if err := tg.SetNamespaceHosts(testSubNQN, 2, []string{testHostNQN2}); err != nil {
		t.Fatal(err)
	}
	for i, a := range []*rawClient{a1, a2} {
		r := a.do(nvme.SQE{Opcode: nvme.AdminAsyncEvent}, nil, false)
		if r.cqe.DW0() != nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeNSChanged, nvme.LogChangedNSList) {
			t.Fatalf("host %d: AEN %#x after the list changed, want namespace-attribute-changed", i+1, r.cqe.DW0())
		}
		if ch := a.getLog(nvme.LogChangedNSList, 0, 4096, 0xFFFFFFFF); le32(ch.data) != 2 {
			t.Fatalf("host %d: changed namespace list starts with %d, want 2", i+1, le32(ch.data))
		}
	}
	if v := viewOf(t, a1); !slices.Equal(v.active, []uint32{1}) {
		t.Fatalf("host one after the list moved: %+v, want namespace 1 only", v)
	}
	if st := q1.read(2, 0, 1, testBS).cqe.Status; st != nvme.StatusInvalidNS|nvme.StatusDNR {
		t.Fatalf("host one's read of namespace 2 after it left the list: %v, want Invalid Namespace", st)
	}
	if r := q2.read(2, 0, 1, testBS); !r.cqe.Status.OK() || !slices.Equal(r.data, data) {
		t.Fatalf("host two's read of namespace 2 once on the list: %v", r.cqe.Status)
	}
	// Empty: every host the subsystem admits.
	if err := tg.SetNamespaceHosts(testSubNQN, 2, nil); err != nil {
		t.Fatal(err)
	}
	for i, a := range []*rawClient{a1, a2} {
		if v := viewOf(t, a); !slices.Equal(v.active, []uint32{1, 2}) {
			t.Fatalf("host %d with an empty list: %+v, want namespaces 1 and 2", i+1, v)
		}
	}

	if err := tg.SetNamespaceHosts(testSubNQN, 9, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("hosts of an absent namespace: %v, want ErrNotFound", err)
	}
	if err := tg.SetNamespaceHosts(testSubNQN, 2, []string{""}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an empty host NQN: %v, want ErrInvalid", err)
	}
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 3, Device: blockdev.NewMem(testSize, testBS), Hosts: []string{""}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("AddNamespace with an empty host NQN: %v, want ErrInvalid", err)
	}
}
