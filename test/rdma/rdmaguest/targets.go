package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/target"
)

// targets serves nqn from two tier0 targets in this process, one
// NVMe/RDMA port each (addrs[0] optimized, addrs[1] inaccessible), over
// one 64 MiB memory device and with the same namespace identity, so that
// Linux's nvme-rdma host merges them into one multipath device. Each
// SIGUSR1 swaps the two ports' ANA states (an ANA change event on both);
// SIGTERM ends it. It writes ready once both listen.
func targets(addrs []string, nqn, ready string) error {
	if len(addrs) != 2 || nqn == "" {
		return fmt.Errorf("mode targets needs -addr A,B (two RDMA ports) and -nqn")
	}
	dev := blockdev.NewMem(64<<20, 512)
	var tgs [2]*target.Target
	states := [2]nvme.ANAState{nvme.ANAOptimized, nvme.ANAInaccessible}
	for i, a := range addrs {
		tg, err := target.New(target.Config{CntlIDBase: uint16(1 + 100*i), CntlIDCount: 100})
		if err != nil {
			return err
		}
		defer tg.Close()
		if err := tg.AddSubsystem(target.SubsystemConfig{NQN: nqn, AllowAnyHost: true, ANAStates: map[uint32]nvme.ANAState{1: states[i]}}); err != nil {
			return err
		}
		if err := tg.AddNamespace(nqn, target.NamespaceConfig{NSID: 1, Device: dev, ANAGroup: 1,
			NGUID: [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 0xAA, 2}, UUID: [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 0xBB, 2}}); err != nil {
			return err
		}
		if err := tg.ListenRDMA(a); err != nil {
			return err
		}
		tgs[i] = tg
	}
	fmt.Printf("serving %s over NVMe/RDMA on %s (optimized) and %s (inaccessible)\n", nqn, tgs[0].RDMAAddr(), tgs[1].RDMAAddr())
	if err := os.WriteFile(ready, []byte("ready\n"), 0o644); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	flip := make(chan os.Signal, 1)
	signal.Notify(flip, syscall.SIGUSR1)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-flip:
			states[0], states[1] = states[1], states[0]
			// the one going inaccessible first: never two optimized paths
			for i := range tgs {
				if states[i] == nvme.ANAInaccessible {
					if err := tgs[i].SetANAState(nqn, 1, states[i]); err != nil {
						return err
					}
				}
			}
			for i := range tgs {
				if states[i] != nvme.ANAInaccessible {
					if err := tgs[i].SetANAState(nqn, 1, states[i]); err != nil {
						return err
					}
				}
			}
			fmt.Printf("ANA flipped: %s %v, %s %v\n", addrs[0], states[0], addrs[1], states[1])
		}
	}
}
