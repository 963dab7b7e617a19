package target

import (
	"errors"
	"sync/atomic"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// growable is a device whose size grows up to its backing device's.
type growable struct {
	blockdev.Device
	size atomic.Int64
}

func (g *growable) Size() int64 { return g.size.Load() }

// TestResizeNamespace: after the device grows, ResizeNamespace raises the
// namespace-attribute-changed notice, the Changed Namespace List names the
// namespace, and Identify Namespace reports the new NSZE/NCAP; I/O past the
// old end succeeds.
func TestResizeNamespace(t *testing.T) {
	tg, addr := newTarget(t, Config{}, nil)
	dev := &growable{Device: blockdev.NewMem(4<<20, 4096)}
	dev.size.Store(1 << 20)
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 7, Device: dev}); err != nil {
		t.Fatal(err)
	}
	a, _ := adminConnect(t, addr, 0, testHostNQN, testHostID)
	a.setFeature(nvme.FeatAsyncEventCfg, nvme.OAESNSAttr)
	if ns, _ := nvme.ParseIdentifyNamespace(a.identify(nvme.CNSNamespace, 7).data); ns.NSZE != 256 {
		t.Fatalf("before: NSZE %d, want 256", ns.NSZE)
	}
	dev.size.Store(3 << 20)
	if err := tg.ResizeNamespace(testSubNQN, 7); err != nil {
		t.Fatal(err)
	}
	r := a.do(nvme.SQE{Opcode: nvme.AdminAsyncEvent}, nil, false)
	if r.cqe.DW0() != nvme.AENResult(nvme.AENTypeNotice, nvme.AENNoticeNSChanged, nvme.LogChangedNSList) {
		t.Fatalf("resize AEN %#x, want the namespace-attribute-changed notice", r.cqe.DW0())
	}
	if ch := a.getLog(nvme.LogChangedNSList, 0, 4096, 0xFFFFFFFF); le32(ch.data) != 7 {
		t.Fatalf("changed namespace list starts with %d, want 7", le32(ch.data))
	}
	ns, _ := nvme.ParseIdentifyNamespace(a.identify(nvme.CNSNamespace, 7).data)
	if ns.NSZE != 768 || ns.NCAP != 768 {
		t.Fatalf("after: NSZE %d NCAP %d, want 768", ns.NSZE, ns.NCAP)
	}
	if err := tg.ResizeNamespace(testSubNQN, 8); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resize of an absent namespace: %v", err)
	}
	dev.size.Store(3<<20 + 512)
	if err := tg.ResizeNamespace(testSubNQN, 7); !errors.Is(err, ErrInvalid) {
		t.Fatalf("size not a block multiple: %v", err)
	}
}
