package target

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
	"tier0/daemon/nvme"
)

// holdFirstWrite holds the first WriteAt inside the device until release
// is called and counts the writes that reach the device.
type holdFirstWrite struct {
	blockdev.Device
	entered chan struct{} // closed when the first write is held
	gate    chan struct{} // closed by release
	once    sync.Once
	writes  atomic.Int64
}

func newHoldFirstWrite(dev blockdev.Device) *holdFirstWrite {
	return &holdFirstWrite{Device: dev, entered: make(chan struct{}), gate: make(chan struct{})}
}

func (h *holdFirstWrite) WriteAt(p []byte, off int64) (int, error) {
	if h.writes.Add(1) == 1 {
		close(h.entered)
		<-h.gate
	}
	return h.Device.WriteAt(p, off)
}

func (h *holdFirstWrite) release() { h.once.Do(func() { close(h.gate) }) }

// waitGone waits until the target no longer lists controller id, i.e. it
// has seen the admin queue's connection close.
func waitGone(t *testing.T, tg *Target, id uint16) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		gone := true
		for _, c := range tg.Controllers() {
			if c.CntlID == id {
				gone = false
			}
		}
		if gone {
			return
		}
	}
	t.Fatalf("controller %d still listed 10 s after its connections closed", id)
}

// TestDeadConnectionCommandsNeverRunAfterRetry is issue 12 hole 2: four
// writes of 0xAA to block 0 are queued on one I/O queue (one worker, the
// first held inside the device); the host gives up on the connection and a
// new association of the same host writes 0x55 to block 0, which is
// acknowledged; then the held write is released. Block 0 must read 0x55:
// the commands still queued behind the closed connection are dropped, and
// the new association is not admitted to I/O before the one already
// executing has finished (its I/O queue Connect waits CommandQuiesceTime,
// 2 s, for it and is then refused with a retryable status).
func TestDeadConnectionCommandsNeverRunAfterRetry(t *testing.T) {
	mem := blockdev.NewMem(testSize, testBS)
	dev := newHoldFirstWrite(mem)
	t.Cleanup(dev.release)
	tg, addr := newTarget(t, Config{WorkersPerQueue: 1}, dev)

	adm, id := adminConnect(t, addr, 0, testHostNQN, testHostID)
	q := ioConnect(t, addr, 0, testHostNQN, testHostID, id, 1)
	old := bytes.Repeat([]byte{0xAA}, testBS)
	for cid := uint16(1); cid <= 4; cid++ {
		s := rwSQE(nvme.CmdWrite, 1, 0, 1)
		s.CID = cid
		s.Flags = nvme.SQEFlagSGLMeta
		s.DPTR = nvme.SGL{Length: testBS, Type: nvme.SGLTypeInCapsule}
		q.sendCapsule(&s, old)
	}
	select {
	case <-dev.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never reached the device")
	}
	// The host gives up on the association (as after an I/O timeout).
	q.nc.Close()
	adm.nc.Close()
	waitGone(t, tg, id)

	// The host reconnects and resubmits: a new association writes 0x55.
	_, id2 := adminConnect(t, addr, 0, testHostNQN, testHostID)
	var q2 *rawClient
	refused := 0
	for end := time.Now().Add(10 * time.Second); q2 == nil; {
		c := dialRaw(t, addr, 0)
		cqe := c.connect(testSubNQN, testHostNQN, testHostID, 1, id2, 127, 0)
		switch {
		case cqe.Status.OK():
			q2 = c
		case cqe.Status == nvme.StatusConnectCtrlBusy:
			// refused while the old controller's command executes:
			// retryable (no DNR), so the host retries
			refused++
			dev.release()
			if time.Now().After(end) {
				t.Fatalf("I/O queue connect still refused 10 s after the old command finished")
			}
			c.nc.Close()
			time.Sleep(5 * time.Millisecond)
		default:
			t.Fatalf("I/O queue connect of the new association: %v, want success or retryable controller busy", cqe.Status)
		}
	}
	newer := bytes.Repeat([]byte{0x55}, testBS)
	if r := q2.writeBlocks(1, 0, newer, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("new association's write: %v", r.cqe.Status)
	}
	dev.release()
	tg.Close() // waits for every connection, the old queue's worker included
	got := make([]byte, testBS)
	if _, err := mem.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, newer) {
		t.Fatalf("block 0 reads %#x after the new association's acknowledged write of 0x55 (connect refused %d times): "+
			"commands of the closed connection ran after it", got[0], refused)
	}
	if n := dev.writes.Load(); n != 2 {
		t.Fatalf("%d writes reached the device, want 2 (the one executing at the close, and the new association's); the 3 queued behind the closed connection must be dropped", n)
	}
}

