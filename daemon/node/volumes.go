package node

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/config"
	"tier0/daemon/store"
	"tier0/daemon/target"
)

// Volumes (docs/VOLUMES.md): every node serves every pool's volumes as
// namespaces of the pool's frontend subsystem, each a window (its extent
// map) over the pool's gate, so that fencing, ANA and failover are the
// pool's. The desired volumes are in the store (store.Volumes); each node
// reconciles its frontend with them: on every change and every
// volumeResync.

// volumeResync is how often a node re-reads the volumes without a change
// (an owner that took over a pool zeroes what the old one had not).
const volumeResync = 2 * time.Second

// zeroChunk bounds one WriteZeroes while zeroing a volume's new extents.
const zeroChunk = 64 << 20

// window is a volume's device: its bytes, in order, are the extents'
// bytes of the pool's gate. The extent list only grows (resize appends);
// it is swapped whole.
type window struct {
	g *gate
	// hosts is the allow-list the target serves (volMu held).
	hosts []string
	ext   atomic.Pointer[[]store.Extent]
	sz    atomic.Int64
}

func newWindow(g *gate, ext []store.Extent) *window {
	w := &window{g: g}
	w.set(ext)
	return w
}

func (w *window) set(ext []store.Extent) {
	e := slices.Clone(ext)
	var size int64
	for _, x := range e {
		size += x.Len
	}
	w.ext.Store(&e)
	w.sz.Store(size)
}

// each maps [off, off+n) of the volume onto the gate: f gets the gate
// offset, the position in the request and the length of each piece.
func (w *window) each(off, n int64, f func(goff, pos, l int64) error) error {
	if off < 0 || n < 0 || off+n > w.sz.Load() {
		return fmt.Errorf("volume range [%d, %d) past its size %d: %w", off, off+n, w.sz.Load(), blockdev.ErrOutOfRange)
	}
	if off%int64(w.g.bs) != 0 || n%int64(w.g.bs) != 0 {
		return fmt.Errorf("volume range [%d, +%d) not aligned to %d: %w", off, n, w.g.bs, blockdev.ErrMisaligned)
	}
	pos, base := int64(0), int64(0)
	for _, e := range *w.ext.Load() {
		if pos == n {
			break
		}
		if off+pos < base+e.Len {
			in := off + pos - base
			l := min(e.Len-in, n-pos)
			if err := f(e.Off+in, pos, l); err != nil {
				return err
			}
			pos += l
		}
		base += e.Len
	}
	return nil
}

