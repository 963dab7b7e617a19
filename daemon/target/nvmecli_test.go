package target

import (
	"bytes"
	"encoding/binary"
	"testing"

	"tier0/daemon/nvme"
)

// getLogAt reads n bytes of log page lid at byte offset off.
func (c *rawClient) getLogAt(lid, lsp uint8, n uint32, off uint64, nsid uint32) result {
	s := nvme.GetLogPageCmd{LID: lid, LSP: lsp, Len: n, Offset: off, NSID: nsid}.SQE(0)
	return c.do(s, nil, false)
}

// TestANALogReadInPiecesAsNvmeCLI reads the ANA log the way nvme-cli 2.3
// (libnvme 1.3) does: the size the Identify maxima allow (header + NANAGRPID
// group descriptors + MNAN namespace IDs), in 4 KiB pieces. The page itself
// is shorter: the piece past its end must read as zeroes, not fail with
// Invalid Field in Command (`nvme ana-log` failed so; Linux nvmet answers).
func TestANALogReadInPiecesAsNvmeCLI(t *testing.T) {
	_, addr := newTarget(t, Config{}, nil)
	a, _ := adminConnect(t, addr, 0, testHostNQN, testHostID)
	var ic nvme.IdentifyController
	r := a.identify(nvme.CNSController, 0)
	ic, err := nvme.ParseIdentifyController(r.data)
	if err != nil {
		t.Fatal(err)
	}
	for _, rgo := range []uint8{0, nvme.LogANALSPGroupsOnly} {
		size := uint32(nvme.ANALogHeaderLen + nvme.ANAGroupDescLen*int(ic.NANAGRPID))
		if rgo == 0 {
			size += 4 * ic.MNAN
		}
		var page []byte
		for off := uint32(0); off < size; off += 4096 {
			n := min(4096, size-off)
			r := a.getLogAt(nvme.LogANA, rgo, n, uint64(off), 0)
			if !r.cqe.Status.OK() {
				t.Fatalf("ANA log (lsp %d, %d bytes) piece at offset %d, %d bytes: %v, want success (zeroes past the page's end)", rgo, size, off, n, r.cqe.Status)
			}
			page = append(page, r.data...)
		}
		l, err := nvme.ParseANALog(page)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Groups) != 1 || l.Groups[0].State != nvme.ANAOptimized || (rgo == 0 && len(l.Groups[0].NSIDs) != 1) {
			t.Fatalf("ANA log (lsp %d): %+v", rgo, l)
		}
		if end := l.Len(rgo != 0); !bytes.Equal(page[end:], make([]byte, len(page)-end)) {
			t.Fatalf("ANA log (lsp %d): bytes past the page's end (%d) are not zero", rgo, end)
		}
	}
	if r := a.getLogAt(nvme.LogANA, 0, 64, 2, 0); r.cqe.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("offset not dword aligned: %v, want invalid field", r.cqe.Status)
	}
}

// TestCommandEffectsLog: nvme-cli (and the Linux host, when LPA says so)
// reads the Commands Supported and Effects log; every command the target
// executes is listed, writes change logical block content.
func TestCommandEffectsLog(t *testing.T) {
	_, addr := newTarget(t, Config{}, nil)
	a, _ := adminConnect(t, addr, 0, testHostNQN, testHostID)
	ic, _ := nvme.ParseIdentifyController(a.identify(nvme.CNSController, 0).data)
	if ic.LPA&nvme.LPACmdEffects == 0 {
		t.Errorf("Identify LPA %#x does not advertise the commands supported and effects log", ic.LPA)
	}
	sup := a.getLog(nvme.LogSupportedPages, 0, 1024, 0)
	if !sup.cqe.Status.OK() || sup.data[4*nvme.LogCmdEffects]&1 == 0 {
		t.Fatalf("supported log pages: %v, LID 5 not listed", sup.cqe.Status)
	}
	r := a.getLog(nvme.LogCmdEffects, 0, 4096, 0)
	if !r.cqe.Status.OK() {
		t.Fatalf("commands supported and effects log: %v", r.cqe.Status)
	}
	admin := func(op uint8) uint32 { return binary.LittleEndian.Uint32(r.data[4*int(op):]) }
	io := func(op uint8) uint32 { return binary.LittleEndian.Uint32(r.data[1024+4*int(op):]) }
	for _, op := range []uint8{nvme.AdminGetLogPage, nvme.AdminIdentify, nvme.AdminAbort, nvme.AdminSetFeatures, nvme.AdminGetFeatures, nvme.AdminAsyncEvent, nvme.AdminKeepAlive} {
		if admin(op)&1 == 0 {
			t.Errorf("admin opcode %#x not marked supported", op)
		}
	}
	for _, op := range []uint8{nvme.CmdFlush, nvme.CmdRead, nvme.CmdResvRegister, nvme.CmdResvReport, nvme.CmdResvAcquire, nvme.CmdResvRelease} {
		if io(op) != 1 {
			t.Errorf("I/O opcode %#x effects %#x, want supported only", op, io(op))
		}
	}
	for _, op := range []uint8{nvme.CmdWrite, nvme.CmdWriteZeroes, nvme.CmdDSM} {
		if io(op) != 3 {
			t.Errorf("I/O opcode %#x effects %#x, want supported + logical block content change", op, io(op))
		}
	}
	if io(nvme.CmdCompare) != 0 || admin(nvme.AdminFormatNVM) != 0 {
		t.Errorf("unsupported commands marked supported")
	}
}