// TestIdentifyAdvertisesCQT: Identify Controller reports the Command
// Quiesce Time the host waits for (CommandQuiesceTime + KeepAliveSweep,
// in ms) before resubmitting a lost association's writes.
func TestIdentifyAdvertisesCQT(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want uint16
	}{
		{Config{}, 2250},
		{Config{CommandQuiesceTime: 500 * time.Millisecond, KeepAliveSweep: 100 * time.Millisecond}, 600},
	} {
		_, addr := newTarget(t, tc.cfg, nil)
		a, _ := adminConnect(t, addr, 0, testHostNQN, testHostID)
		ic, err := nvme.ParseIdentifyController(a.identify(nvme.CNSController, 0).data)
		if err != nil {
			t.Fatal(err)
		}
		if ic.CQT != tc.want {
			t.Errorf("CQT %d ms with CommandQuiesceTime %v and KeepAliveSweep %v, want %d", ic.CQT, tc.cfg.CommandQuiesceTime, tc.cfg.KeepAliveSweep, tc.want)
		}
	}
	if _, err := New(Config{CommandQuiesceTime: 61 * time.Second}); err == nil {
		t.Error("CommandQuiesceTime 61 s accepted; CQT holds at most 65535 ms")
	}
}

// TestKeepAliveTimeoutDropsQueuedCommands is the partitioned-host case of
// the command lifetime rule: the host vanished without closing its
// connections, so only the keep-alive timeout ends its controller. The
// commands queued behind the one executing are dropped then, not run
// against the device after the host (which waits KATO + CQT) resubmitted
// them elsewhere; and the host's new I/O queue waits for the held one.
func TestKeepAliveTimeoutDropsQueuedCommands(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	mem := blockdev.NewMem(testSize, testBS)
	dev := newHoldFirstWrite(mem)
	t.Cleanup(dev.release)
	tg, addr := newTarget(t, Config{WorkersPerQueue: 1, Clock: clk, KeepAliveSweep: 5 * time.Millisecond}, dev)
	adm := dialRaw(t, addr, 0)
	c := adm.connect(testSubNQN, testHostNQN, testHostID, 0, nvme.CntlIDDynamic, 31, 1000) // KATO 1 s
	if !c.Status.OK() {
		t.Fatal(c.Status)
	}
	adm.enable()
	id := uint16(c.DW0())
	q := ioConnect(t, addr, 0, testHostNQN, testHostID, id, 1)
	for cid := uint16(1); cid <= 4; cid++ {
		s := rwSQE(nvme.CmdWrite, 1, 0, 1)
		s.CID = cid
		s.Flags = nvme.SQEFlagSGLMeta
		s.DPTR = nvme.SGL{Length: testBS, Type: nvme.SGLTypeInCapsule}
		q.sendCapsule(&s, bytes.Repeat([]byte{0xAA}, testBS))
	}
	select {
	case <-dev.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never reached the device")
	}
	// Give the reader time to queue the other three (they are in the socket
	// already); whether they were queued or not, none may run.
	// (reading q.work is ordered after its creation by <-dev.entered)
	tg.mu.Lock()
	ctrl := tg.ctrls[id]
	tg.mu.Unlock()
	ctrl.mu.Lock()
	ioq := ctrl.ioq[1]
	ctrl.mu.Unlock()
	for end := time.Now().Add(2 * time.Second); len(ioq.work) < 3 && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	clk.Advance(2 * time.Second) // the host fell silent: past its KATO
	waitGone(t, tg, id)
	dev.release()
	tg.Close()
	if n := dev.writes.Load(); n != 1 {
		t.Fatalf("%d writes reached the device after the keep-alive timeout, want 1 (the one executing); the queued ones must be dropped", n)
	}
}
