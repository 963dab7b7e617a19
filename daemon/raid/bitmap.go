package raid

import (
	"fmt"
	"sync"

	"tier0/daemon/blockdev"
)

// bitmap is the write-intent bitmap: one bit per region of regionStripes
// stripes, set durably on every present member before the first write to
// the region and cleared lazily once the region is idle, flushed and the
// array is optimal. While the array is degraded no bit is cleared, so the
// bits cover every region a missing member may have missed.
type bitmap struct {
	a             *Array
	regionStripes int64
	nregions      int64
	nbytes        int64

	mu       sync.Mutex // guards bits, inflight, touched; held across persisting new bits
	bits     []byte
	inflight []int32
	touched  []bool
}

func newBitmap(a *Array, regionStripes, nbytes int64) *bitmap {
	n := (a.geo.Stripes + regionStripes - 1) / regionStripes
	return &bitmap{a: a, regionStripes: regionStripes, nregions: n, nbytes: nbytes,
		bits: make([]byte, nbytes), inflight: make([]int32, n), touched: make([]bool, n)}
}

func (b *bitmap) get(r int64) bool { return b.bits[r/8]&(1<<(r%8)) != 0 }
func (b *bitmap) set(r int64)      { b.bits[r/8] |= 1 << (r % 8) }
func (b *bitmap) clr(r int64)      { b.bits[r/8] &^= 1 << (r % 8) }

func (b *bitmap) setAll() {
	b.mu.Lock()
	for r := int64(0); r < b.nregions; r++ {
		b.set(r)
	}
	b.mu.Unlock()
}

// start marks the regions of stripes [s0, s1] in use, persisting any new
// bit on every present member before returning.
func (b *bitmap) start(s0, s1 int64) error {
	r0, r1 := s0/b.regionStripes, s1/b.regionStripes
	b.mu.Lock()
	defer b.mu.Unlock()
	var blocks []int64
	for r := r0; r <= r1; r++ {
		b.inflight[r]++
		b.touched[r] = true
		if !b.get(r) {
			b.set(r)
			blk := r / 8 / metaBlock
			if len(blocks) == 0 || blocks[len(blocks)-1] != blk {
				blocks = append(blocks, blk)
			}
		}
	}
	if len(blocks) == 0 {
		return nil
	}
	if debugf != nil {
		debugf("bitmap: set regions %d-%d, persisting, state %s", r0, r1, b.a.describe())
	}
	for _, blk := range blocks {
		p := blockdev.AlignedBuffer(metaBlock)
		copy(p, b.bits[blk*metaBlock:])
		errs := b.a.each(func(m *member) error {
			return b.a.mwrite(m, p, bitmapOffset+blk*metaBlock, true)
		})
		for _, e := range errs {
			if e != nil && e != errGone {
				for r := r0; r <= r1; r++ {
					b.inflight[r]--
				}
				return e
			}
		}
	}
	return b.a.usable()
}

// end releases the regions taken by start.
func (b *bitmap) end(s0, s1 int64) {
	b.mu.Lock()
	for r := s0 / b.regionStripes; r <= s1/b.regionStripes; r++ {
		b.inflight[r]--
	}
	b.mu.Unlock()
}

