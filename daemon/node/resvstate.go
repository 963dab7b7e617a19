package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"tier0/daemon/store"
	"tier0/daemon/target"
)

// The hosts' reservations of a frontend namespace are one state for the
// whole cluster (docs/FABRIC.md, "Reservations across the cluster"): every
// node's frontend serves the same subsystem and namespace, so a host sees
// one namespace through every node's controller, and the NVMe reservation
// is the namespace's, not a path's. The state is one etcd key per
// namespace (store.Reservations), changed by compare-and-swap; every node
// keeps a copy in its target, updated by a watch, for the per-command
// check; the array's owner — the only node that serves I/O, the others
// being ANA inaccessible — enforces it, and acknowledges each change once
// every command admitted under the older state has finished. A reservation
// command through another node completes only after that acknowledgement.
// The backend's member reservations (epoch fencing of stale owners) are
// separate: they live on the member drives' exports, keyed by epoch.

// resvAckTimeout bounds how long a reservation command through a node
// that does not own the array waits for the owner to enforce it. Past it
// the command fails (internal error without DNR: the host may retry; the
// change is stored and a retry of it succeeds).
var resvAckTimeout = 5 * time.Second

// resvIOTimeout bounds one store operation of a reservation command.
const resvIOTimeout = 5 * time.Second

// clusterResv is the frontend target's reservation backend for one array's
// subsystem: the cluster store.
type clusterResv struct {
	s  *served
	rs *store.Reservations
}

func (b *clusterResv) PTPL() target.PTPLMode { return target.PTPLAlways }

func decodeResv(rec store.ResvRecord) (target.ReservationState, error) {
	if rec.Revision == 0 || rec.Value == nil {
		return target.ReservationState{Registrants: map[[16]byte]uint64{}, PTPL: true}, nil
	}
	var st target.ReservationState
	if err := json.Unmarshal(rec.Value, &st); err != nil {
		return st, fmt.Errorf("reservation state of %s namespace %d in the store (revision %d) is corrupt: %v; clear it with `tier0 store` tools or delete the key to start without reservations", rec.SubNQN, rec.NSID, rec.Revision, err)
	}
	st.Version = rec.Revision
	return st, nil
}

func (b *clusterResv) Load(subnqn string, nsid uint32) (target.ReservationState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), resvIOTimeout)
	defer cancel()
	rec, err := b.rs.Get(ctx, subnqn, nsid)
	if err != nil {
		return target.ReservationState{}, err
	}
	return decodeResv(rec)
}

func (b *clusterResv) Store(subnqn string, nsid uint32, prev, next target.ReservationState) (target.ReservationState, error) {
	v, err := json.Marshal(next)
	if err != nil {
		return target.ReservationState{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), resvIOTimeout)
	defer cancel()
	rev, err := b.rs.CompareAndSwap(ctx, subnqn, nsid, prev.Version, v)
	var ce *store.ResvConflictError
	if errors.As(err, &ce) {
		cur, derr := decodeResv(ce.Current)
		if derr != nil {
			return target.ReservationState{}, derr
		}
		return target.ReservationState{}, &target.StaleReservationError{Current: cur}
	}
	if err != nil {
		return target.ReservationState{}, err
	}
	next.Version = rev
	if err := b.awaitOwner(subnqn, nsid, rev); err != nil {
		return target.ReservationState{}, err
	}
	return next, nil
}

// awaitOwner waits until the array's owner enforces revision rev, unless
// this node is the owner (its target applies the change when Store
// returns) or there is none (a new owner reads the state before it turns
// its path optimized).
func (b *clusterResv) awaitOwner(subnqn string, nsid uint32, rev int64) error {
	n := b.s.n
	if b.s.runEpoch.Load() != 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), resvAckTimeout)
	defer cancel()
	o, err := n.st.Ownership(ctx, b.s.cfg.Name)
	if err != nil {
		return fmt.Errorf("reservation change of array %s stored at revision %d, but its owner is unknown: %w", b.s.cfg.Name, rev, err)
	}
	if o.Owner == "" || o.Owner == n.me.Name {
		return nil
	}
	if err := b.rs.WaitApplied(ctx, subnqn, nsid, o.Owner, rev); err != nil {
		return fmt.Errorf("reservation change of array %s stored at revision %d, but its owner %s has not enforced it within %v (the host may retry): %w",
			b.s.cfg.Name, rev, o.Owner, resvAckTimeout, err)
	}
	return nil
}

// syncReservation brings the target's copy of the array's reservation
// state up to the store's; a new owner does it before its path turns
// optimized.
func (s *served) syncReservation() error {
	b, ok := s.resv.(*clusterResv)
	if !ok || s.n.frontend == nil {
		return nil
	}
	// A few tries: the coordinator asks for optimized once per takeover.
	st, err := b.Load(s.nqn, frontendNSID)
	for try := 1; err != nil && try < 3; try++ {
		s.n.clk().Sleep(500 * time.Millisecond)
		st, err = b.Load(s.nqn, frontendNSID)
	}
	if err != nil {
		return fmt.Errorf("array %s: reading the hosts' reservations before serving I/O: %w", s.cfg.Name, err)
	}
	return s.n.frontend.ApplyReservation(s.nqn, frontendNSID, st)
}

// watchReservations keeps every frontend namespace's reservation state in
// the target current with the store, and, for the arrays this node owns,
// acknowledges each revision once the target enforces it. It runs until
// ctx ends.
func (n *Node) watchReservations(ctx context.Context, rs *store.Reservations) {
	// Looked up per change: arrays created online join while this runs.
	byNQN := func(nqn string) *served {
		for _, s := range n.servedAll() {
			if _, ok := s.resv.(*clusterResv); ok && s.nqn == nqn {
				return s
			}
		}
		return nil
	}
	apply := func(s *served, rec store.ResvRecord) {
		st, err := decodeResv(rec)
		if err != nil {
			n.log.Error("reservation state unreadable; the namespace keeps its last one", "array", s.cfg.Name, "err", err)
			return
		}
		if err := n.frontend.ApplyReservation(s.nqn, rec.NSID, st); err != nil {
			n.log.Warn("applying a reservation change failed", "array", s.cfg.Name, "err", err)
			return
		}
		if s.runEpoch.Load() == 0 || rec.Revision == 0 {
			return
		}
		actx, cancel := context.WithTimeout(ctx, resvIOTimeout)
		defer cancel()
		if err := rs.Ack(actx, s.nqn, rec.NSID, n.me.Name, rec.Revision); err != nil {
			n.log.Warn("acknowledging a reservation change failed; reservation commands through other nodes wait for it", "array", s.cfg.Name, "revision", rec.Revision, "err", err)
		}
	}
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		w := rs.Watch(wctx, 0)
		// what changed before the watch started
		for _, s := range n.servedAll() {
			if _, ok := s.resv.(*clusterResv); !ok {
				continue
			}
			gctx, gcancel := context.WithTimeout(ctx, resvIOTimeout)
			rec, err := rs.Get(gctx, s.nqn, frontendNSID)
			gcancel()
			if err == nil {
				apply(s, rec)
			}
		}
		for rec := range w {
			if s := byNQN(rec.SubNQN); s != nil && rec.Value != nil {
				apply(s, rec)
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-n.clk().After(time.Second):
		}
	}
}
