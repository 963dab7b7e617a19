package host

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/target"
)

// heldWrite holds the first WriteAt inside the device until release.
type heldWrite struct {
	blockdev.Device
	entered chan struct{}
	gate    chan struct{}
	once    sync.Once
	n       atomic.Int64
}

func (h *heldWrite) WriteAt(p []byte, off int64) (int, error) {
	if h.n.Add(1) == 1 {
		close(h.entered)
		<-h.gate
	}
	return h.Device.WriteAt(p, off)
}

func (h *heldWrite) release() { h.once.Do(func() { close(h.gate) }) }

// logSignal is a slog handler that closes ch on the first record whose
// message starts with prefix.
type logSignal struct {
	prefix string
	ch     chan struct{}
	once   *sync.Once
}

func (l logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (l logSignal) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, l.prefix) {
		l.once.Do(func() { close(l.ch) })
	}
	return nil
}
func (l logSignal) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logSignal) WithGroup(string) slog.Handler      { return l }

// TestLostWriteNeverLandsAfterLaterWrite runs issue 12 hole 2's schedule
// with tier0's host against tier0's target: a write of 0xAA is held inside
// the target's device (one worker per queue) when the host gives up on the
// association; the host reconnects, its write completes, and the
// application then writes 0x55 to the same block, acknowledged. Once the
// held write is released, the block must read 0x55. The target refuses the
// host's new I/O queue until the held command has finished, and the host
// resubmits its write only after KATO + CQT; before those rules the
// resubmitted write completed at once on the new association, the 0x55
// write was acknowledged, and the original landed on top of it.
func TestLostWriteNeverLandsAfterLaterWrite(t *testing.T) {
	const nqn = "nqn.2026-11.io.tier0.test:lifetime"
	mem := blockdev.NewMem(1<<20, 512)
	dev := &heldWrite{Device: mem, entered: make(chan struct{}), gate: make(chan struct{})}
	t.Cleanup(dev.release)
	refused := make(chan struct{})
	log := slog.New(logSignal{prefix: "I/O queue connect refused", ch: refused, once: &sync.Once{}})
	tg, err := target.New(target.Config{Listen: "127.0.0.1:0", WorkersPerQueue: 1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	if err := tg.AddSubsystem(target.SubsystemConfig{NQN: nqn, AllowAnyHost: true}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddNamespace(nqn, target.NamespaceConfig{NSID: 1, Device: dev}); err != nil {
		t.Fatal(err)
	}
	c, err := Dial(context.Background(), tg.Addr().String(), Options{SubNQN: nqn, IOQueues: 1, QueueDepth: 8,
		KATO: time.Second, ReconnectDelay: 20 * time.Millisecond, CtrlLossTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { _, err := ns.WriteAt(bytes.Repeat([]byte{0xAA}, 512), 0); first <- err }()
	select {
	case <-dev.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first write never reached the device")
	}
	// The host gives up on the association (as on an I/O timeout).
	c.mu.Lock()
	a := c.cur
	c.mu.Unlock()
	a.fail(errors.New("test: association abandoned by the host"))
	var err1 error
	select {
	case <-refused:
		// the target holds the host off while the old command runs
		dev.release()
		err1 = <-first
	case err1 = <-first:
	case <-time.After(20 * time.Second):
		t.Fatal("neither a refused reconnect nor a completed write")
	}
	if err1 != nil {
		t.Fatalf("first write after the reconnect: %v", err1)
	}
	later := bytes.Repeat([]byte{0x55}, 512)
	if _, err := ns.WriteAt(later, 0); err != nil {
		t.Fatalf("later write: %v", err)
	}
	dev.release()
	c.Close()
	tg.Close() // waits for every connection's workers
	got := make([]byte, 512)
	if _, err := mem.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, later) {
		t.Fatalf("block 0 reads %#x after the acknowledged write of 0x55: a command of the abandoned association landed after it", got[0])
	}
}