// sweep clears the bits of idle regions after the members were flushed
// (the caller flushes). It clears only when the array is optimal; with
// force it clears every idle region, otherwise only those not written
// since the previous sweep. A member whose write fails is failed (the
// bits it keeps set only cost resync work); the error is returned.
func (b *bitmap) sweep(force bool) error {
	if b.a.degraded() || b.a.bg.pendingWork() {
		return nil
	}
	b.mu.Lock()
	changed := map[int64]bool{}
	for r := int64(0); r < b.nregions; r++ {
		if b.get(r) && b.inflight[r] == 0 && (force || !b.touched[r]) {
			b.clr(r)
			changed[r/8/metaBlock] = true
		}
		b.touched[r] = false
	}
	var writes []struct {
		blk int64
		p   []byte
	}
	for blk := range changed {
		p := blockdev.AlignedBuffer(metaBlock)
		copy(p, b.bits[blk*metaBlock:])
		writes = append(writes, struct {
			blk int64
			p   []byte
		}{blk, p})
	}
	if len(writes) == 0 {
		b.mu.Unlock()
		return nil
	}
	if debugf != nil {
		debugf("bitmap: sweep(force=%v) clears, now %v", force, b.bits[:2])
	}
	b.a.mu.Lock()
	b.a.sbt.EventsCleared = b.a.sbt.Events
	b.a.mu.Unlock()
	// Written under b.mu: a concurrent start must not persist a new bit
	// that this older copy of the block would then overwrite.
	errs := b.a.each(func(m *member) error {
		for _, w := range writes {
			if err := b.a.mwrite(m, w.p, bitmapOffset+w.blk*metaBlock, false); err != nil {
				return err
			}
		}
		return nil
	})
	b.mu.Unlock()
	for r, e := range errs {
		if e == nil {
			continue
		}
		if err := b.a.usable(); err != nil {
			return fmt.Errorf("clearing write-intent bits: %w", err)
		}
		b.a.mu.Lock()
		why := b.a.members[r].Load().reason
		b.a.mu.Unlock()
		return fmt.Errorf("raid %s: clearing write-intent bits on member %d failed it (%s); the array runs degraded: %w",
			fmtUUID(b.a.uuid), r, why, e)
	}
	return nil
}

// Sweep clears the write-intent bits of regions that saw no writes since
// the previous Sweep, after flushing the members. The daemon calls it
// periodically (a few seconds); fewer dirty bits mean less resync after a
// crash and a smaller delta resync.
func (a *Array) Sweep() error {
	if err := a.flushMembers(); err != nil {
		return err
	}
	return a.bm.sweep(false)
}

func (b *bitmap) count() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := int64(0)
	for r := int64(0); r < b.nregions; r++ {
		if b.get(r) {
			c++
		}
	}
	return c
}

func (b *bitmap) snapshot() []bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := make([]bool, b.nregions)
	for r := range s {
		s[r] = b.get(int64(r))
	}
	return s
}

// writeAll writes the whole bitmap to one device durably.
func (b *bitmap) writeAll(dev blockdev.Device) error {
	b.mu.Lock()
	p := blockdev.AlignedBuffer(int(b.nbytes))
	copy(p, b.bits)
	b.mu.Unlock()
	if len(p) == 0 {
		return nil
	}
	return writeDurable(dev, p, bitmapOffset)
}

// load ORs the bitmaps of every present member.
func (b *bitmap) load() error {
	if b.nbytes == 0 {
		return nil
	}
	var mu sync.Mutex
	errs := b.a.each(func(m *member) error {
		p := blockdev.AlignedBuffer(int(b.nbytes))
		if err := b.a.mread(m, p, bitmapOffset); err != nil {
			return err
		}
		mu.Lock()
		for i := range p {
			b.bits[i] |= p[i]
		}
		mu.Unlock()
		return nil
	})
	for _, e := range errs {
		if e != nil && e != errGone {
			return fmt.Errorf("reading the write-intent bitmap: %w", e)
		}
	}
	// Members' copies may differ (clears are written lazily and a crash
	// keeps any of them): write the union back, so that every bit set in
	// memory is set on every member — a later write to a region whose bit
	// is already set in memory persists nothing.
	errs = b.a.each(func(m *member) error {
		if err := b.writeAll(m.dev); err != nil {
			return b.a.memberErr(m, "bitmap write", err)
		}
		return nil
	})
	for _, e := range errs {
		if e != nil && e != errGone {
			return fmt.Errorf("writing the write-intent bitmap: %w", e)
		}
	}
	return b.a.usable()
}
