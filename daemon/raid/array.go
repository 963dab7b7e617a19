package raid

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
)

const stripeLocks = 4096

// errGone is returned internally by member I/O when the member was just
// marked failed; the caller re-plans the stripe with the new view.
var errGone = errors.New("member failed during request")

type member struct {
	role     int
	dev      blockdev.Device
	state    atomic.Uint32 // roleActive, roleFailed, roleRebuilding, roleEmpty
	recovery atomic.Int64  // rebuilding: stripes below this are in sync
	full     bool          // rebuilding: every stripe needs rebuilding
	dirty    []bool        // rebuilding (delta): regions that need it
	reason   string
	// missed: rebuilding after a ReAdd in the same run of the array, the
	// stripes it must catch up (it then replaces dirty).
	missed *stripeSet
	// since (RAID-5/6, failed from active): the stripes written since it
	// failed; a ReAdd of the same device takes it as missed.
	since *stripeSet
	// withArray: failed when or after the array failed (no write was
	// acknowledged after it left), so its data is as current as the
	// survivors'; recorded as roleDown with downAt, the event counter of
	// its last superblock, so that Assemble can take it back.
	withArray bool
	downAt    uint64
}

// needs reports whether rebuilding member m must still rebuild stripe s
// (ignoring the recovery position).
func (m *member) needs(s, regionStripes int64) bool {
	if m.full {
		return true
	}
	if m.missed != nil {
		return m.missed.get(s)
	}
	return m.dirty[s/regionStripes]
}

// stripeSet is a set of stripes, safe for concurrent use.
type stripeSet struct{ w []atomic.Uint64 }

func newStripeSet(n int64) *stripeSet { return &stripeSet{w: make([]atomic.Uint64, (n+63)/64)} }

func (x *stripeSet) set(s int64) {
	w := &x.w[s/64]
	for {
		o := w.Load()
		if o&(1<<(s%64)) != 0 || w.CompareAndSwap(o, o|1<<(s%64)) {
			return
		}
	}
}

func (x *stripeSet) get(s int64) bool { return x.w[s/64].Load()&(1<<(s%64)) != 0 }

// Array is a RAID array over blockdev members. It implements
// blockdev.Device and blockdev.FUAWriter.
type Array struct {
	geo   Geometry
	uuid  [16]byte
	pol   Policy
	log   *slog.Logger
	clock Clock
	coder *coder
	logOn bool

	members []atomic.Pointer[member]

	mu        sync.Mutex // guards the superblock template and state changes
	sbt       superblock
	dead      atomic.Bool
	deadWhy   atomic.Pointer[string] // why the array failed (members and reasons)
	stopped   atomic.Bool
	fenced    atomic.Bool
	dirtyOnSB atomic.Bool // the superblocks say "not clean"

	sbMu  sync.Mutex
	locks [stripeLocks]sync.Mutex

	bm *bitmap
	jl *journal
	bg *background

	// resyncing: a mirror resync is pending; mirror reads go to the
	// resync source (the first active member) so that a value once read
	// does not change when the resync copies over it.
	resyncing atomic.Bool

	fgOps      atomic.Int64
	fgInflight atomic.Int64
	rr         atomic.Uint64
}

func (p *Policy) defaults() {
	if p.Logger == nil {
		p.Logger = slog.Default()
	}
	if p.Clock == nil {
		p.Clock = wallClock{}
	}
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

func (a *Array) member(role int) *member { return a.members[role].Load() }

// inSync reports whether role holds valid data for stripe s.
func (a *Array) inSync(m *member, s int64) bool {
	if m == nil {
		return false
	}
	switch uint8(m.state.Load()) {
	case roleActive:
		return true
	case roleRebuilding:
		if s < m.recovery.Load() {
			return true
		}
		return !m.needs(s, a.bm.regionStripes)
	}
	return false
}

// present reports whether role takes part in I/O at all (active or
// rebuilding).
func present(m *member) bool {
	if m == nil {
		return false
	}
	st := uint8(m.state.Load())
	return st == roleActive || st == roleRebuilding
}

// each runs f on every present member in parallel and returns the errors
// by role.
func (a *Array) each(f func(m *member) error) []error {
	errs := make([]error, a.geo.Members)
	var wg sync.WaitGroup
	for r := range a.members {
		m := a.member(r)
		if !present(m) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(m)
		}()
	}
	wg.Wait()
	return errs
}

