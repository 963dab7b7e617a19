package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/store"
	"tier0/daemon/target"
)

// Online arrays (docs/VOLUMES.md, "Pools created online"): `tier0 array
// create` writes a desired-array record (store.DesiredArrays); every node
// reconciles its frontend with the table — on every change and every
// onlineResync — and serves each active array exactly as a site-file
// array: its subsystem, its ANA group, its implicit whole-array volume
// (or an empty volume table, --no-volume). The coordinator adds it to
// the cluster machine (ArrayDefined), which fences and assembles it at
// its home like any array; the first assembly finds the members blank and
// writes their superblocks (raid.Create).
//
// A deleting array is stopped by every node (its namespaces and
// subsystem removed, the owner closing the RAID cleanly), each saying so
// in Stopped; once every live node has, the nodes holding its member
// drives wipe their superblocks and clear the backend reservation, saying
// so in Wiped; once every live node has, the record, the pool's volume
// table and the hosts' reservations go (store.DesiredArrays.Drop).

// onlineResync is how often a node re-reads the table without a change.
const onlineResync = 2 * time.Second

// onlineArrays is a node's view of the table.
type onlineArrays struct {
	da   *store.DesiredArrays
	auth target.DHCHAPConfig
	mu   sync.Mutex // serializes reconcile passes
	last atomic.Pointer[[]store.DesiredArray]
	// dropped (under mu): the deleting arrays (name → Created) whose pool
	// this node dropped while a node away still had a drive to wipe.
	dropped map[string]time.Time
}

// list is the table as last read (nil before the first read).
func (o *onlineArrays) list() []store.DesiredArray {
	if o == nil {
		return nil
	}
	if p := o.last.Load(); p != nil {
		return *p
	}
	return nil
}

// managedArrays are the arrays the cluster machine manages: the site
// file's, then the active online ones.
func (n *Node) managedArrays() []config.Array {
	out := slices.Clone(n.cfg.Arrays)
	for _, a := range n.online.list() {
		if a.Phase == store.ArrayActive {
			out = append(out, onlineConfig(a))
		}
	}
	return out
}

// startOnline reads the table once (so that the arrays created online are
// served before the coordinator restores its machine) and keeps watching
// it.
func (n *Node) startOnline(ctx context.Context, auth target.DHCHAPConfig) {
	n.online = &onlineArrays{da: store.NewDesiredArrays(n.st.Client(), n.key(), n.clk()), auth: auth}
	if err := n.reconcileOnline(ctx); err != nil {
		n.log.Warn("reconciling the online arrays failed; retried", "err", err)
	}
	go n.watchOnline(ctx)
}

func (n *Node) watchOnline(ctx context.Context) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		w := n.online.da.Watch(wctx, 0)
		tick := time.NewTicker(onlineResync)
	loop:
		for {
			if err := n.reconcileOnline(ctx); err != nil && ctx.Err() == nil {
				n.log.Warn("reconciling the online arrays failed; retried", "err", err)
			}
			select {
			case <-ctx.Done():
				break loop
			case _, ok := <-w:
				if !ok {
					break loop
				}
			case <-tick.C:
			}
		}
		tick.Stop()
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// reconcileOnline makes this node serve what the table holds, once.
func (n *Node) reconcileOnline(ctx context.Context) error {
	o := n.online
	if o == nil || n.frontend == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, _, err := o.da.List(rctx)
	if err != nil {
		return err
	}
	o.last.Store(&list)
	var errs []error
	for _, a := range list {
		if _, site := n.cfg.Array(a.Name); site {
			continue // a site array's name: never served twice (create refuses it)
		}
		s := n.served(a.Name)
		switch {
		case a.Phase == store.ArrayActive && s == nil:
			cfg := onlineConfig(a)
			if _, err := n.serveArray(rctx, n.frontend, o.auth, &cfg); err != nil {
				_ = n.frontend.RemoveSubsystem(n.cfg.SubsystemNQN(a.Name))
				errs = append(errs, fmt.Errorf("serve online array %s: %w", a.Name, err))
				continue
			}
			n.log.Info("online array served", "array", a.Name, "members", a.Members)
		case a.Phase == store.ArrayDeleting:
			if err := n.deleteStep(rctx, s, a); err != nil {
				errs = append(errs, fmt.Errorf("delete online array %s: %w", a.Name, err))
			}
		}
	}
	// An array whose record is gone (dropped while this node was away) is
	// not served.
	for _, s := range n.servedAll() {
		if _, site := n.cfg.Array(s.cfg.Name); site || slices.ContainsFunc(list, func(a store.DesiredArray) bool { return a.Name == s.cfg.Name }) {
			continue
		}
		n.unserve(s)
	}
	return errors.Join(errs...)
}

