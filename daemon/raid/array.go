package raid

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
)

const stripeLocks = 4096

// errGone is returned internally by member I/O when the member was just
// marked failed; the caller re-plans the stripe with the new view.
var errGone = errors.New("member failed during request")

// Array is a RAID array over blockdev members. It implements
// blockdev.Device and blockdev.FUAWriter.
type Array struct {
	geo   Geometry
	uuid  [16]byte
	pol   Policy
	log   *slog.Logger
	clock clock.Clock
	coder *coder
	logOn bool

	members []atomic.Pointer[member]

	mu        sync.Mutex // guards the superblock template and state changes
	sbt       superblock
	dead      atomic.Bool
	deadWhy   atomic.Pointer[string] // why the array failed (members and reasons)
	stopped   atomic.Bool
	fenced    atomic.Bool
	dirtyOnSB atomic.Bool   // the superblocks say "not clean"
	losses    atomic.Uint64 // members lost so far (exposed.go)
	// volatileExposed (tests only): writes of an exposed array are not
	// made durable before their ack, to model member writes of an update
	// not issued before an owner's crash (writehole_test.go).
	volatileExposed bool

	sbMu  sync.Mutex
	locks [stripeLocks]sync.Mutex

	bm *bitmap
	jl *journal
	bg *background

	// resyncing: a mirror resync is pending; mirror reads go to the
	// resync source (the first active member) so that a value once read
	// does not change when the resync copies over it.
	resyncing atomic.Bool
	// resyncSkipped: a resync left stripes with a member out of sync to
	// the rebuild; it runs again once no member is (their parity may not
	// match their data after a crash).
	resyncSkipped atomic.Bool

	// slowReads counts reads served around a slow member (hedge.go).
	slowReads atomic.Int64

	fgOps      atomic.Int64
	fgInflight atomic.Int64
	rr         atomic.Uint64

	// fgLatSum/fgLatN: total time (ns) and number of the foreground
	// requests done, kept with Policy.Adaptive (io.go, pace.go).
	fgLatSum, fgLatN atomic.Int64
}

func (p *Policy) defaults() {
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	p.Clock = clock.Or(p.Clock)
	if p.ProgressEvery == 0 {
		p.ProgressEvery = time.Second
	}
}

// Plan returns the geometry Create would give an array of cfg over
// members devices of at least minSize bytes with the given block size,
// without touching any device. The daemon uses it to size an array's
// frontend namespace on every node before the array is first assembled.
func Plan(cfg Config, members int, minSize int64, blockSize int) (Geometry, error) {
	if err := cfg.check(members, blockSize); err != nil {
		return Geometry{}, err
	}
	if minSize <= 0 {
		return Geometry{}, fmt.Errorf("plan: member size %d: must be positive: %w", minSize, ErrInvalidConfig)
	}
	slots := cfg.LogSlots
	if cfg.DisableLog {
		slots = 0
	}
	g, _, err := layout(cfg.Level, members, int64(cfg.ChunkSize), blockSize, minSize, cfg.BitmapRegion, slots)
	return g, err
}

// check validates cfg for n members and fills in defaults.
func (cfg *Config) check(n, bs int) error {
	if n > maxMembers {
		return fmt.Errorf("%d members: at most %d are supported: %w", n, maxMembers, ErrInvalidConfig)
	}
	min := map[Level]int{RAID0: 2, RAID1: 2, RAID5: 3, RAID6: 4}
	m, ok := min[cfg.Level]
	if !ok {
		return fmt.Errorf("level %d: want 0, 1, 5 or 6: %w", cfg.Level, ErrInvalidConfig)
	}
	if n < m {
		return fmt.Errorf("%s needs at least %d members, got %d: %w", cfg.Level, m, n, ErrInvalidConfig)
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = 64 << 10
	}
	if cfg.ChunkSize < metaBlock || cfg.ChunkSize&(cfg.ChunkSize-1) != 0 {
		return fmt.Errorf("chunk size %d: want a power of two of at least %d: %w", cfg.ChunkSize, metaBlock, ErrInvalidConfig)
	}
	if cfg.BitmapRegion == 0 {
		cfg.BitmapRegion = 4 << 20
	}
	if cfg.LogSlots == 0 {
		cfg.LogSlots = 64
	}
	if bs <= 0 || bs > metaBlock || cfg.ChunkSize%bs != 0 {
		return fmt.Errorf("member block size %d: must divide %d and the chunk size %d: %w", bs, metaBlock, cfg.ChunkSize, ErrInvalidConfig)
	}
	return nil
}

