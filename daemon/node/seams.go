package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
	"tier0/daemon/nvme"
	"tier0/daemon/store"
)

// The seams of a node: what it needs of the control plane (Store, Lease),
// of the backend fabric (Fabric, Member, MemberConn) and of time
// (clock.Clock). In production they are *store.Store, NVMe/TCP through
// package host and the wall clock; the in-process simulation
// (reliability/sim) puts an in-memory store (daemon/store/memstore), an
// in-memory fabric with injectable faults and a fake clock in their place,
// and runs many nodes in one process (docs/RELIABILITY.md, "Simulation").

// Store is what a node uses of the control plane: exactly the methods it
// calls on a *store.Store, which satisfies it unchanged. Client serves the
// task and report keys (tasks.go) and the coordinator's election; an
// in-memory store returns a client whose KV and Watcher it implements
// (clientv3.NewCtxClient). A store that is unreachable fails or blocks its
// calls until ctx ends, as etcd does.
type Store interface {
	Get(ctx context.Context, sec store.Section, kind, name string, v any) (int64, error)
	Put(ctx context.Context, sec store.Section, kind, name string, v any) (int64, error)
	List(ctx context.Context, sec store.Section, kind string) (map[string]json.RawMessage, error)
	Delete(ctx context.Context, sec store.Section, kind, name string) error
	Events(ctx context.Context, after int64, limit int) ([]store.Event, error)
	AppendEvent(ctx context.Context, ev store.Event) (store.Event, error)
	Ownership(ctx context.Context, array string) (store.Ownership, error)
	ClaimOwnership(ctx context.Context, array, node string, epoch uint64) (store.Ownership, error)
	Nodes(ctx context.Context) (map[string]store.NodeInfo, error)
	WatchNodes(ctx context.Context, rev int64) <-chan store.NodeEvent
	SettledNodes(ctx context.Context) (map[string]store.NodeInfo, int64, error)
	Client() *clientv3.Client
	Close() error
}

var _ Store = (*store.Store)(nil)

// Lease is a node's registration in the store (*store.Liveness): Lost is
// closed when the store says it is gone, Deadline is the local time until
// which it is sure to be held, Held reports whether that time is still
// ahead.
type Lease interface {
	Lost() <-chan struct{}
	Err() error
	Deadline() time.Time
	Held() bool
	Close(ctx context.Context) error
	Abandon()
}

var _ Lease = (*store.Liveness)(nil)

// LeaseRegistrar is a Store that registers leases of its own kind (an
// in-memory store does; *store.Store registers a *store.Liveness).
type LeaseRegistrar interface {
	RegisterLease(ctx context.Context, info store.NodeInfo, ttl, margin time.Duration) (Lease, error)
}

// register registers this node's lease in its store.
func (n *Node) register(ctx context.Context, info store.NodeInfo, ttl, margin time.Duration) (Lease, error) {
	if r, ok := n.st.(LeaseRegistrar); ok {
		return r.RegisterLease(ctx, info, ttl, margin)
	}
	r, ok := n.st.(interface {
		Register(context.Context, store.NodeInfo, time.Duration, time.Duration) (*store.Liveness, error)
	})
	if !ok {
		return nil, fmt.Errorf("node %s: the store (%T) registers no leases: give a *store.Store or a LeaseRegistrar", n.me.Name, n.st)
	}
	l, err := r.Register(ctx, info, ttl, margin)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// leaseSlot holds the current lease for the per-request check (an atomic:
// requests read it without a lock).
type leaseSlot struct{ p atomic.Pointer[leaseBox] }

type leaseBox struct{ l Lease }

// Load is the current lease, nil before the first registration.
func (s *leaseSlot) Load() Lease {
	if b := s.p.Load(); b != nil {
		return b.l
	}
	return nil
}

func (s *leaseSlot) Store(l Lease) { s.p.Store(&leaseBox{l}) }

// Member is a member drive imported by the owner of an array: a block
// device with NVMe reservations (*host.Namespace over the backend fabric,
// NVMe/TCP or NVMe/RDMA).
// Writes of a host that is not the reservation holder fail with
// blockdev.ErrFenced; a preempt-and-abort removes the preempted host's
// registration and fails its commands in flight.
type Member interface {
	blockdev.Device
	blockdev.FUAWriter
	NSID() uint32
	Register(action uint8, crkey, nrkey uint64, iekey bool) error
	Acquire(action uint8, t nvme.ResvType, crkey, prkey uint64) error
	Report() (nvme.ResvStatus, error)
}

// MemberConn is the connection a Member came over (*host.Controller over
// either transport, or the simulation's);
// closing it drops the member.
type MemberConn interface {
	Close() error
}

// Fabric imports member drives for one node: Options.Fabric replaces the
// backend NVMe/TCP fabric (dialMember) with another, such as the
// simulation's in-memory one. Import opens drive's namespace for array as
// a member of this node, under this node's NVMe host ID.
type Fabric interface {
	Import(ctx context.Context, array, drive string) (MemberConn, Member, error)
}

// importMember imports one member drive: through Options.Fabric when set,
// else over the backend fabric's transport (NVMe/TCP: dialMember, NVMe/RDMA:
// dialMemberRDMA).
func (n *Node) importMember(ctx context.Context, array, drive string) (MemberConn, Member, error) {
	if n.opts.Fabric != nil {
		return n.opts.Fabric.Import(ctx, array, drive)
	}
	if n.backendRDMA() {
		return n.dialMemberRDMA(ctx, array, drive)
	}
	c, ns, err := n.dialMember(ctx, array, drive, nil)
	if err != nil {
		return nil, nil, err
	}
	return c, ns, nil
}

// setANAState changes the frontend's ANA state of an array's subsystem;
// a node without a frontend target (the simulation's) only records it.
func (n *Node) setANAState(nqn string, st nvme.ANAState) error {
	if n.frontend == nil {
		return nil
	}
	return n.frontend.SetANAState(nqn, anaGroup, st)
}

// clk is the node's clock (Options.Clock, default the wall clock).
func (n *Node) clk() clock.Clock { return clock.Or(n.opts.Clock) }