// deleteStep does this node's next part of deleting array a (s: its served
// state here, nil when not served).
func (n *Node) deleteStep(ctx context.Context, s *served, a store.DesiredArray) error {
	if s != nil {
		n.unserve(s)
	}
	if !slices.Contains(a.Stopped, n.me.Name) {
		return n.online.da.MarkDone(ctx, a.Name, n.me.Name, false)
	}
	alive, err := n.st.Nodes(ctx)
	if err != nil {
		return err
	}
	if missing := notIn(alive, a.Stopped); len(missing) > 0 {
		return nil // waiting for them to stop serving it
	}
	if !slices.Contains(a.Wiped, n.me.Name) {
		if err := n.wipeMembers(a); err != nil {
			return err
		}
		return n.online.da.MarkDone(ctx, a.Name, n.me.Name, true)
	}
	if missing := notIn(alive, a.Wiped); len(missing) > 0 {
		return nil
	}
	if away := n.unwiped(a); len(away) > 0 {
		// A node holding a member drive was down: its drive keeps the
		// superblock until it returns and wipes it (this step, on that
		// node), so the record stays and the drive stays taken. The
		// pool's volumes and reservations go now: no live node serves it.
		if n.online.poolDropped(a) {
			return nil
		}
		if err := n.online.da.DropPool(ctx, a.Name, n.cfg.SubsystemNQN(a.Name)); err != nil {
			return err
		}
		n.online.setPoolDropped(a)
		n.log.Info("online array deleted on the live nodes; the nodes away wipe their drives when they return", "array", a.Name, "unwiped", away)
		return nil
	}
	if err := n.online.da.Drop(ctx, a.Name, n.cfg.SubsystemNQN(a.Name)); err != nil {
		return err
	}
	n.log.Info("online array deleted", "array", a.Name)
	n.recordEvent("array-deleted", a.Name, 0, fmt.Sprintf("members %v wiped and free", a.Members))
	return nil
}

// unwiped names a deleting array's member drives whose node has not
// wiped them yet, as "DRIVE (node NODE)".
func (n *Node) unwiped(a store.DesiredArray) []string {
	var out []string
	for _, d := range a.Members {
		if nd, _, ok := n.cfg.Drive(d); ok && !slices.Contains(a.Wiped, nd.Name) {
			out = append(out, fmt.Sprintf("%s (node %s)", d, nd.Name))
		}
	}
	return out
}

// poolDropped reports whether this node dropped a's pool already (once
// per process and array record; DropPool is idempotent). o.mu is held.
func (o *onlineArrays) poolDropped(a store.DesiredArray) bool {
	return o.dropped[a.Name].Equal(a.Created) && !a.Created.IsZero()
}

func (o *onlineArrays) setPoolDropped(a store.DesiredArray) {
	if o.dropped == nil {
		o.dropped = map[string]time.Time{}
	}
	o.dropped[a.Name] = a.Created
}