// TestGetFeaturesAsNvmeCLI: Get Features of Namespace Write Protection
// Config (0x84, nvmet answers it) and the Select field: 0 current,
// 1 default, 2 saved (none are saveable: the default), 3 capabilities.
func TestGetFeaturesAsNvmeCLI(t *testing.T) {
	_, addr := newTarget(t, Config{}, nil)
	a, _ := adminConnect(t, addr, 0, testHostNQN, testHostID)
	get := func(fid uint8, sel uint32, nsid uint32) nvme.CQE {
		return a.do(nvme.SQE{Opcode: nvme.AdminGetFeatures, NSID: nsid, CDW10: uint32(fid) | sel<<8}, nil, false).cqe
	}
	if c := get(nvme.FeatNSWriteProtect, 0, 1); !c.Status.OK() || c.DW0() != 0 {
		t.Fatalf("write protection config of namespace 1: %v %#x, want success, not write protected", c.Status, c.DW0())
	}
	if c := get(nvme.FeatNSWriteProtect, 0, 7); c.Status != nvme.StatusInvalidNS|nvme.StatusDNR {
		t.Fatalf("write protection config of an unknown namespace: %v", c.Status)
	}
	ic, _ := nvme.ParseIdentifyController(a.identify(nvme.CNSController, 0).data)
	if ic.ONCS&nvme.ONCSSaveSelect == 0 {
		t.Errorf("ONCS %#x does not advertise the Select field", ic.ONCS)
	}
	if c := a.setFeature(nvme.FeatKeepAlive, 7000); !c.Status.OK() {
		t.Fatal(c.Status)
	}
	if c := get(nvme.FeatKeepAlive, 0, 0); c.DW0() != 7000 {
		t.Fatalf("KATO current %d, want 7000", c.DW0())
	}
	for _, sel := range []uint32{1, 2} {
		if c := get(nvme.FeatKeepAlive, sel, 0); !c.Status.OK() || c.DW0() != 0 {
			t.Fatalf("KATO select %d: %v %d, want the default 0", sel, c.Status, c.DW0())
		}
	}
	if c := get(nvme.FeatKeepAlive, 3, 0); !c.Status.OK() || c.DW0() != nvme.FeatCapChangeable {
		t.Fatalf("KATO capabilities: %v %#x, want changeable, not saveable", c.Status, c.DW0())
	}
	if c := get(nvme.FeatResvNotifMask, 3, 1); !c.Status.OK() || c.DW0() != nvme.FeatCapChangeable|nvme.FeatCapNSSpecific {
		t.Fatalf("reservation notification mask capabilities: %v %#x, want changeable and namespace specific", c.Status, c.DW0())
	}
	if c := get(nvme.FeatVolatileWC, 3, 0); !c.Status.OK() || c.DW0() != 0 {
		t.Fatalf("volatile write cache capabilities: %v %#x, want neither saveable nor changeable", c.Status, c.DW0())
	}
	if c := get(nvme.FeatKeepAlive, 4, 0); c.Status != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("select 4 (reserved): %v", c.Status)
	}
}

// TestDiscoveryControllerFeatures: the discovery controller has no
// namespaces and no reservations; asking for their features is an invalid
// field, not a crash.
func TestDiscoveryControllerFeatures(t *testing.T) {
	_, addr := newTarget(t, Config{}, nil)
	d := dialRaw(t, addr, 0)
	if c := d.connect(nvme.DiscoveryNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 0); !c.Status.OK() {
		t.Fatal(c.Status)
	}
	d.enable()
	for _, fid := range []uint8{nvme.FeatResvPersistence, nvme.FeatResvNotifMask, nvme.FeatNSWriteProtect, nvme.FeatNumQueues} {
		for _, sel := range []uint32{0, 3} {
			if c := d.do(nvme.SQE{Opcode: nvme.AdminGetFeatures, NSID: 1, CDW10: uint32(fid) | sel<<8}, nil, false).cqe; c.Status != nvme.StatusInvalidField|nvme.StatusDNR {
				t.Errorf("discovery controller, feature %#x select %d: %v, want invalid field", fid, sel, c.Status)
			}
		}
	}
	if c := d.do(nvme.SQE{Opcode: nvme.AdminGetFeatures, CDW10: uint32(nvme.FeatKeepAlive) | 3<<8}, nil, false).cqe; !c.Status.OK() {
		t.Errorf("discovery controller, keep alive capabilities: %v", c.Status)
	}
}