// failedCount counts roles not active (failed, missing or rebuilding).
func (a *Array) notActive() int {
	c := 0
	for r := range a.members {
		m := a.member(r)
		if m == nil || uint8(m.state.Load()) != roleActive {
			c++
		}
	}
	return c
}

// degraded reports whether any role is not fully active.
func (a *Array) degraded() bool { return a.notActive() > 0 }

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

// goneText describes the failed and missing members and the level's
// tolerance, e.g. "members 1 (read: ...) and 3 (missing at assembly)
// failed, 2 of 4; raid5 tolerates 1". Caller holds a.mu.
func (a *Array) goneTextLocked() string {
	var parts []string
	for r := range a.members {
		m := a.member(r)
		switch {
		case m == nil:
			parts = append(parts, fmt.Sprintf("%d (missing)", r))
		case uint8(m.state.Load()) == roleFailed || uint8(m.state.Load()) == roleEmpty:
			parts = append(parts, fmt.Sprintf("%d (%s)", r, m.reason))
		}
	}
	noun := "member"
	if len(parts) != 1 {
		noun = "members"
	}
	list := strings.Join(parts, ", ")
	if k := strings.LastIndex(list, ", "); k >= 0 {
		list = list[:k] + " and " + list[k+2:]
	}
	return fmt.Sprintf("%s %s failed, %d of %d; %s tolerates %d failed member(s)", noun, list, len(parts), a.geo.Members,
		a.geo.Level, a.geo.Level.redundancy(a.geo.Members))
}

// memberText describes role r for an error about one stripe. Caller
// holds a.mu or accepts a racy reason.
func (a *Array) memberTextLocked(r int, s int64) string {
	m := a.member(r)
	if m == nil {
		return fmt.Sprintf("member %d (missing)", r)
	}
	switch uint8(m.state.Load()) {
	case roleRebuilding:
		if m.full {
			return fmt.Sprintf("member %d (rebuilding, stripe not yet rebuilt)", r)
		}
		return fmt.Sprintf("member %d (delta resync, stripe not yet resynced)", r)
	case roleActive:
		return fmt.Sprintf("member %d (active)", r)
	}
	return fmt.Sprintf("member %d (failed: %s)", r, m.reason)
}

// outOfSync lists the roles that hold no valid chunk of stripe s.
func (a *Array) outOfSync(s int64) []int {
	var out []int
	for r := range a.members {
		if !a.inSync(a.member(r), s) {
			out = append(out, r)
		}
	}
	return out
}

// stripeLost reports whether stripe s lacks data: more of its chunks
// are out of sync than the level can reconstruct.
func (a *Array) stripeLost(s int64) bool {
	if a.geo.Level == RAID1 || a.geo.Level == RAID0 {
		return false // decided per request by the callers
	}
	c := 0
	for r := range a.members {
		if !a.inSync(a.member(r), s) {
			c++
		}
	}
	return c > a.geo.ParityDisks
}

// unavailable is the error of I/O to stripe s when the stripe lacks
// data while the array as a whole has not failed.
func (a *Array) unavailable(s int64) error {
	if err := a.usable(); err != nil {
		return err
	}
	roles := a.outOfSync(s)
	a.mu.Lock()
	var parts []string
	for _, r := range roles {
		parts = append(parts, a.memberTextLocked(r, s))
	}
	a.mu.Unlock()
	lo := s * a.geo.StripeSize
	return fmt.Errorf("raid %s: stripe %d (array bytes [%d, %d)): no valid chunk on %s; %s reconstructs at most %d: %w: %w",
		fmtUUID(a.uuid), s, lo, lo+a.geo.StripeSize, strings.Join(parts, " and "), a.geo.Level, a.geo.ParityDisks, ErrUnavailable, blockdev.ErrIO)
}