// Create makes a new array over members (role i = members[i]), writing a
// superblock, an empty bitmap and an empty log on each. Unless
// cfg.AssumeClean, an initial parity sync runs in the background.
func Create(members []blockdev.Device, cfg Config) (*Array, error) {
	n := len(members)
	bs := 0
	minSize := int64(-1)
	for i, d := range members {
		if d == nil {
			return nil, fmt.Errorf("member %d is nil: Create needs every member: %w", i, ErrInvalidConfig)
		}
		if d.BlockSize() > bs {
			bs = d.BlockSize()
		}
		if minSize < 0 || d.Size() < minSize {
			minSize = d.Size()
		}
	}
	if err := cfg.check(n, bs); err != nil {
		return nil, err
	}
	slots := cfg.LogSlots
	if cfg.DisableLog {
		slots = 0
	}
	g, sb, err := layout(cfg.Level, n, int64(cfg.ChunkSize), bs, minSize, cfg.BitmapRegion, slots)
	if err != nil {
		return nil, err
	}
	if cfg.UUID == ([16]byte{}) {
		if _, err := rand.Read(cfg.UUID[:]); err != nil {
			return nil, err
		}
	}
	sb.ArrayUUID = cfg.UUID
	sb.Epoch = cfg.Epoch
	sb.Events = 1
	if cfg.DisableLog {
		sb.Flags |= flagLogDisabled
	}
	if cfg.AssumeClean {
		sb.Flags |= flagClean
	}
	for i := 0; i < n; i++ {
		sb.RoleState[i] = roleActive
	}
	a, err := newArray(g, sb, cfg.Policy)
	if err != nil {
		return nil, err
	}
	for i, d := range members {
		mb := &member{role: i, dev: d}
		mb.state.Store(uint32(roleActive))
		a.members[i].Store(mb)
	}
	// Fresh metadata: bitmap all set unless assumed clean, log zeroed.
	if !cfg.AssumeClean {
		a.bm.setAll()
	}
	zero := blockdev.AlignedBuffer(metaBlock)
	errs := a.each(func(mb *member) error {
		if err := a.bm.writeAll(mb.dev); err != nil {
			return err
		}
		for k := 0; k < a.jl.slots; k++ {
			if _, err := mb.dev.WriteAt(zero, a.jl.slotOff(k)); err != nil {
				return err
			}
		}
		return mb.dev.Flush()
	})
	for i, e := range errs {
		if e != nil {
			return nil, fmt.Errorf("initializing member %d: %w", i, e)
		}
	}
	if err := a.writeSuperblocks(); err != nil {
		return nil, err
	}
	a.dirtyOnSB.Store(!cfg.AssumeClean)
	a.bg.start()
	if !cfg.AssumeClean && g.ParityDisks > 0 {
		a.bg.enqueue(task{kind: taskResync})
	}
	a.log.Info("raid array created", "uuid", fmtUUID(a.uuid), "level", g.Level, "members", n,
		"chunk", g.ChunkSize, "capacity", g.Capacity)
	return a, nil
}

func newArray(g Geometry, sb *superblock, pol Policy) (*Array, error) {
	pol.defaults()
	c, err := newCoder(g.Level, g.DataDisks)
	if err != nil {
		return nil, err
	}
	a := &Array{geo: g, uuid: sb.ArrayUUID, pol: pol, log: pol.Logger, clock: pol.Clock, coder: c,
		logOn: sb.Flags&flagLogDisabled == 0 && sb.LogSlots > 0 && (g.Level == RAID5 || g.Level == RAID6)}
	a.sbt = *sb
	a.members = make([]atomic.Pointer[member], g.Members)
	a.bm = newBitmap(a, int64(sb.RegionStripes), int64(sb.BitmapBytes))
	a.jl = newJournal(a, int64(sb.LogOffset), int(sb.LogSlots), int64(sb.LogSlotSize))
	a.bg = newBackground(a)
	return a, nil
}