// notIn names the live nodes not in done.
func notIn(alive map[string]store.NodeInfo, done []string) []string {
	var out []string
	for name := range alive {
		if !slices.Contains(done, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// unserve stops serving s here: the RAID closed cleanly if it runs here,
// its namespaces removed (hosts get the namespace-changed notice), then
// its subsystem, then it leaves the served arrays.
func (n *Node) unserve(s *served) {
	s.volMu.Lock()
	s.mu.Lock()
	s.stopLocked(false)
	s.mu.Unlock()
	s.volIDs.Lock()
	nsids := []uint32{}
	if s.implicit {
		nsids = append(nsids, frontendNSID)
	}
	for id := range s.vols {
		nsids = append(nsids, id)
	}
	s.implicit, s.vols = false, nil
	s.volIDs.Unlock()
	for _, id := range nsids {
		_ = n.frontend.RemoveNamespace(s.nqn, id)
	}
	if err := n.frontend.RemoveSubsystem(s.nqn); err != nil && !errors.Is(err, target.ErrNotFound) {
		n.log.Warn("removing a deleted array's subsystem", "array", s.cfg.Name, "err", err)
	}
	s.volMu.Unlock()
	n.mu.Lock()
	delete(n.arrays, s.cfg.Name)
	l := slices.DeleteFunc(slices.Clone(n.servedAll()), func(x *served) bool { return x == s })
	n.arrayList.Store(&l)
	n.mu.Unlock()
	n.log.Info("array no longer served", "array", s.cfg.Name)
}

// wipeMembers zeroes the RAID superblocks (both slots) of a's members on
// this node's drives and clears their backend reservations, so that the
// drives are free and blank for a new array.
func (n *Node) wipeMembers(a store.DesiredArray) error {
	for _, d := range a.Members {
		dev, ok := n.drives[d]
		if !ok {
			continue
		}
		buf := blockdev.AlignedBuffer(superblockBytes)
		if _, err := dev.WriteAt(buf, 0); err != nil {
			return fmt.Errorf("wiping the superblocks of drive %s: %w", d, err)
		}
		if err := dev.Flush(); err != nil {
			return fmt.Errorf("wiping the superblocks of drive %s: flush: %w", d, err)
		}
		if n.backend != nil {
			nqn := n.cfg.DriveNQN(d)
			if cur, err := n.backend.Reservation(nqn, 1); err == nil {
				if err := n.backend.ApplyReservation(nqn, 1, target.ReservationState{Version: cur.Version + 1}); err != nil {
					return fmt.Errorf("clearing the backend reservation of drive %s: %w", d, err)
				}
			}
		}
		n.log.Info("member drive wiped", "array", a.Name, "drive", d)
	}
	return nil
}

// superblockBytes covers the two superblock slots of a RAID member
// (package raid: 2 x 4 KiB at offset 0); zeroed, the member reads as
// blank.
const superblockBytes = 8192

// syncMachineOnline brings the coordinator's machine in line with the
// table: an active array this node serves and the machine lacks is
// defined; one deleting or gone (not a site array) is removed.
func (n *Node) syncMachineOnline(m *cluster.Machine, step func(cluster.Event)) {
	if n.online == nil {
		return
	}
	list := n.online.list()
	for _, a := range list {
		_, in := m.Array(a.Name)
		if _, site := n.cfg.Array(a.Name); site {
			continue
		}
		switch {
		case a.Phase == store.ArrayActive && !in && n.served(a.Name) != nil:
			if ev, err := n.arrayDefined(onlineConfig(a)); err == nil {
				step(ev)
			}
		case a.Phase == store.ArrayDeleting && in:
			step(cluster.ArrayRemoved{Name: a.Name})
		}
	}
	for _, v := range m.Arrays() {
		if _, site := n.cfg.Array(v.Name); site {
			continue
		}
		if !slices.ContainsFunc(list, func(a store.DesiredArray) bool { return a.Name == v.Name }) {
			step(cluster.ArrayRemoved{Name: v.Name})
		}
	}
}

// arrayDefined is array a as the machine's ArrayDefined.
func (n *Node) arrayDefined(a config.Array) (cluster.ArrayDefined, error) {
	lvl, err := cluster.ParseLevel(a.Level)
	if err != nil {
		return cluster.ArrayDefined{}, err
	}
	var ms []cluster.MemberSpec
	for _, d := range a.Members {
		node, _, _ := n.cfg.Drive(d)
		ms = append(ms, cluster.MemberSpec{Drive: d, Node: node.Name})
	}
	return cluster.ArrayDefined{Name: a.Name, Level: lvl, Home: a.Home, Members: ms}, nil
}

// catchUpOnline reconciles the table before a task about an array this
// node does not serve yet (created online a moment ago).
func (n *Node) catchUpOnline(ctx context.Context, action json.RawMessage) {
	var a struct{ Array string }
	if n.online == nil || json.Unmarshal(action, &a) != nil || a.Array == "" || n.served(a.Array) != nil {
		return
	}
	if err := n.reconcileOnline(ctx); err != nil {
		n.log.Warn("reconciling the online arrays before a task failed", "array", a.Array, "err", err)
	}
}