// unavailableStripes counts the stripes that lack data now.
func (a *Array) unavailableStripes() int64 {
	if a.geo.Level != RAID5 && a.geo.Level != RAID6 || a.dead.Load() {
		return 0
	}
	np := a.geo.ParityDisks
	if a.notActive() <= np {
		return 0
	}
	rs := a.bm.regionStripes
	var n int64
	for r0 := int64(0); r0 < a.geo.Stripes; r0 += rs {
		r1 := min(r0+rs, a.geo.Stripes)
		// Members that may be out of sync somewhere in the region.
		maybe := 0
		for r := range a.members {
			m := a.member(r)
			if m == nil || !present(m) {
				maybe++
				continue
			}
			if uint8(m.state.Load()) == roleRebuilding && r1 > m.recovery.Load() && (m.full || m.missed != nil || m.dirty[r0/rs]) {
				maybe++
			}
		}
		if maybe <= np {
			continue
		}
		for s := r0; s < r1; s++ {
			if a.stripeLost(s) {
				n++
			}
		}
	}
	return n
}

func (a *Array) failedRoles() int {
	c := 0
	for r := range a.members {
		m := a.member(r)
		if m == nil || uint8(m.state.Load()) == roleFailed || uint8(m.state.Load()) == roleEmpty {
			c++
		}
	}
	return c
}

// classify turns a member error into the engine's reaction: ErrFenced
// stops the array; other errors fail the member.
func (a *Array) memberErr(m *member, op string, err error) error {
	if errors.Is(err, blockdev.ErrFenced) {
		if !a.fenced.Swap(true) {
			a.log.Warn("raid fenced: this node lost ownership", "uuid", fmtUUID(a.uuid), "member", m.role, "err", err)
			a.emit(Event{Kind: Fenced, Member: m.role, Reason: err.Error()})
		}
		return fmt.Errorf("raid %s member %d %s: %w", fmtUUID(a.uuid), m.role, op, blockdev.ErrFenced)
	}
	if a.stopped.Load() {
		return fmt.Errorf("raid %s: %w", fmtUUID(a.uuid), ErrStopped)
	}
	a.fail(m, fmt.Sprintf("%s: %v", op, err))
	return errGone
}

// call runs one member request that uses no buffer (a flush) with the
// retry and timeout policy. At the deadline the member is failed and call
// returns; the request may go on in its goroutine, touching nothing of
// the caller's.
func (a *Array) call(m *member, op string, f func() error) error {
	var err error
	for attempt := 0; ; attempt++ {
		if a.pol.IOTimeout > 0 {
			done := make(chan error, 1)
			go func() { done <- f() }()
			t := time.NewTimer(a.pol.IOTimeout)
			select {
			case err = <-done:
				t.Stop()
			case <-t.C:
				err = fmt.Errorf("no completion after %v: %w", a.pol.IOTimeout, blockdev.ErrTimeout)
			}
		} else {
			err = f()
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, blockdev.ErrFenced) || errors.Is(err, blockdev.ErrTimeout) || attempt >= a.pol.Retries {
			break
		}
	}
	return a.memberErr(m, op, err)
}

// timedReq is one member read or write with a deadline; it runs on a
// buffer of its own (see callBuf).
type timedReq struct {
	state atomic.Int32 // reqRunning, reqAbandoned, reqEnded
	done  chan error
	timer *time.Timer
	ref   *[]byte // the pooled buffer
	buf   []byte
	m     *member
	off   int64
	write bool
	fua   bool
}

const (
	reqRunning int32 = iota
	reqAbandoned
	reqEnded
)

// memberIO reads or writes b at off on m.
func memberIO(m *member, b []byte, off int64, write, fua bool) error {
	if !write {
		_, err := m.dev.ReadAt(b, off)
		return err
	}
	if fua {
		if f, ok := m.dev.(blockdev.FUAWriter); ok {
			_, err := f.WriteAtFUA(b, off)
			return err
		}
		if _, err := m.dev.WriteAt(b, off); err != nil {
			return err
		}
		return m.dev.Flush()
	}
	_, err := m.dev.WriteAt(b, off)
	return err
}

