package node

import (
	"context"
	"fmt"
	"slices"
	"time"

	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/daemon/rdma"
)

// checkTransports refuses, before anything is opened, a fabric whose
// transport this binary cannot serve.
func checkTransports(cfg *config.Config) error {
	for _, f := range []struct {
		name string
		f    config.Fabric
	}{{"backend", cfg.Fabrics.Backend}, {"frontend", cfg.Fabrics.Frontend}} {
		if f.f.Transport == config.TransportRDMA && !rdma.Built {
			return fmt.Errorf("fabrics.%s.transport is rdma in %s, but %w (docs/RDMA.md); or set transport: tcp", f.name, cfg.File, rdma.ErrNotBuilt)
		}
	}
	return nil
}

// rdmaListen is the address a fabric's target serves NVMe/RDMA on: the
// fabric's own address and port (rdma_cm's port space is not TCP's), or
// "" when the fabric runs NVMe/TCP only.
func (n *Node) rdmaListen(f config.Fabric, e config.Endpoint) string {
	if f.Transport != config.TransportRDMA {
		return ""
	}
	return n.me.ListenAddr(e)
}

// memberUnreachable classifies a member's I/O error for the RAID layer:
// a path error over either transport means the member is missing (resynced
// from the bitmap when it returns), not failed.
func memberUnreachable(err error) bool {
	return host.IsPathError(err) || rdma.IsPathError(err)
}

var _ Member = (*rdma.Namespace)(nil)

// rdmaMemberMaxTransfer is the data buffer size of an RDMA member's
// queues: a RAID chunk (128 KiB by default) in one command.
const rdmaMemberMaxTransfer = 128 << 10

// dialMemberRDMA imports a member drive over NVMe/RDMA: one association
// (rdma.Controller) and its namespace. Unlike the NVMe/TCP member it does
// not reconnect by itself: a lost queue fails the member's I/O with a path
// error, the RAID layer marks the member missing, and the owner's re-add
// (repair.go, the same path a returning node takes) imports it again with
// a new association and resyncs it.
func (n *Node) dialMemberRDMA(ctx context.Context, arrayName, drive string) (MemberConn, Member, error) {
	node, _, ok := n.cfg.Drive(drive)
	if !ok {
		return nil, nil, fmt.Errorf("drive %s is not in the site config", drive)
	}
	nsid := uint32(max(1, slices.Index(n.cfg.DriveShares(drive), arrayName)+1))
	f := n.cfg.Fabrics.Backend
	if f.DHCHAPSecret != "" {
		// config validation refuses this; never connect unauthenticated
		return nil, nil, fmt.Errorf("import member %s: fabrics.backend.dhchap_secret is set and tier0's NVMe/RDMA host cannot authenticate; use transport tcp on the backend", drive)
	}
	timeout := n.cfg.Policies.MemberIOTimeout.D()
	if timeout <= 0 {
		timeout = config.DefaultMemberIOTimeout
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	addr := node.AdvertiseAddr(node.Backend)
	c, err := rdma.Connect(dctx, addr, rdma.Options{
		SubNQN:     n.cfg.DriveNQN(drive),
		HostNQN:    hostNQN(n.cfg, n.me.Name),
		HostID:     hostID(n.cfg, n.me.Name),
		IOQueues:   max(1, f.Queues),
		QueueDepth: max(16, f.QueueDepth),
		// each I/O queue registers depth buffers of this size once: 16 MiB
		// per queue at depth 128 (larger commands are split)
		MaxTransfer: rdmaMemberMaxTransfer,
		Timeout:     timeout,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("import member %s from node %s over RDMA (%s): %w", drive, node.Name, addr, err)
	}
	ns, err := c.Namespace(nsid)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("import member %s namespace %d over RDMA: %w", drive, nsid, err)
	}
	n.log.Info("member imported over NVMe/RDMA", "array", arrayName, "member", drive, "addr", addr, "cntlid", c.CntlID(), "ioqueues", max(1, f.Queues))
	return c, ns, nil
}

// backendRDMA: the nodes import members over NVMe/RDMA.
func (n *Node) backendRDMA() bool {
	return n.cfg.Fabrics.Backend.Transport == config.TransportRDMA
}
