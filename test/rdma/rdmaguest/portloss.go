package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/rdma"
)

// portLoss: with tier0's host connected, the target's port is removed.
// The next I/O must fail with a transport error (blockdev.ErrIO, naming
// why), not hang until the command timeout; after the port is re-added a
// new association works. (Reconnecting by itself is daemon/host's job once
// it runs over RDMA; see docs/RDMA.md.)
func portLoss(addr, nqn, remove, readd string) error {
	ctx := context.Background()
	// a long command timeout, so that a failure by timeout is not taken
	// for the disconnect
	o := rdma.Options{SubNQN: nqn, Timeout: 60 * time.Second}
	c, err := connectRetry(ctx, addr, o)
	if err != nil {
		return err
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		return err
	}
	w := pattern(11, 4096)
	if _, err := ns.WriteAt(w, 0); err != nil {
		return fmt.Errorf("write before the port loss: %v", err)
	}
	if out, err := exec.Command("sh", "-c", remove).CombinedOutput(); err != nil {
		return fmt.Errorf("removing the port (%s): %v: %s", remove, err, out)
	}
	t0 := time.Now()
	var ioErr error
	for i := 0; i < 400 && ioErr == nil; i++ {
		_, ioErr = ns.WriteAt(w, 0)
		if ioErr == nil {
			time.Sleep(25 * time.Millisecond) // the target tears down asynchronously
		}
	}
	if ioErr == nil {
		return errors.New("I/O kept succeeding for 400 writes after the target's port was removed")
	}
	if !errors.Is(ioErr, blockdev.ErrIO) || errors.Is(ioErr, blockdev.ErrTimeout) {
		return fmt.Errorf("I/O after the port loss failed with %v, want a transport error (ErrIO), not a timeout", ioErr)
	}
	fmt.Printf("PASS port removed: I/O failed after %v with: %v\n", time.Since(t0).Round(time.Millisecond), ioErr)
	c.Close()
	if out, err := exec.Command("sh", "-c", readd).CombinedOutput(); err != nil {
		return fmt.Errorf("re-adding the port (%s): %v: %s", readd, err, out)
	}
	c2, err := connectRetry(ctx, addr, o)
	if err != nil {
		return fmt.Errorf("connecting after the port was re-added: %v", err)
	}
	defer c2.Close()
	ns2, err := c2.Namespace(1)
	if err != nil {
		return err
	}
	r := make([]byte, 4096)
	if _, err := ns2.ReadAt(r, 0); err != nil {
		return err
	}
	if !bytes.Equal(r, w) {
		return errors.New("data written before the port loss reads back different after re-adding it")
	}
	fmt.Println("PASS port re-added: a new association reads back the data written before")
	return nil
}

// connectRetry is rdma.Connect, tried again (twice at most, 2 s apart)
// when the association cannot be set up: a connect right after the last
// association closed meets nvmet-rdma's asynchronous release of its
// queues under TCG ("nvmet_rdma: failed to connect queue 1", the reject
// lost on soft-RoCE: "no RDMA CM event"), as t0io in the guest script and
// dialRetry work around. I/O errors are never retried.
func connectRetry(ctx context.Context, addr string, o rdma.Options) (*rdma.Controller, error) {
	for try := 1; ; try++ {
		c, err := rdma.Connect(ctx, addr, o)
		if err == nil || try == 3 {
			return c, err
		}
		fmt.Printf("RETRY rdma.Connect (try %d): %v; again in 2 s\n", try, err)
		time.Sleep(2 * time.Second)
	}
}