// callBuf runs one member read or write of p at off with the retry and
// timeout policy.
//
// Buffer lifetime: a buffer handed to a member request is given back to
// its owner (the caller of ReadAt/WriteAt, or the scratch pool) only
// after the request has returned, never on a timer alone: a late
// completion (a C2HData arriving after the deadline) would otherwise
// write into memory that belongs to another request by then. Without a
// timeout the request runs on p and returns before callBuf does. With
// one, it runs on a pooled buffer of its own (one copy); at the deadline
// the member is failed at once and callBuf returns, and the request's
// goroutine owns that buffer from then on and returns it to the pool
// when the request ends.
func (a *Array) callBuf(m *member, op string, p []byte, off int64, write, fua bool) error {
	var err error
	for attempt := 0; ; attempt++ {
		if a.pol.IOTimeout > 0 {
			err = a.timed(m, p, off, write, fua)
		} else {
			err = memberIO(m, p, off, write, fua)
		}
		if err == nil {
			return nil
		}
		if errors.Is(err, blockdev.ErrFenced) || errors.Is(err, blockdev.ErrTimeout) || attempt >= a.pol.Retries {
			break
		}
	}
	return a.memberErr(m, op, err)
}

// timed runs one member request on a private copy of p under the I/O
// timeout. The request state (with its channel and timer) is pooled: the
// caller puts it back after a normal completion, the request's goroutine
// after an abandoned one (the caller no longer touches it then).
func (a *Array) timed(m *member, p []byte, off int64, write, fua bool) error {
	r := timedPool.Get().(*timedReq)
	r.state.Store(reqRunning)
	r.ref, r.m, r.off, r.write, r.fua = getBufRef(int64(len(p))), m, off, write, fua
	r.buf = *r.ref
	if write {
		copy(r.buf, p)
	}
	startOp(opJob{t: r})
	if r.timer == nil {
		r.timer = time.NewTimer(a.pol.IOTimeout)
	} else {
		r.timer.Reset(a.pol.IOTimeout)
	}
	select {
	case err := <-r.done:
		r.timer.Stop()
		return r.finish(p, err)
	case <-r.timer.C:
		if r.state.CompareAndSwap(reqRunning, reqAbandoned) {
			return fmt.Errorf("no completion after %v: %w", a.pol.IOTimeout, blockdev.ErrTimeout)
		}
		return r.finish(p, <-r.done) // it ended just now
	}
}

var timedPool = sync.Pool{New: func() any { return &timedReq{done: make(chan error, 1)} }}

func (r *timedReq) run() {
	err := memberIO(r.m, r.buf, r.off, r.write, r.fua)
	if r.state.CompareAndSwap(reqRunning, reqEnded) {
		r.done <- err
		return
	}
	// Abandoned at the deadline: nobody else holds the buffer or r.
	putBufRef(r.ref)
	r.recycle()
}

func (r *timedReq) finish(p []byte, err error) error {
	if err == nil && !r.write {
		copy(p, r.buf)
	}
	putBufRef(r.ref)
	r.recycle()
	return err
}

func (r *timedReq) recycle() {
	r.ref, r.buf, r.m = nil, nil, nil
	timedPool.Put(r)
}

func (a *Array) mread(m *member, p []byte, off int64) error {
	return a.callBuf(m, "read", p, off, false, false)
}

func (a *Array) mwrite(m *member, p []byte, off int64, fua bool) error {
	return a.callBuf(m, "write", p, off, true, fua)
}

// fail marks m failed and records it on the other members' superblocks
// before returning, so that m can never be assembled as current again.
// It returns the error that stops the array (fenced, stopped, failed,
// superblocks not writable), or nil when the array runs on degraded.
func (a *Array) fail(m *member, reason string) error {
	a.mu.Lock()
	if !a.markFailedLocked(m, reason) {
		a.mu.Unlock()
		return nil
	}
	a.mu.Unlock()
	a.log.Warn("raid member failed", "uuid", fmtUUID(a.uuid), "member", m.role, "reason", reason)
	a.emit(Event{Kind: MemberFailed, Member: m.role, Reason: reason})
	if !a.checkDead() {
		a.emit(Event{Kind: Degraded, Member: m.role, Reason: reason})
		if n := a.unavailableStripes(); n > 0 {
			why := fmt.Sprintf("member %d failed (%s) while other members are rebuilding: %d stripes lack data until a member returns", m.role, reason, n)
			a.log.Error("raid stripes unavailable", "uuid", fmtUUID(a.uuid), "stripes", n, "reason", why)
			a.emit(Event{Kind: StripesUnavailable, Member: m.role, Count: n, Reason: why})
		}
	}
	// Make every completed write durable on the survivors before the
	// array runs degraded: from now on a missing chunk exists only as
	// parity, and parity and data must not diverge in a later crash.
	if err := a.flushMembers(); err != nil && (a.fenced.Load() || a.stopped.Load()) {
		// Another node owns the members now (or the array stopped):
		// write nothing more, not even a superblock.
		return err
	}
	if err := a.writeSuperblocks(); err != nil {
		a.log.Warn("raid superblock update after member failure", "uuid", fmtUUID(a.uuid), "member", m.role, "err", err)
		return err
	}
	return a.usable()
}

