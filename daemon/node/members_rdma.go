package node

import (
	"context"
	"fmt"

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

// rdmaMemberMaxTransfer is the data buffer size of an RDMA member's
// queues: a RAID chunk (128 KiB by default) in one command.
const rdmaMemberMaxTransfer = 128 << 10

// dialMemberRDMA imports a member drive over NVMe/RDMA: daemon/host over
// rdma.Transport, so with the NVMe/TCP member's options (memberOptions:
// keep-alive, the member I/O timeout, FailFast, OneIncarnation, reconnect
// with backoff) and DH-HMAC-CHAP secret. Each I/O queue registers its
// depth+1 slots of rdmaMemberMaxTransfer once (larger commands are split).
func (n *Node) dialMemberRDMA(ctx context.Context, arrayName, drive string) (MemberConn, Member, error) {
	c, ns, err := n.dialMember(ctx, arrayName, drive, &rdma.Transport{MaxTransfer: rdmaMemberMaxTransfer})
	if err != nil {
		return nil, nil, err
	}
	n.log.Info("member imported over NVMe/RDMA", "array", arrayName, "member", drive, "addr", c.Addr(), "cntlid", c.CntlID(), "ioqueues", max(1, n.cfg.Fabrics.Backend.Queues))
	return c, ns, nil
}

// backendRDMA: the nodes import members over NVMe/RDMA.
func (n *Node) backendRDMA() bool {
	return n.cfg.Fabrics.Backend.Transport == config.TransportRDMA
}