func (w *window) ReadAt(p []byte, off int64) (int, error) {
	err := w.each(off, int64(len(p)), func(goff, pos, l int64) error {
		_, err := w.g.ReadAt(p[pos:pos+l], goff)
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *window) WriteAt(p []byte, off int64) (int, error) {
	err := w.each(off, int64(len(p)), func(goff, pos, l int64) error {
		_, err := w.g.WriteAt(p[pos:pos+l], goff)
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *window) WriteAtFUA(p []byte, off int64) (int, error) {
	err := w.each(off, int64(len(p)), func(goff, pos, l int64) error {
		_, err := w.g.WriteAtFUA(p[pos:pos+l], goff)
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *window) WriteZeroes(off, length int64) error {
	return w.each(off, length, func(goff, _, l int64) error { return w.g.WriteZeroes(goff, l) })
}

func (w *window) Discard(off, length int64) error {
	return w.each(off, length, func(goff, _, l int64) error { return w.g.Discard(goff, l) })
}

func (w *window) Flush() error   { return w.g.Flush() }
func (w *window) Size() int64    { return w.sz.Load() }
func (w *window) BlockSize() int { return w.g.bs }
func (w *window) Close() error   { return nil }

// volumeIDs parses a volume's NGUID and UUID.
func volumeIDs(v *store.Volume) (nguid, uuid [16]byte, err error) {
	for _, x := range []struct {
		s   string
		out *[16]byte
	}{{v.NGUID, &nguid}, {v.UUID, &uuid}} {
		b, derr := hex.DecodeString(x.s)
		if derr != nil || len(b) != 16 {
			return nguid, uuid, fmt.Errorf("volume %s: identifier %q: want 32 hex digits", v.Name, x.s)
		}
		copy(x.out[:], b)
	}
	return nguid, uuid, nil
}

// volumesStore is the store's volume table (nil without a store).
func (n *Node) volumesStore() *store.Volumes {
	if n.st == nil {
		return nil
	}
	return store.NewVolumes(n.st.Client(), n.key(), n.clk())
}

// poolRecord reads an array's volume table at frontend start: with a
// record the implicit whole-array volume is not served (it is deleting or
// gone) and the carved volumes come from the first reconcile.
func (n *Node) poolRecord(ctx context.Context, a *config.Array) (store.Pool, error) {
	vs := n.volumesStore()
	if vs == nil {
		return store.Pool{Name: a.Name}, nil
	}
	var p store.Pool
	var err error
	for try := 0; try < 3; try++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p, err = vs.Pool(rctx, a.Name)
		cancel()
		if err == nil {
			return p, nil
		}
	}
	return p, fmt.Errorf("array %s: reading its volumes before serving it: %w", a.Name, err)
}

// nodeNames are the nodes that must each remove a deleting volume's
// namespace before its extents are reused: every configured node (each
// serves every pool's subsystem; one that is down removes it when it
// starts, since it reads the table before it serves).
func (n *Node) nodeNames() []string {
	out := make([]string, 0, len(n.cfg.Nodes))
	for _, nd := range n.cfg.Nodes {
		out = append(out, nd.Name)
	}
	return out
}

// watchVolumes reconciles the frontend with the stored volumes on every
// change and every volumeResync, until ctx ends.
func (n *Node) watchVolumes(ctx context.Context) {
	vs := n.volumesStore()
	if vs == nil {
		return
	}
	var hosts hostsPublished
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		w := vs.Watch(wctx, 0)
		tick := n.clk().NewTicker(volumeResync)
	loop:
		for {
			if err := n.reconcileVolumes(ctx); err != nil && ctx.Err() == nil {
				n.log.Warn("reconciling volumes failed; retried", "err", err)
			}
			n.publishHosts(ctx, &hosts)
			select {
			case <-ctx.Done():
				break loop
			case _, ok := <-w:
				if !ok {
					break loop
				}
			case <-tick.C():
			}
		}
		tick.Stop()
		cancel()
		select {
		case <-ctx.Done():
		case <-n.clk().After(time.Second):
		}
	}
}

// reconcileVolumes makes the frontend serve what the store holds, once:
// per pool with a record, it removes namespaces no longer exposed (and
// says so for deleting volumes), adds new ones, grows resized ones, and,
// on the pool's owner, zeroes the extents of creating and growing
// volumes.
func (n *Node) reconcileVolumes(ctx context.Context) error {
	vs := n.volumesStore()
	if vs == nil || n.frontend == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	pools, _, err := vs.Pools(rctx)
	cancel()
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range n.servedAll() {
		p, ok := pools[s.cfg.Name]
		if !ok {
			continue
		}
		if err := s.reconcileVolumes(ctx, vs, &p); err != nil {
			errs = append(errs, fmt.Errorf("array %s: %w", s.cfg.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (s *served) reconcileVolumes(ctx context.Context, vs *store.Volumes, p *store.Pool) error {
	s.volMu.Lock()
	defer s.volMu.Unlock()
	s.volIDs.Lock()
	if s.vols == nil {
		s.vols = map[uint32]*window{}
	}
	s.volIDs.Unlock()
	if p.Capacity != s.gate.size || p.BlockSize != s.gate.bs {
		return fmt.Errorf("volume table made for capacity %d / block size %d, the array has %d / %d; its volumes are not served here", p.Capacity, p.BlockSize, s.gate.size, s.gate.bs)
	}
	want := map[uint32]*store.Volume{}
	for i := range p.Volumes {
		v := &p.Volumes[i]
		if v.Exposed() && !v.Implicit {
			want[v.NSID] = v
		}
	}
	errs := s.unserveVolumesLocked(want)
	errs = append(errs, s.reportRemovedLocked(ctx, vs, p)...)
	errs = append(errs, s.serveVolumesLocked(want)...)
	// The owner zeroes new extents before they are exposed, on a table
	// read now, under volMu: a pass that read the table before an earlier
	// one recorded the zeroing must not zero bytes a host may have written
	// since.
	if s.runEpoch.Load() != 0 && s.gate.refused() == nil && slices.ContainsFunc(p.Volumes, func(v store.Volume) bool {
		return v.State == store.VolumeCreating || v.State == store.VolumeGrowing
	}) {
		more, err := s.zeroPendingLocked(ctx, vs, p.Name)
		errs = append(errs, more...)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	return errors.Join(errs...)
}

// unserveVolumesLocked (volMu held) removes the implicit volume's
// namespace and those of volumes no longer in want (gone or deleting).
func (s *served) unserveVolumesLocked(want map[uint32]*store.Volume) []error {
	t := s.n.frontend
	var errs []error
	if s.implicit {
		if err := t.RemoveNamespace(s.nqn, frontendNSID); err != nil && !errors.Is(err, target.ErrNotFound) {
			errs = append(errs, err)
		} else {
			s.volIDs.Lock()
			s.implicit = false
			s.volIDs.Unlock()
		}
	}
	for id := range s.vols {
		if _, ok := want[id]; ok {
			continue
		}
		if err := t.RemoveNamespace(s.nqn, id); err != nil && !errors.Is(err, target.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		s.volIDs.Lock()
		delete(s.vols, id)
		s.volIDs.Unlock()
	}
	return errs
}

// reportRemovedLocked (volMu held) records in the store that this node no
// longer serves the deleting volumes it has not reported yet.
func (s *served) reportRemovedLocked(ctx context.Context, vs *store.Volumes, p *store.Pool) []error {
	n := s.n
	me := n.me.Name
	var errs []error
	for i := range p.Volumes {
		v := &p.Volumes[i]
		if v.State != store.VolumeDeleting || slices.Contains(v.RemovedOn, me) {
			continue
		}
		if _, served := s.vols[v.NSID]; served || (v.Implicit && s.implicit) {
			continue
		}
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := vs.Removed(uctx, p.Name, v.Name, me, n.nodeNames()); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	return errs
}

// serveVolumesLocked (volMu held) adds a namespace for every new volume in
// want and resizes those of grown ones.
func (s *served) serveVolumesLocked(want map[uint32]*store.Volume) []error {
	n, t := s.n, s.n.frontend
	me := n.me.Name
	var errs []error
	for id, v := range want {
		w, ok := s.vols[id]
		if !ok {
			nguid, uuid, err := volumeIDs(v)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			w = newWindow(s.gate, v.Extents)
			// charged to the node's link like the implicit volume (frontend.go)
			dev := blockdev.LinkCharged(w, nil, blockdev.SharedLink(n.cfg.Cluster+"/"+me, n.cfg.LinkOf(me)))
			if err := t.AddNamespace(s.nqn, target.NamespaceConfig{NSID: id, Device: dev, NGUID: nguid, UUID: uuid, ANAGroup: anaGroup, Hosts: v.Hosts}); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", v.Name, err))
				continue
			}
			w.hosts = slices.Clone(v.Hosts)
			s.volIDs.Lock()
			s.vols[id] = w
			s.volIDs.Unlock()
			n.log.Info("volume served", "array", s.cfg.Name, "volume", v.Name, "nsid", id, "size", v.Size)
			continue
		}
		if !slices.Equal(v.Hosts, w.hosts) {
			if err := t.SetNamespaceHosts(s.nqn, id, v.Hosts); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", v.Name, err))
			} else {
				w.hosts = slices.Clone(v.Hosts)
				n.log.Info("volume hosts set", "array", s.cfg.Name, "volume", v.Name, "nsid", id, "hosts", v.Hosts)
			}
		}
		if v.Size > w.Size() {
			w.set(v.Extents)
			if err := t.ResizeNamespace(s.nqn, id); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: %w", v.Name, err))
			}
			n.log.Info("volume grown", "array", s.cfg.Name, "volume", v.Name, "nsid", id, "size", v.Size)
		}
	}
	return errs
}

// zeroPendingLocked (volMu held) zeroes the pending extents of the
// creating and growing volumes of pool's table as read now, recording
// each in the store. err is set when the table could not be read.
func (s *served) zeroPendingLocked(ctx context.Context, vs *store.Volumes, pool string) (errs []error, err error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	fresh, err := vs.Pool(rctx, pool)
	cancel()
	if err != nil {
		return nil, err
	}
	for i := range fresh.Volumes {
		v := &fresh.Volumes[i]
		if v.State != store.VolumeCreating && v.State != store.VolumeGrowing {
			continue
		}
		if err := s.zero(v.Pending); err != nil {
			errs = append(errs, fmt.Errorf("zeroing volume %s: %w", v.Name, err))
			continue
		}
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := vs.Zeroed(uctx, fresh.Name, v.Name, v.Pending); err != nil && !errors.Is(err, store.ErrConflict) {
			// (a conflict: another pass or owner recorded it first)
			errs = append(errs, err)
		}
		cancel()
	}
	return errs, nil
}

func (s *served) zero(ext []store.Extent) error {
	for _, e := range ext {
		for off := e.Off; off < e.Off+e.Len; off += zeroChunk {
			if err := s.gate.WriteZeroes(off, min(zeroChunk, e.Off+e.Len-off)); err != nil {
				return err
			}
		}
	}
	return nil
}

// syncReservations brings the target's copy of the hosts' reservations
// of every namespace the array serves here up to the store's.
func (s *served) syncReservations() error {
	s.volIDs.Lock()
	implicit := s.implicit
	s.volIDs.Unlock()
	if implicit {
		if err := s.syncReservation(); err != nil {
			return err
		}
	}
	return s.syncVolumeReservations()
}

// syncVolumeReservations brings the target's copy of every carved
// volume's reservation state up to the store's (as syncReservation does
// for the implicit volume) before the path turns optimized.
func (s *served) syncVolumeReservations() error {
	b, ok := s.resv.(*clusterResv)
	if !ok || s.n.frontend == nil {
		return nil
	}
	s.volIDs.Lock()
	ids := make([]uint32, 0, len(s.vols))
	for id := range s.vols {
		ids = append(ids, id)
	}
	s.volIDs.Unlock()
	for _, id := range ids {
		st, err := b.Load(s.nqn, id)
		if err != nil {
			return fmt.Errorf("array %s namespace %d: reading the hosts' reservations before serving I/O: %w", s.cfg.Name, id, err)
		}
		if err := s.n.frontend.ApplyReservation(s.nqn, id, st); err != nil && !errors.Is(err, target.ErrNotFound) {
			return err
		}
	}
	return nil
}