// markFailedLocked marks m failed (caller holds a.mu); false when it
// was failed already or no longer holds its role.
func (a *Array) markFailedLocked(m *member, reason string) bool {
	st := uint8(m.state.Load())
	if st == roleFailed || a.member(m.role) != m {
		return false
	}
	m.reason = reason
	m.downAt = a.sbt.Events
	if (a.geo.Level == RAID5 || a.geo.Level == RAID6) && st == roleActive {
		m.since = newStripeSet(a.geo.Stripes) // before the state: writers look at it once they see "failed"
	}
	m.state.Store(uint32(roleFailed))
	// The array fails with this member, or failed before it: nothing was
	// acknowledged after it left, so its data is as current as the
	// survivors'.
	m.withArray = st == roleActive && (a.dead.Load() || a.failedRoles() > a.geo.Level.redundancy(a.geo.Members))
	return true
}

// checkDead fails the array when more members are gone (failed or
// missing; a rebuilding member is present) than the level tolerates. It
// reports whether the array is failed.
func (a *Array) checkDead() bool {
	a.mu.Lock()
	if a.failedRoles() <= a.geo.Level.redundancy(a.geo.Members) {
		a.mu.Unlock()
		return a.dead.Load()
	}
	why := a.goneTextLocked() + ": re-assemble the array when enough members return"
	a.deadWhy.Store(&why)
	a.mu.Unlock()
	if !a.dead.Swap(true) {
		a.log.Error("raid array failed: too many members lost", "uuid", fmtUUID(a.uuid), "reason", why)
		a.emit(Event{Kind: ArrayFailed, Member: -1, Reason: why})
	}
	return true
}

// writeSuperblocks bumps the event counter and writes the superblock to
// every present member. Members that fail are marked failed and the
// update is repeated for the others.
func (a *Array) writeSuperblocks() error {
	a.sbMu.Lock()
	defer a.sbMu.Unlock()
	for loop := 0; loop <= a.geo.Members; loop++ {
		a.mu.Lock()
		a.sbt.Events++
		base := a.sbt
		base.LogTail, base.LogSeq = a.jl.persistTail()
		for r := range a.members {
			m := a.member(r)
			base.RoleState[r], base.RoleFull[r], base.Recovery[r] = roleFailed, 0, 0
			if m == nil {
				continue
			}
			st := uint8(m.state.Load())
			base.RoleState[r] = st
			if st == roleEmpty {
				base.RoleState[r] = roleFailed
			}
			if st == roleFailed && m.withArray {
				base.RoleState[r], base.Recovery[r] = roleDown, m.downAt
			}
			if st == roleRebuilding {
				base.Recovery[r] = uint64(m.recovery.Load())
				if m.full {
					base.RoleFull[r] = 1
				}
			}
		}
		a.mu.Unlock()
		var failed []*member
		var fenced error
		var fmu sync.Mutex
		a.each(func(m *member) error {
			sb := base
			sb.Role = uint32(m.role)
			if err := writeSB(m.dev, &sb); err != nil {
				fmu.Lock()
				if errors.Is(err, blockdev.ErrFenced) {
					fenced = err
				} else {
					failed = append(failed, m)
				}
				fmu.Unlock()
				return err
			}
			return nil
		})
		if fenced != nil {
			a.memberErr(a.member(0), "superblock write", fenced)
			return fmt.Errorf("raid %s superblock: %w", fmtUUID(a.uuid), blockdev.ErrFenced)
		}
		if len(failed) == 0 {
			return nil
		}
		var newly []*member
		a.mu.Lock()
		for _, m := range failed {
			if a.markFailedLocked(m, "superblock write failed") {
				newly = append(newly, m)
			}
		}
		a.mu.Unlock()
		for _, m := range newly {
			a.log.Warn("raid member failed", "uuid", fmtUUID(a.uuid), "member", m.role, "reason", m.reason)
			a.emit(Event{Kind: MemberFailed, Member: m.role, Reason: "superblock write failed"})
		}
		if !a.checkDead() && len(newly) > 0 {
			a.emit(Event{Kind: Degraded, Member: newly[0].role, Reason: "superblock write failed"})
		}
	}
	return fmt.Errorf("raid %s: superblock could not be written to enough members: %w", fmtUUID(a.uuid), ErrTooManyFailed)
}

