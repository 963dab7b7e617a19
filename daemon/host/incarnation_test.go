package host

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/target"
)

// bootTarget serves dev as namespace 1 of nqn at addr ("127.0.0.1:0": any
// port) for a node booted as bootID.
func bootTarget(t *testing.T, addr, nqn, bootID string, dev blockdev.Device) *target.Target {
	t.Helper()
	tg, err := target.New(target.Config{Listen: addr, BootID: bootID})
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
	return tg
}

// TestNamespaceIncarnationFollowsTargetBoot: an imported namespace reports
// its target node's boot incarnation (raid.Incarnated) from the Identify
// Controller of the association in use. A restart of the target with the
// same boot id (tier0d restarted, the machine not) keeps it; with another
// boot id a reconnect reads the new one. Under Options.OneIncarnation (a
// RAID member) the reconnect to the new boot is not taken: the
// namespace's I/O fails as a path error and it keeps the incarnation it
// was made to, while a fresh Dial reports the new one.
func TestNamespaceIncarnationFollowsTargetBoot(t *testing.T) {
	const nqn = "nqn.2026-12.io.tier0.test:incarnation"
	mem := blockdev.NewMem(1<<20, 512)
	tg := bootTarget(t, "127.0.0.1:0", nqn, "boot-1", mem)
	addr := tg.Addr().String()
	o := Options{SubNQN: nqn, IOQueues: 1, QueueDepth: 8, KATO: time.Second, ReconnectDelay: 10 * time.Millisecond, CtrlLossTimeout: 30 * time.Second}
	plain, err := Dial(context.Background(), addr, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plain.Close() })
	mo := o
	mo.FailFast, mo.OneIncarnation = true, true
	member, err := Dial(context.Background(), addr, mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { member.Close() })
	pns, err := plain.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	mns, err := member.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	boot1 := pns.Incarnation()
	if boot1 == 0 || mns.Incarnation() != boot1 {
		t.Fatalf("incarnations %#x and %#x from a tier0 target, want the same non-zero one", boot1, mns.Incarnation())
	}
	restart := func(bootID string) {
		t.Helper()
		tg.Close()
		tg = bootTarget(t, addr, nqn, bootID, mem)
	}

	restart("boot-1") // tier0d restarted, not the machine
	waitFor(t, "reconnect after the restart with the same boot id", func() bool { return plain.Reconnects() >= 1 && member.Reconnects() >= 1 })
	if _, err := mns.WriteAt(make([]byte, 512), 0); err != nil {
		t.Fatalf("member write after a restart with the same boot id: %v", err)
	}
	if pns.Incarnation() != boot1 || mns.Incarnation() != boot1 {
		t.Fatalf("after a restart with the same boot id: incarnations %#x and %#x, want %#x", pns.Incarnation(), mns.Incarnation(), boot1)
	}

	restart("boot-2") // the machine rebooted
	waitFor(t, "reconnect after the reboot", func() bool { return plain.Reconnects() >= 2 })
	boot2 := pns.Incarnation()
	if boot2 == 0 || boot2 == boot1 {
		t.Fatalf("after the reboot: incarnation %#x, want a new non-zero one (was %#x)", boot2, boot1)
	}
	if _, err := pns.WriteAt(make([]byte, 512), 0); err != nil {
		t.Fatalf("plain host's write after the reboot: %v", err)
	}
	var werr error
	waitFor(t, "the member's I/O failing after the reboot", func() bool {
		_, werr = mns.WriteAt(make([]byte, 512), 0)
		return werr != nil && strings.Contains(werr.Error(), "restarted")
	})
	if !IsPathError(werr) || !errors.Is(werr, blockdev.ErrIO) {
		t.Errorf("member write after the reboot: %v; want a path error (the array takes the member as missing)", werr)
	}
	if mns.Incarnation() != boot1 || member.Reconnects() != 1 {
		t.Errorf("member after the reboot: incarnation %#x, %d reconnects; want %#x (the one it was made to), 1", mns.Incarnation(), member.Reconnects(), boot1)
	}
	again, err := Dial(context.Background(), addr, mo)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.Incarnation() != boot2 {
		t.Errorf("a fresh import after the reboot: incarnation %#x, want %#x", again.Incarnation(), boot2)
	}
}
