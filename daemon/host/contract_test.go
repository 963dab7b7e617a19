package host_test

import (
	"context"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/blockdevtest"
	"tier0/daemon/host"
	"tier0/daemon/target"
)

const contractNQN = "nqn.2026-11.io.tier0:test:contract"

// TestContract runs the blockdev.Device contract suite against a namespace
// imported from a real tier0 target on loopback, and checks that neither
// side leaves goroutines behind once both are closed.
func TestContract(t *testing.T) {
	for _, bs := range []int{512, 4096} {
		blockdevtest.Run(t, func(t *testing.T) blockdev.Device {
			blockdevtest.NoLeaks(t)
			tg, err := target.New(target.Config{Listen: "127.0.0.1:0"})
			if err != nil {
				t.Fatal(err)
			}
			if err := tg.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tg.Close() })
			if err := tg.AddSubsystem(target.SubsystemConfig{NQN: contractNQN, AllowAnyHost: true}); err != nil {
				t.Fatal(err)
			}
			if err := tg.AddNamespace(contractNQN, target.NamespaceConfig{NSID: 1, Device: blockdev.NewMem(4<<20, bs)}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := host.Dial(ctx, tg.Addr().String(), host.Options{SubNQN: contractNQN, HostNQN: "nqn.2026-11.io.tier0:test:contract-host",
				IOQueues: 2, QueueDepth: 16, KATO: 5 * time.Second, CtrlLossTimeout: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			ns, err := c.Namespace(1)
			if err != nil {
				t.Fatal(err)
			}
			return ns
		}, blockdevtest.Options{})
	}
}