// markDirty records "not clean" on the superblocks before the first write
// after a clean state.
func (a *Array) markDirty() error {
	if a.dirtyOnSB.Load() {
		return nil
	}
	a.mu.Lock()
	if a.dirtyOnSB.Load() {
		a.mu.Unlock()
		return nil
	}
	a.sbt.Flags &^= flagClean
	a.mu.Unlock()
	if err := a.writeSuperblocks(); err != nil {
		return err
	}
	a.dirtyOnSB.Store(true)
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
	if err := a.usable(); err != nil {
		return err
	}
	a.jl.retire(cand)
	for {
		f := a.jl.flushedGen.Load()
		if f >= g || a.jl.flushedGen.CompareAndSwap(f, g) {
			break
		}
	}
	return nil
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

// MemberStatus describes one role.
type MemberStatus struct {
	Role     int
	State    string // active, failed, rebuilding, missing
	Reason   string
	Recovery int64 // rebuilding: stripes done
	// WithArray: failed when or after the array failed, so no write was
	// acknowledged after it left: a re-Assemble takes it back as active.
	WithArray bool
}

// Status is a snapshot of the array.
type Status struct {
	UUID     string
	Geometry Geometry
	State    string // optimal, degraded, failed, fenced, stopped
	Events   uint64
	Epoch    uint64
	Members  []MemberStatus
	Dirty    int64 // bitmap regions marked dirty
	Task     string
	Progress Event
	// Reason says why State is not optimal: for failed, which members
	// failed and why, and what brings the array back.
	Reason string
	// Unavailable counts the stripes that lack data while the array as a
	// whole runs (I/O to them fails with ErrUnavailable), e.g. a member
	// under delta resync plus another failure on RAID-5.
	Unavailable int64
	// Scrub is the state and the findings of the current or last scrub.
	Scrub ScrubStatus
}

// ScrubStatus describes the current or last scrub (StartScrub).
type ScrubStatus struct {
	Running    bool
	Repair     bool      // the run repairs what it finds
	Started    time.Time // zero: no scrub ran since the array started
	Finished   time.Time // zero while running, or when it stopped early
	Stripes    int64     // stripes checked
	Mismatches int64     // stripes whose parity (or mirrors) did not match
	Repaired   int64     // of those, repaired
	Unreadable int64     // stripes that could not be read (a member failed)
	Err        string    // why the run stopped early; "" when it completed
}

// Status reports the array's state.
func (a *Array) Status() Status {
	a.mu.Lock()
	s := Status{UUID: fmtUUID(a.uuid), Geometry: a.geo, Events: a.sbt.Events, Epoch: a.sbt.Epoch}
	for r := range a.members {
		m := a.member(r)
		ms := MemberStatus{Role: r, State: "missing"}
		if m != nil {
			switch uint8(m.state.Load()) {
			case roleActive:
				ms.State = "active"
			case roleFailed:
				ms.State = "failed"
				ms.WithArray = m.withArray
			case roleRebuilding:
				ms.State = "rebuilding"
				ms.Recovery = m.recovery.Load()
			}
			ms.Reason = m.reason
		}
		s.Members = append(s.Members, ms)
	}
	var notes []string
	for _, ms := range s.Members {
		switch ms.State {
		case "failed", "missing":
			notes = append(notes, fmt.Sprintf("member %d %s (%s)", ms.Role, ms.State, ms.Reason))
		case "rebuilding":
			notes = append(notes, fmt.Sprintf("member %d rebuilding", ms.Role))
		}
	}
	a.mu.Unlock()
	switch {
	case a.fenced.Load():
		s.State = "fenced"
		s.Reason = "another node owns the array now (a member refused a request as fenced)"
	case a.stopped.Load():
		s.State = "stopped"
		s.Reason = "closed or aborted"
	case a.dead.Load():
		s.State = "failed"
		if p := a.deadWhy.Load(); p != nil {
			s.Reason = *p
		}
	case a.degraded():
		s.State = "degraded"
		s.Reason = strings.Join(notes, "; ")
	default:
		s.State = "optimal"
	}
	s.Dirty = a.bm.count()
	s.Task, s.Progress = a.bg.current()
	s.Unavailable = a.unavailableStripes()
	if s.Unavailable > 0 {
		s.Reason += fmt.Sprintf("; %d stripes lack data (their chunks are on failed members and on members not yet rebuilt there) until a member returns", s.Unavailable)
	}
	s.Scrub = a.bg.scrubStatus()
	return s
}

// FailMember marks role index failed (operator action or health policy).
func (a *Array) FailMember(index int, reason string) error {
	if index < 0 || index >= a.geo.Members {
		return fmt.Errorf("member index %d: the array has members 0..%d: %w", index, a.geo.Members-1, ErrInvalidConfig)
	}
	m := a.member(index)
	if m == nil || !present(m) {
		return nil
	}
	if err := a.fail(m, reason); err != nil {
		return err
	}
	return a.usable()
}

// Replace puts a new device in role index (which must be failed or
// missing) and starts a full rebuild onto it in the background.
func (a *Array) Replace(index int, dev blockdev.Device) error {
	return a.addMember(index, dev, true)
}

// ReAdd brings back the device that held role index before a transient
// loss. When its superblock shows it left after the last bitmap clear,
// only the regions written while it was away are rebuilt (delta resync);
// otherwise it gets a full rebuild.
func (a *Array) ReAdd(index int, dev blockdev.Device) error {
	return a.addMember(index, dev, false)
}

func (a *Array) addMember(index int, dev blockdev.Device, full bool) error {
	if a.dead.Load() && !a.fenced.Load() && !a.stopped.Load() {
		return fmt.Errorf("%w; a failed array is not repaired member by member: stop it (Abort) and re-assemble it from all its members once enough are back (Assemble takes back the members that failed with the array and rejects the stale ones as ErrStale, which then come back by ReAdd)", a.usable())
	}
	if err := a.usable(); err != nil {
		return err
	}
	if index < 0 || index >= a.geo.Members {
		return fmt.Errorf("member index %d: the array has members 0..%d: %w", index, a.geo.Members-1, ErrInvalidConfig)
	}
	if a.geo.Level == RAID0 {
		return fmt.Errorf("raid0 has no redundancy to rebuild a member from: %w", ErrInvalidConfig)
	}
	if dev.Size() < a.geo.DataOffset+a.geo.Stripes*a.geo.ChunkSize {
		return fmt.Errorf("device of %d bytes is smaller than the %d bytes a member needs: %w", dev.Size(), a.geo.DataOffset+a.geo.Stripes*a.geo.ChunkSize, ErrInvalidConfig)
	}
	if a.geo.BlockSize%dev.BlockSize() != 0 {
		return fmt.Errorf("device block size %d does not divide the array's %d: %w", dev.BlockSize(), a.geo.BlockSize, ErrInvalidConfig)
	}
	old := a.member(index)
	if old != nil && present(old) {
		return fmt.Errorf("member %d is %s; fail it first: %w", index, map[bool]string{true: "active", false: "rebuilding"}[uint8(old.state.Load()) == roleActive], ErrInvalidConfig)
	}
	nm := &member{role: index, dev: dev, full: true}
	if !full {
		sb, err := readSB(dev)
		switch {
		case err != nil:
			return fmt.Errorf("re-add member %d: %w; use Replace for a new device", index, err)
		case sb.ArrayUUID != a.uuid:
			return fmt.Errorf("re-add member %d: device belongs to array %s: %w", index, fmtUUID(sb.ArrayUUID), ErrMismatch)
		case int(sb.Role) != index:
			return fmt.Errorf("re-add member %d: device held role %d: %w", index, sb.Role, ErrMismatch)
		}
		if why := sameGeometry(&a.sbt, sb); why != "" {
			return fmt.Errorf("re-add member %d: %s: %w", index, why, ErrMismatch)
		}
		a.mu.Lock()
		cleared := a.sbt.EventsCleared
		a.mu.Unlock()
		if sb.Events >= cleared && sb.RoleState[index] == roleActive {
			nm.full = false
			nm.dirty = a.bm.snapshot()
		}
		// The same device that failed in this run of the array (its
		// superblock is the one it had then): it missed exactly the
		// stripes written since, which writers recorded. Taken below,
		// with no stripe operation in flight.
		if old != nil && old.since != nil && sb.RoleState[index] == roleActive && sb.Events <= old.downAt && sb.Events+1 >= old.downAt {
			nm.full = false
			nm.missed = old.since
		}
		if debugf != nil {
			debugf("re-add %d: member events %d, cleared %d, full %v, dirty %v", index, sb.Events, cleared, nm.full, nm.dirty)
		}
	}
	nm.state.Store(uint32(roleRebuilding))
	if nm.missed != nil {
		// A barrier: every write holds its stripe's lock from planning
		// until it has recorded the stripe in the failed member's missed
		// set, so once all locks are taken the set is complete, and
		// later writes see the new member.
		for i := range a.locks {
			a.locks[i].Lock()
		}
	}
	a.mu.Lock()
	a.members[index].Store(nm)
	a.mu.Unlock()
	if nm.missed != nil {
		for i := range a.locks {
			a.locks[i].Unlock()
		}
	}
	// Empty log, new bitmap and superblock on the member before it
	// takes writes (its old log entries must never be replayed).
	zero := blockdev.AlignedBuffer(metaBlock)
	for k := 0; k < a.jl.slots; k++ {
		if _, err := dev.WriteAt(zero, a.jl.slotOff(k)); err != nil {
			a.fail(nm, "log reset: "+err.Error())
			return err
		}
	}
	if err := a.bm.writeAll(dev); err != nil {
		a.fail(nm, "bitmap write: "+err.Error())
		return err
	}
	if err := a.writeSuperblocks(); err != nil {
		return err
	}
	a.log.Info("raid member added", "uuid", fmtUUID(a.uuid), "member", index, "full", nm.full, "stripes-missed", nm.missed != nil)
	a.bg.enqueue(task{kind: taskRebuild, role: index})
	// A rebuild that stopped on stripes lacking data may go on now.
	for r := range a.members {
		if m := a.member(r); r != index && m != nil && uint8(m.state.Load()) == roleRebuilding {
			a.bg.enqueue(task{kind: taskRebuild, role: r})
		}
	}
	return nil
}

// WaitIdle blocks until no background work (rebuild, resync, scrub) is
// queued or running.
func (a *Array) WaitIdle() { a.bg.waitIdle() }

// fgBegin/fgEnd count foreground requests for the adaptive throttle.
func (a *Array) fgBegin() { a.fgInflight.Add(1); a.fgOps.Add(1) }
func (a *Array) fgEnd()   { a.fgInflight.Add(-1) }

func (a *Array) lockStripe(s int64)   { a.locks[uint64(s)%stripeLocks].Lock() }
func (a *Array) unlockStripe(s int64) { a.locks[uint64(s)%stripeLocks].Unlock() }

// roles of stripe s: dataRole(s,i) holds data index i; parityRole(s,k)
// holds P (k=0) or Q (k=1). md left-symmetric.
func (a *Array) dataRole(s int64, i int) int {
	n := int64(a.geo.Members)
	switch a.geo.Level {
	case RAID5:
		pd := n - 1 - s%n
		return int((pd + 1 + int64(i)) % n)
	case RAID6:
		pd := n - 1 - s%n
		return int((pd + 2 + int64(i)) % n)
	}
	return i
}

func (a *Array) parityRole(s int64, k int) int {
	n := int64(a.geo.Members)
	pd := n - 1 - s%n
	return int((pd + int64(k)) % n)
}

// moff is the member offset of row r of stripe s.
func (a *Array) moff(s int64, r int64) int64 { return a.geo.DataOffset + s*a.geo.ChunkSize + r }

func (a *Array) describe() string {
	var b strings.Builder
	for r := range a.members {
		m := a.member(r)
		if m == nil {
			b.WriteString("-")
		} else {
			fmt.Fprintf(&b, "%d", m.state.Load())
		}
	}
	return b.String()
}
