package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"time"

	nvmeof "tier0/daemon/host"
	"tier0/daemon/rdma"
)

// reconnect: daemon/host over rdma.Transport (the host's Fabrics Connect,
// keep-alive, events and reconnect, NVMe/RDMA queues) connected to
// nvmet-rdma. The association stays up while idle past the keep-alive
// timeout (the host's Keep Alive reaches nvmet over RDMA); the target's
// port is removed: the host notices (DISCONNECTED) and keeps trying; the
// port is re-added: the host reconnects by itself, without the caller
// connecting again, and the data written before reads back while new
// writes verify.
func reconnect(addr, nqn, remove, readd string) error {
	ctx := context.Background()
	const kato = 5 * time.Second
	o := nvmeof.Options{SubNQN: nqn, IOQueues: 2, QueueDepth: 32, KATO: kato,
		Transport:   &rdma.Transport{MaxTransfer: 256 << 10},
		DialTimeout: 20 * time.Second, IOTimeout: 60 * time.Second, CtrlLossTimeout: 3 * time.Minute,
		Logger: slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	c, err := dialRetry(ctx, addr, o)
	if err != nil {
		return fmt.Errorf("host.Dial over rdma.Transport: %v", err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		return err
	}
	// Writes of up to nvmet-rdma's in-capsule size (IOCCSZ; its default
	// inline_data_size is 4 KiB) go in the command capsule, larger ones by
	// keyed SGL (RDMA READ); both verify.
	id := c.Identify()
	inline := min(id.InCapsuleData(), 16<<10) // rdma.Transport's default MaxInline
	if inline == 0 {
		return errors.New("nvmet-rdma reports no in-capsule data (IOCCSZ 4): the host's in-capsule writes are not tested")
	}
	for i, n := range []int{512, 4096, inline, 8192 + 512} {
		w := pattern(uint64(30+i), n)
		at := int64(8<<20 + i*(64<<10))
		if _, err := ns.WriteAt(w, at); err != nil {
			return fmt.Errorf("write of %d bytes (in-capsule up to %d): %v", n, inline, err)
		}
		if err := readBack(ns, w, at); err != nil {
			return fmt.Errorf("write of %d bytes (in-capsule up to %d): %v", n, inline, err)
		}
	}
	fmt.Printf("PASS host writes to nvmet-rdma in the capsule up to %d bytes (IOCCSZ %d) and by keyed SGL above: all verify\n", inline, id.IOCCSZ)
	before := pattern(21, 1<<20+4096) // split at the 256 KiB transfer size
	if _, err := ns.WriteAt(before, 1<<20); err != nil {
		return fmt.Errorf("write before the port loss: %v", err)
	}
	if err := readBack(ns, before, 1<<20); err != nil {
		return fmt.Errorf("before the port loss: %v", err)
	}
	idle := 3 * kato
	time.Sleep(idle)
	if !c.Connected() || c.Reconnects() != 0 {
		return fmt.Errorf("after %v idle (KATO %v): connected %v, reconnects %d: the keep-alive over RDMA did not hold the association", idle, kato, c.Connected(), c.Reconnects())
	}
	fmt.Printf("PASS host keep-alive over RDMA: association idle %v (KATO %v) still up, no reconnect\n", idle, kato)

	if out, err := exec.Command("sh", "-c", remove).CombinedOutput(); err != nil {
		return fmt.Errorf("removing the port (%s): %v: %s", remove, err, out)
	}
	t0 := time.Now()
	for c.Connected() && time.Since(t0) < time.Minute {
		time.Sleep(20 * time.Millisecond)
	}
	if c.Connected() {
		return errors.New("the host still holds its association a minute after the target's port was removed")
	}
	fmt.Printf("PASS host: association lost %v after the port was removed; reconnecting by itself\n", time.Since(t0).Round(time.Millisecond))
	time.Sleep(2 * time.Second) // a few reconnect attempts meet the removed port
	if out, err := exec.Command("sh", "-c", readd).CombinedOutput(); err != nil {
		return fmt.Errorf("re-adding the port (%s): %v: %s", readd, err, out)
	}
	t1 := time.Now()
	// no new Dial: the namespace's I/O waits for the host's own reconnect
	if err := readBack(ns, before, 1<<20); err != nil {
		return fmt.Errorf("after the port was re-added: %v", err)
	}
	took := time.Since(t1)
	after := pattern(22, 512<<10)
	if _, err := ns.WriteAt(after, 4<<20); err != nil {
		return fmt.Errorf("write after the reconnect: %v", err)
	}
	if err := readBack(ns, after, 4<<20); err != nil {
		return fmt.Errorf("after the reconnect: %v", err)
	}
	if n := c.Reconnects(); n < 1 {
		return fmt.Errorf("I/O works again but Reconnects is %d", n)
	}
	fmt.Printf("PASS host reconnected by itself over RDMA %v after the port was re-added (reconnects %d): data written before reads back, new writes verify\n", took.Round(time.Millisecond), c.Reconnects())
	return nil
}

// dialRetry is host.Dial, tried again (twice at most, 2 s apart) when the
// association cannot be set up: nvmet-rdma releases the previous
// association's queues asynchronously, and under TCG a connect right after
// it is refused ("nvmet_rdma: failed to connect queue 1") with the reject
// lost on soft-RoCE ("no RDMA CM event"), as the guest script's t0io
// retries for the CLI. Once connected, the host's own reconnect handles
// such refusals by itself.
func dialRetry(ctx context.Context, addr string, o nvmeof.Options) (*nvmeof.Controller, error) {
	for try := 1; ; try++ {
		c, err := nvmeof.Dial(ctx, addr, o)
		if err == nil || try == 3 {
			return c, err
		}
		fmt.Printf("RETRY host.Dial over rdma.Transport (try %d): %v; again in 2 s\n", try, err)
		time.Sleep(2 * time.Second)
	}
}

func readBack(ns *nvmeof.Namespace, want []byte, off int64) error {
	got := make([]byte, len(want))
	if _, err := ns.ReadAt(got, off); err != nil {
		return fmt.Errorf("read %d bytes at %d: %v", len(got), off, err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("read %d bytes at %d: differ from what was written", len(got), off)
	}
	return nil
}
