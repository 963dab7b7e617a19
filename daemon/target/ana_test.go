package target

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

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

// TestANAMultipath: two targets ("nodes") serve the same subsystem and
// namespace identity with disjoint controller IDs; node B is inaccessible
// until the control plane flips it, which raises an ANA-change AEN.
func TestANAMultipath(t *testing.T) {
	dev := blockdev.NewMem(testSize, testBS) // shared backing, as after a takeover
	tgA, addrA := newTarget(t, Config{CntlIDBase: 0x100, CntlIDCount: 0x100}, dev)
	tgB, addrB := newTarget(t, Config{CntlIDBase: 0x200, CntlIDCount: 0x100}, dev)
	if err := tgB.SetANAState(testSubNQN, 1, nvme.ANAInaccessible); err != nil {
		t.Fatal(err)
	}
	aA, idA := adminConnect(t, addrA, 0, testHostNQN, testHostID)
	aB, idB := adminConnect(t, addrB, 0, testHostNQN, testHostID)
	if idA == idB {
		t.Fatalf("both nodes gave controller ID %#x", idA)
	}
	icA, _ := nvme.ParseIdentifyController(aA.identify(nvme.CNSController, 0).data)
	icB, _ := nvme.ParseIdentifyController(aB.identify(nvme.CNSController, 0).data)
	if icA.SubNQN != icB.SubNQN || icA.SN != icB.SN || icA.MN != icB.MN {
		t.Fatalf("paths disagree on identity: %q/%q %q/%q", icA.SubNQN, icB.SubNQN, icA.SN, icB.SN)
	}
	nsA := aA.identify(nvme.CNSNSDescList, 1).data
	nsB := aB.identify(nvme.CNSNSDescList, 1).data
	if !bytes.Equal(nsA, nsB) {
		t.Fatal("namespace descriptor lists differ between nodes")
	}
	anaLog := func(c *rawClient) nvme.ANALog {
		r := c.getLog(nvme.LogANA, 0, 4096, 0)
		if !r.cqe.Status.OK() {
			t.Fatalf("ANA log: %v", r.cqe.Status)
		}
		l, err := nvme.ParseANALog(r.data)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	lA, lB := anaLog(aA), anaLog(aB)
	if len(lA.Groups) != 1 || lA.Groups[0].State != nvme.ANAOptimized || len(lA.Groups[0].NSIDs) != 1 || lA.Groups[0].NSIDs[0] != 1 {
		t.Fatalf("node A ANA log %+v", lA)
	}
	if len(lB.Groups) != 1 || lB.Groups[0].State != nvme.ANAInaccessible {
		t.Fatalf("node B ANA log %+v", lB)
	}
	rgo, _ := nvme.ParseANALog(aB.getLog(nvme.LogANA, nvme.LogANALSPGroupsOnly, 4096, 0).data)
	if len(rgo.Groups) != 1 || len(rgo.Groups[0].NSIDs) != 0 {
		t.Fatalf("RGO ANA log %+v", rgo)
	}
	qB := ioConnect(t, addrB, 0, testHostNQN, testHostID, idB, 1)
	r := qB.read(1, 0, 1, testBS)
	if r.cqe.Status != nvme.StatusANAInaccessible {
		t.Fatalf("I/O through the inaccessible path: %v, want ANA inaccessible without DNR", r.cqe.Status)
	}
	if r := qB.writeBlocks(1, 0, make([]byte, testBS), testBS, true); r.cqe.Status != nvme.StatusANAInaccessible {
		t.Fatalf("write through the inaccessible path: %v", r.cqe.Status)
	}
	// Enable ANA AENs and leave an AER outstanding, as Linux does.
	aB.setFeature(nvme.FeatAsyncEventCfg, nvme.OAESANAChange)
	aB.cid++
	aer := nvme.SQE{Opcode: nvme.AdminAsyncEvent, CID: aB.cid, Flags: nvme.SQEFlagSGLMeta, DPTR: nvme.SGL{Type: nvme.SGLTypeTransport}}
	aB.sendCapsule(&aer, nil)
	time.Sleep(20 * time.Millisecond) // let the AER park before the change
	if err := tgB.SetANAState(testSubNQN, 1, nvme.ANAOptimized); err != nil {
		t.Fatal(err)
	}
	p, err := aB.readPDU()
	if err != nil {
		t.Fatal(err)
	}
	cqe, err := nvme.ParseCapsuleResp(p.hdr)
	if err != nil || cqe.CID != aer.CID || !cqe.Status.OK() {
		t.Fatalf("AER completion %+v %v", cqe, err)
	}
	if want := nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeANAChange, nvme.LogANA); cqe.DW0() != want {
		t.Fatalf("AER result %#x, want %#x", cqe.DW0(), want)
	}
	lB2 := anaLog(aB)
	if lB2.Groups[0].State != nvme.ANAOptimized || lB2.ChangeCount <= lB.ChangeCount {
		t.Fatalf("after change: %+v (change count was %d)", lB2, lB.ChangeCount)
	}
	if r := qB.read(1, 0, 1, testBS); !r.cqe.Status.OK() {
		t.Fatalf("I/O after the path became optimized: %v", r.cqe.Status)
	}
	// A change while no AER is outstanding is delivered by the next AER.
	if err := tgB.SetANAState(testSubNQN, 1, nvme.ANAChange); err != nil {
		t.Fatal(err)
	}
	if r := qB.read(1, 0, 1, testBS); r.cqe.Status != nvme.StatusANATransition {
		t.Fatalf("I/O in ANA change state: %v", r.cqe.Status)
	}
	if r := aB.do(nvme.SQE{Opcode: nvme.AdminAsyncEvent}, nil, false); r.cqe.DW0()>>8&0xFF != uint32(nvme.AENNoticeANAChange) {
		t.Fatalf("queued AEN: %#x %v", r.cqe.DW0(), r.cqe.Status)
	}
	if st, _ := tgA.ANAState(testSubNQN, 1); st != nvme.ANAOptimized {
		t.Fatalf("node A state changed to %v by node B's change", st)
	}
	if err := tgA.SetANAState("nqn.missing", 1, nvme.ANAOptimized); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown subsystem: %v", err)
	}
	if err := tgA.SetANAState(testSubNQN, 0, nvme.ANAOptimized); !errors.Is(err, ErrInvalid) {
		t.Fatalf("group 0: %v", err)
	}
}
