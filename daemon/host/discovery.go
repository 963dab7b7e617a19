package host

import (
	"context"
	"fmt"

	"tier0/daemon/nvme"
)

// Discover connects to the discovery controller at addr (host:port; NVMe
// discovery uses 8009 by default but a target may also answer on its I/O
// port), reads the whole discovery log page (LID 0x70) and disconnects.
func Discover(ctx context.Context, addr, hostnqn string) (nvme.DiscoveryLog, error) {
	return DiscoverWith(ctx, addr, Options{HostNQN: hostnqn})
}

// DiscoverWith is Discover with more options (digests, dialer, logger);
// SubNQN and IOQueues are overridden.
func DiscoverWith(ctx context.Context, addr string, o Options) (nvme.DiscoveryLog, error) {
	o.SubNQN = nvme.DiscoveryNQN
	o.IOQueues = -1
	o.KATO = -1
	c, err := Dial(ctx, addr, o)
	if err != nil {
		return nvme.DiscoveryLog{}, fmt.Errorf("discovery at %s: %w", addr, err)
	}
	defer c.Close()
	const hdr = 1024
	const entry = 1024
	// header first for the record count, then the whole page; retry when
	// the generation counter moved in between (the spec's recipe)
	for try := 0; try < 5; try++ {
		h := make([]byte, hdr)
		if err := c.GetLogPage(ctx, nvme.LogDiscovery, 0, 0, 0, h); err != nil {
			return nvme.DiscoveryLog{}, fmt.Errorf("discovery log header at %s: %w", addr, err)
		}
		first, err := nvme.ParseDiscoveryLog(h)
		if err != nil {
			return nvme.DiscoveryLog{}, fmt.Errorf("discovery log header at %s: %w", addr, err)
		}
		n := first.NumRec
		if n > 1024 {
			return nvme.DiscoveryLog{}, fmt.Errorf("discovery log at %s claims %d records; refusing more than 1024", addr, n)
		}
		if n == 0 {
			return first, nil
		}
		buf := make([]byte, hdr+int(n)*entry)
		if err := c.GetLogPage(ctx, nvme.LogDiscovery, 0, 0, 0, buf); err != nil {
			return nvme.DiscoveryLog{}, fmt.Errorf("discovery log at %s: %w", addr, err)
		}
		l, err := nvme.ParseDiscoveryLog(buf)
		if err != nil {
			return nvme.DiscoveryLog{}, fmt.Errorf("discovery log at %s: %w", addr, err)
		}
		if l.GenCtr == first.GenCtr {
			return l, nil
		}
	}
	return nvme.DiscoveryLog{}, fmt.Errorf("discovery log at %s kept changing over 5 reads", addr)
}
