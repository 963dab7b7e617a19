package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"tier0/daemon/blockdev"
	nvmeof "tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
	"tier0/daemon/target"
)

// authCheck: DH-HMAC-CHAP over NVMe/RDMA between daemon/host over
// rdma.Transport and tier0's target on a soft-RoCE port (the path of a
// node importing a member over an RDMA backend with dhchap_secret): a
// wrong secret is refused with host.ErrAuth; with the subsystem's secret,
// bidirectional, every queue authenticates (ffdhe group), I/O verifies,
// and after the target drops the association (its port closes and
// reopens) the host reconnects and authenticates again by itself. (The
// guest's kernel has no CONFIG_NVME_TARGET_AUTH, so nvmet-rdma cannot be
// the target here.)
func authCheck(addr, nqn string) error {
	hostSecret, err := nvme.GenerateDHCHAPSecret(32, nvme.HashSHA256)
	if err != nil {
		return err
	}
	ctrlSecret, err := nvme.GenerateDHCHAPSecret(48, nvme.HashSHA384)
	if err != nil {
		return err
	}
	other, _ := nvme.GenerateDHCHAPSecret(32, nvme.HashSHA256)
	dev := blockdev.NewMem(16<<20, 512)
	serve := func() (*target.Target, error) {
		tg, err := target.New(target.Config{})
		if err != nil {
			return nil, err
		}
		if err := tg.AddSubsystem(target.SubsystemConfig{NQN: nqn, AllowAnyHost: true}); err != nil {
			tg.Close()
			return nil, err
		}
		if err := tg.AddNamespace(nqn, target.NamespaceConfig{NSID: 1, Device: dev}); err != nil {
			tg.Close()
			return nil, err
		}
		if err := tg.SetDHCHAP(nqn, target.DHCHAPConfig{HostSecret: hostSecret, CtrlSecret: ctrlSecret}); err != nil {
			tg.Close()
			return nil, err
		}
		if err := tg.ListenRDMA(addr); err != nil {
			tg.Close()
			return nil, err
		}
		return tg, nil
	}
	tg, err := serve()
	if err != nil {
		return err
	}
	defer func() { tg.Close() }()
	ctx := context.Background()
	o := nvmeof.Options{SubNQN: nqn, IOQueues: 2, QueueDepth: 16, Transport: &rdma.Transport{MaxTransfer: 128 << 10},
		DialTimeout: 20 * time.Second, CtrlLossTimeout: 2 * time.Minute, DHCHAPSecret: other}
	if c, err := nvmeof.Dial(ctx, addr, o); !errors.Is(err, nvmeof.ErrAuth) {
		if c != nil {
			c.Close()
		}
		return fmt.Errorf("host.Dial over RDMA with a wrong secret: %v, want ErrAuth", err)
	}
	fmt.Println("PASS DH-HMAC-CHAP over RDMA: a wrong host secret is refused (host.ErrAuth)")
	o.DHCHAPSecret, o.DHCHAPCtrlSecret = hostSecret, ctrlSecret
	c, err := nvmeof.Dial(ctx, addr, o)
	if err != nil {
		return fmt.Errorf("host.Dial over RDMA with the subsystem's secrets: %v", err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		return err
	}
	w := pattern(31, 512<<10)
	if _, err := ns.WriteAt(w, 0); err != nil {
		return err
	}
	if err := readBack(ns, w, 0); err != nil {
		return err
	}
	fmt.Println("PASS DH-HMAC-CHAP over RDMA: bidirectional, every queue authenticated, 512 KiB written and read back")
	// the target goes away and comes back on the same port
	tg.Close()
	t0 := time.Now()
	for c.Connected() && time.Since(t0) < time.Minute {
		time.Sleep(20 * time.Millisecond)
	}
	if c.Connected() {
		return errors.New("the host still holds its association a minute after the target closed")
	}
	if tg, err = serve(); err != nil {
		return fmt.Errorf("serving again: %v", err)
	}
	if err := readBack(ns, w, 0); err != nil {
		return fmt.Errorf("after the target returned: %v", err)
	}
	if c.Reconnects() < 1 {
		return fmt.Errorf("reconnects %d after the target returned", c.Reconnects())
	}
	fmt.Printf("PASS DH-HMAC-CHAP over RDMA: the host reconnected and authenticated again by itself (reconnects %d)\n", c.Reconnects())
	return nil
}