func fmtUUID(u [16]byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// UUID returns the array UUID.
func (a *Array) UUID() [16]byte { return a.uuid }

// Geometry returns the array's shape.
func (a *Array) Geometry() Geometry { return a.geo }

// Size implements blockdev.Device.
func (a *Array) Size() int64 { return a.geo.Capacity }

// BlockSize implements blockdev.Device.
func (a *Array) BlockSize() int { return a.geo.BlockSize }

func (a *Array) emit(e Event) {
	e.Array = a.uuid
	if e.Time.IsZero() {
		e.Time = a.clock.Now()
	}
	if a.pol.Listener != nil {
		a.pol.Listener(e)
	}
}

// usable returns nil, or the error that stops all I/O.
func (a *Array) usable() error {
	if a.fenced.Load() {
		return fmt.Errorf("raid %s: %w", fmtUUID(a.uuid), blockdev.ErrFenced)
	}
	if a.stopped.Load() {
		return fmt.Errorf("raid %s: %w", fmtUUID(a.uuid), ErrStopped)
	}
	if a.dead.Load() {
		why := "too many members failed"
		if p := a.deadWhy.Load(); p != nil {
			why = *p
		}
		return fmt.Errorf("raid %s failed: %s: %w: %w", fmtUUID(a.uuid), why, ErrTooManyFailed, blockdev.ErrIO)
	}
	return nil
}

// Flush implements blockdev.Device: every completed write is on stable
// storage of every member. It also retires partial parity log entries.
func (a *Array) Flush() error {
	if err := a.usable(); err != nil {
		return err
	}
	return a.flushMembers()
}

func (a *Array) flushMembers() error {
	cand := a.jl.retireCandidate()
	g := a.jl.gen.Add(1) - 1
	var fencedErr error
	var mu sync.Mutex
	a.each(func(m *member) error {
		err := a.call(m, "flush", m.dev.Flush)
		if err != nil && !errors.Is(err, errGone) {
			mu.Lock()
			fencedErr = err
			mu.Unlock()
		}
		return err
	})
	if fencedErr != nil {
		return fencedErr
	}
	err := a.usable()
	if err != nil && !a.dead.Load() || a.fenced.Load() || a.stopped.Load() {
		return err
	}
	// Also when the array just failed: the survivors hold every completed
	// write, so their log entries are dead (their replay at the next
	// assembly would only cost, and a member away then would have to
	// catch up their stripes).
	a.jl.retire(cand)
	for {
		f := a.jl.flushedGen.Load()
		if f >= g || a.jl.flushedGen.CompareAndSwap(f, g) {
			break
		}
	}
	return err
}

// Close stops background work, flushes, records a clean state and closes
// the members.
func (a *Array) Close() error {
	if a.stopped.Load() {
		return fmt.Errorf("raid %s: close twice: %w", fmtUUID(a.uuid), blockdev.ErrClosed)
	}
	a.bg.stop()
	var err error
	if a.usable() == nil {
		if err = a.flushMembers(); err == nil {
			if serr := a.bm.sweep(true); serr != nil {
				a.log.Warn("raid close: clearing write-intent bits", "uuid", fmtUUID(a.uuid), "err", serr)
			}
			a.mu.Lock()
			if !a.degraded() && !a.bg.pendingWork() {
				a.sbt.Flags |= flagClean
			}
			a.mu.Unlock()
			err = a.writeSuperblocks()
		}
	}
	a.stopped.Store(true)
	for r := range a.members {
		if m := a.member(r); m != nil && m.dev != nil {
			m.dev.Close()
		}
	}
	return err
}

// Abort stops the array at once without writing anything more to the
// members (ownership lost, or a simulated crash in tests). Members are
// not closed.
func (a *Array) Abort() {
	a.stopped.Store(true)
	a.bg.stop()
}

// WaitIdle blocks until no background work (rebuild, resync, scrub) is
// queued or running.
func (a *Array) WaitIdle() { a.bg.waitIdle() }

// fgBegin/fgEnd count foreground requests for the adaptive throttle.
func (a *Array) fgBegin() { a.fgInflight.Add(1); a.fgOps.Add(1) }

func (a *Array) fgEnd() { a.fgInflight.Add(-1) }
