package rdma

import (
	"context"

	"tier0/daemon/transport"
)

// Transport is NVMe/RDMA as a transport.Transport for daemon/host
// (host.Options.Transport): each queue is its own queue pair, dialed with
// rdma_cm and the NVMe/RDMA private data, and carries commands with keyed
// SGLs to buffers registered once per queue. host.Controller then does the
// Fabrics Connect, DH-HMAC-CHAP, keep-alive, events, the I/O timeout and
// the reconnect over it, as over NVMe/TCP. In a build without the rdma tag
// every dial fails with ErrNotBuilt (unless Dial is set).
type Transport struct {
	// MaxTransfer caps one command's data (default 1 MiB; the host's
	// MDTS limit applies too). Each queue registers Depth data buffers of
	// that size (the host's admin queue: 32 of 64 KiB), so the memory of
	// an I/O queue is about QueueDepth x MaxTransfer.
	MaxTransfer int
	// MaxInline caps the write data an I/O queue sends in the command
	// capsule, after the SQE (default 16 KiB; negative: none, all data by
	// keyed SGL); the controller's in-capsule size (IOCCSZ) applies too.
	// Each I/O queue's send buffers hold Depth x (64 + that) bytes.
	MaxInline int
	// Dial, when set, connects each queue instead of rdma_cm (tests: a
	// MemPair to an in-process target).
	Dial func(ctx context.Context, addr string, pd PrivateData, cfg Config) (QueueConn, error)
}

var _ transport.Transport = (*Transport)(nil)

// Name is "rdma".
func (t *Transport) Name() string { return "rdma" }

// MaxData is MaxTransfer (default 1 MiB).
func (t *Transport) MaxData() int {
	if t.MaxTransfer > 0 {
		return t.MaxTransfer
	}
	return 1 << 20
}

func (t *Transport) maxInline() int {
	switch {
	case t.MaxInline < 0:
		return 0
	case t.MaxInline == 0:
		return 16 << 10
	}
	return t.MaxInline
}

// DialQueue connects one queue pair: HSQSIZE p.SQSize, p.SQSize+1 slots
// (receive buffers, send buffers and data buffers of
// min(p.MaxData, MaxData) bytes); an I/O queue sends writes of up to
// min(p.InlineMax, MaxInline) bytes in the capsule.
func (t *Transport) DialQueue(ctx context.Context, addr string, p transport.Params) (transport.Queue, error) {
	data := t.MaxData()
	if p.MaxData > 0 {
		data = min(data, p.MaxData)
	}
	// no per-command timeout of its own: the host's supervisor enforces
	// its I/O timeout with Oldest
	inline := min(p.InlineMax, data, t.maxInline())
	q, err := openQueue(ctx, t.Dial, addr, p.QID, int(p.SQSize)+1, data, inline, 0)
	if err != nil {
		return nil, err
	}
	return q, nil
}
