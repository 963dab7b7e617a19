package raid

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"

	"tier0/daemon/blockdev"
)

// errSuperseded ends the rebuild of a member whose role another device
// took meanwhile (that device's rebuild reports its own end).
var errSuperseded = errors.New("superseded by a newer member")

type taskKind int

const (
	taskResync taskKind = iota + 1
	taskRebuild
	taskScrub
)

type task struct {
	kind   taskKind
	role   int
	repair bool
}

// background runs rebuild, resync and scrub one at a time on a worker
// goroutine, throttled by the policy.
type background struct {
	a       *Array
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []task
	running bool
	started bool
	stopped bool
	stopCh  chan struct{}
	done    chan struct{}
	cur     string
	prog    Event
	scrub   ScrubStatus
}

func (b *background) scrubStatus() ScrubStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.scrub
}

func (b *background) scrubUpdate(f func(*ScrubStatus)) {
	b.mu.Lock()
	f(&b.scrub)
	b.mu.Unlock()
}

func newBackground(a *Array) *background {
	b := &background{a: a, stopCh: make(chan struct{}), done: make(chan struct{})}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *background) start() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.stopped {
		return
	}
	b.started = true
	go b.loop()
}

func (b *background) loop() {
	defer close(b.done)
	for {
		b.mu.Lock()
		for len(b.queue) == 0 && !b.stopped {
			b.cond.Wait()
		}
		if b.stopped {
			b.mu.Unlock()
			return
		}
		t := b.queue[0]
		b.queue = b.queue[1:]
		b.running = true
		b.mu.Unlock()
		b.a.runTask(t)
		b.mu.Lock()
		b.running = false
		b.cur = ""
		b.cond.Broadcast()
		b.mu.Unlock()
	}
}

func (b *background) enqueue(t task) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, q := range b.queue {
		if q == t {
			return
		}
	}
	b.queue = append(b.queue, t)
	b.cond.Broadcast()
}

func (b *background) stop() {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	b.stopped = true
	close(b.stopCh)
	b.cond.Broadcast()
	started := b.started
	b.mu.Unlock()
	if started {
		<-b.done
	}
}

func (b *background) waitIdle() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for (len(b.queue) > 0 || b.running) && !b.stopped {
		b.cond.Wait()
	}
}

func (b *background) pendingWork() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) > 0 || b.running
}

func (b *background) current() (string, Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cur, b.prog
}

func (b *background) stopping() bool {
	select {
	case <-b.stopCh:
		return true
	default:
		return false
	}
}

// progress tracks and throttles one background pass.
type progress struct {
	a      *Array
	kind   EventKind
	name   string
	role   int
	start  time.Time
	lastEv time.Time
	pace   pacer
	done   int64
	total  int64
}

func (a *Array) newProgress(kind EventKind, name string, role int, total int64) *progress {
	now := a.clock.Now()
	p := &progress{a: a, kind: kind, name: name, role: role, start: now, lastEv: now, total: total}
	a.bg.mu.Lock()
	a.bg.cur = name
	a.bg.prog = p.event()
	a.bg.mu.Unlock()
	return p
}

func (p *progress) event() Event {
	e := Event{Kind: p.kind, Member: p.role, Done: p.done, Total: p.total, Time: p.a.clock.Now()}
	if el := e.Time.Sub(p.start).Seconds(); el > 0 {
		e.Rate = float64(p.done) / el
		if e.Rate > 0 {
			e.ETA = time.Duration(float64(p.total-p.done) / e.Rate * float64(time.Second))
		}
	}
	return e
}

// step accounts n bytes and applies the throttle. It reports whether a
// progress event was emitted.
func (p *progress) step(n int64) bool {
	a := p.a
	p.done += n
	if a.pol.Adaptive {
		// Pause as the foreground's latency asks (pace.go).
		p.pace.pause(a)
	}
	if rate := a.pol.RebuildRate; rate > 0 {
		want := time.Duration(float64(p.done) / (rate * (1 << 20)) * float64(time.Second))
		if el := a.clock.Now().Sub(p.start); want > el {
			a.clock.Sleep(want - el)
		}
	}
	now := a.clock.Now()
	e := p.event()
	a.bg.mu.Lock()
	a.bg.prog = e
	a.bg.mu.Unlock()
	if now.Sub(p.lastEv) >= a.pol.ProgressEvery {
		p.lastEv = now
		a.emit(e)
		return true
	}
	return false
}

func (a *Array) runTask(t task) {
	var err error
	switch t.kind {
	case taskResync:
		err = a.resync()
	case taskRebuild:
		err = a.rebuild(t.role)
	case taskScrub:
		_, err = a.scrub(t.repair)
	}
	if errors.Is(err, errSuperseded) {
		err = nil
	}
	if err != nil && !a.bg.stopping() {
		a.log.Warn("raid background task ended with an error", "uuid", fmtUUID(a.uuid), "task", t.kind, "err", err)
		role := -1
		if t.kind == taskRebuild {
			role = t.role
		}
		a.emit(Event{Kind: TaskFailed, Member: role, Reason: fmt.Sprintf("%s: %v", t.kind, err)})
	}
}

func (k taskKind) String() string {
	switch k {
	case taskResync:
		return "resync"
	case taskRebuild:
		return "rebuild"
	case taskScrub:
		return "scrub"
	}
	return fmt.Sprintf("task(%d)", int(k))
}

// resync makes the parity (or mirrors) of every dirty bitmap region agree
// with the data, then clears those bits.
func (a *Array) resync() error {
	defer a.resyncing.Store(false)
	dirty := a.bm.snapshot()
	if debugf != nil {
		debugf("resync: dirty %v state %s", dirty, a.describe())
	}
	var n int64
	for _, d := range dirty {
		if d {
			n++
		}
	}
	rs := a.bm.regionStripes
	p := a.newProgress(ResyncProgress, "resync", -1, n*rs*a.geo.ChunkSize)
	a.emit(Event{Kind: ResyncStarted, Member: -1, Total: p.total})
	for r, d := range dirty {
		if !d {
			continue
		}
		for s := int64(r) * rs; s < min(int64(r+1)*rs, a.geo.Stripes); s++ {
			if a.bg.stopping() {
				return ErrStopped
			}
			if err := a.usable(); err != nil {
				return err
			}
			// Stripes with a member out of sync are left to the
			// rebuild (their writes went through the log).
			a.lockStripe(s)
			var err error
			if a.geo.Level == RAID1 || a.allInSync(s) {
				_, _, err = a.syncStripe(s, true, false)
			} else {
				a.resyncSkipped.Store(true)
			}
			a.unlockStripe(s)
			if err != nil && !errors.Is(err, errGone) {
				return err
			}
			p.step(a.geo.ChunkSize)
		}
	}
	if err := a.flushMembers(); err != nil {
		return err
	}
	if err := a.bm.sweep(true); err != nil {
		return err
	}
	e := p.event()
	e.Kind = ResyncDone
	a.emit(e)
	return nil
}

func (a *Array) allInSync(s int64) bool {
	for r := range a.members {
		if !a.inSync(a.member(r), s) {
			return false
		}
	}
	return true
}

// rebuild recomputes role's chunks from the others (every stripe, or the
// dirty regions of a delta resync), then makes the member active.
func (a *Array) rebuild(role int) error {
	m := a.member(role)
	if m == nil || uint8(m.state.Load()) == roleActive {
		return nil
	}
	if uint8(m.state.Load()) != roleRebuilding {
		// Lost after its rebuild was queued: say so (a caller waits for
		// RebuildDone or TaskFailed).
		a.mu.Lock()
		why := m.reason
		a.mu.Unlock()
		return fmt.Errorf("member %d was lost before its rebuild started (%s): %w", role, why, ErrDegraded)
	}
	rs := a.bm.regionStripes
	var total int64
	for s := m.recovery.Load(); s < a.geo.Stripes; s++ {
		if m.needs(s, rs) {
			total += a.geo.ChunkSize
		}
	}
	p := a.newProgress(RebuildProgress, fmt.Sprintf("rebuild member %d", role), role, total)
	a.emit(Event{Kind: RebuildStarted, Member: role, Total: total, Reason: map[bool]string{true: "full", false: "delta"}[m.full]})
	for s := m.recovery.Load(); s < a.geo.Stripes; s++ {
		if a.bg.stopping() {
			return ErrStopped
		}
		if err := a.usable(); err != nil {
			return err
		}
		if uint8(m.state.Load()) != roleRebuilding {
			if a.member(role) != m {
				return errSuperseded // a newer device holds the role; its own rebuild reports
			}
			return fmt.Errorf("member %d failed during its rebuild: %w", role, ErrDegraded)
		}
		if !m.needs(s, rs) {
			m.recovery.Store(s + 1)
			continue
		}
		if debugf != nil {
			debugf("rebuild member %d stripe %d (full %v)", role, s, m.full)
		}
		if a.geo.Level == RAID5 || a.geo.Level == RAID6 {
			// Consecutive stripes that need it, as one batch.
			e := s + 1
			for e < min(s+rebuildBatch*rebuildDepth, a.geo.Stripes) && m.needs(e, rs) {
				e++
			}
			n, err := a.rebuildRun(m, s, e)
			if err != nil && !errors.Is(err, errGone) {
				return err
			}
			if err == nil && n > 0 {
				if err := a.rebuildStep(p, role, s+n-1, n); err != nil {
					return err
				}
				s += n - 1
				continue
			}
			// A member failed under the batch, or the first stripe
			// lacks sources: stripe s alone, with the retries and the
			// error of rebuildStripe.
		}
		var err error
		for attempt := 0; attempt <= a.geo.Members; attempt++ {
			a.lockStripe(s)
			err = a.rebuildStripe(m, s)
			if err == nil {
				m.recovery.Store(s + 1)
			}
			a.unlockStripe(s)
			if !errors.Is(err, errGone) || uint8(m.state.Load()) != roleRebuilding {
				break
			}
		}
		if err != nil {
			return err
		}
		if err := a.rebuildStep(p, role, s, 1); err != nil {
			return err
		}
	}
	if err := a.flushMembers(); err != nil {
		return err
	}
	if uint8(m.state.Load()) != roleRebuilding {
		if a.member(role) != m {
			return errSuperseded
		}
		return fmt.Errorf("member %d failed at the end of its rebuild: %w", role, ErrDegraded)
	}
	// full and dirty stay as they are: a reader that saw the rebuilding
	// state a moment ago may still look at them.
	a.mu.Lock()
	m.state.Store(uint32(roleActive))
	a.mu.Unlock()
	if err := a.writeSuperblocks(); err != nil {
		return err
	}
	e := p.event()
	e.Kind = RebuildDone
	a.emit(e)
	a.log.Info("raid rebuild done", "uuid", fmtUUID(a.uuid), "member", role)
	if !a.degraded() {
		if a.resyncSkipped.Swap(false) {
			a.resyncing.Store(true)
			a.bg.enqueue(task{kind: taskResync})
		}
		a.emit(Event{Kind: Optimal, Member: -1})
	}
	return nil
}

// rebuildStep accounts n rebuilt stripes, the last s, and checkpoints
// when a progress event was due: what is below recovery is durable, on
// this member and on the others it was computed from. A member whose
// flush or superblock write fails is failed there; an error that stops
// the array ends the rebuild.
func (a *Array) rebuildStep(p *progress, role int, s, n int64) error {
	if !p.step(n * a.geo.ChunkSize) {
		return nil
	}
	if err := a.flushMembers(); err != nil {
		return fmt.Errorf("member %d rebuild checkpoint at stripe %d: flush: %w", role, s, err)
	}
	if err := a.writeSuperblocks(); err != nil {
		return fmt.Errorf("member %d rebuild checkpoint at stripe %d: superblock: %w", role, s, err)
	}
	return nil
}

// rebuildStripe writes role m's chunk of stripe s (stripe lock held).
func (a *Array) rebuildStripe(m *member, s int64) error {
	C := a.geo.ChunkSize
	if a.geo.Level == RAID1 {
		for r := range a.members {
			src := a.member(r)
			if src == m || !a.inSync(src, s) {
				continue
			}
			buf := blockdev.AlignedBuffer(int(C))
			if err := a.mread(src, buf, a.moff(s, 0)); err != nil {
				return err
			}
			return a.mwrite(m, buf, a.moff(s, 0), false)
		}
		return fmt.Errorf("member %d rebuild stopped: %w", m.role, a.unavailable(s))
	}
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	shards := make([][]byte, nd+np)
	var reads []mop
	target := -1
	for x := 0; x < nd+np; x++ {
		var r int
		if x < nd {
			r = a.dataRole(s, x)
		} else {
			r = a.parityRole(s, x-nd)
		}
		if r == m.role {
			target = x
			continue
		}
		if src := a.member(r); a.inSync(src, s) {
			shards[x] = blockdev.AlignedBuffer(int(C))
			reads = append(reads, mop{m: src, buf: shards[x], off: a.moff(s, 0)})
		}
	}
	if len(reads) < nd {
		// Waits for a member to return (ReAdd restarts this rebuild).
		return fmt.Errorf("member %d rebuild stopped: %w", m.role, a.unavailable(s))
	}
	if err := a.run(reads); err != nil {
		return err
	}
	if err := a.coder.enc.Reconstruct(shards); err != nil {
		return fmt.Errorf("stripe %d: %v: %w", s, err, ErrTooManyFailed)
	}
	return a.mwrite(m, shards[target], a.moff(s, 0), false)
}

// syncStripe checks stripe s (lock held) and, with fix, rewrites parity
// (or mirrors) from data. With locate (RAID-6 scrub) a single bad data
// chunk is found and repaired instead. It reports a mismatch and whether
// it was repaired.
func (a *Array) syncStripe(s int64, fix, locate bool) (bool, bool, error) {
	C := a.geo.ChunkSize
	if a.geo.Level == RAID1 {
		// The reference is the first active member (the one mirror reads
		// use during a resync); every other in-sync member is compared.
		var refM *member
		for r := range a.members {
			if m := a.member(r); m != nil && uint8(m.state.Load()) == roleActive {
				refM = m
				break
			}
		}
		if refM == nil {
			return false, false, nil
		}
		ref := blockdev.AlignedBuffer(int(C))
		if err := a.mread(refM, ref, a.moff(s, 0)); err != nil {
			return false, false, err
		}
		mismatch := false
		for r := range a.members {
			m := a.member(r)
			if m == refM || !a.inSync(m, s) {
				continue
			}
			buf := blockdev.AlignedBuffer(int(C))
			if err := a.mread(m, buf, a.moff(s, 0)); err != nil {
				return false, false, err
			}
			if !bytes.Equal(ref, buf) {
				mismatch = true
				if fix {
					if err := a.mwrite(m, ref, a.moff(s, 0), false); err != nil {
						return true, false, err
					}
				}
			}
		}
		return mismatch, mismatch && fix, nil
	}
	if a.geo.Level == RAID0 {
		return false, false, nil
	}
	nd, np := a.geo.DataDisks, a.geo.ParityDisks
	shards := make([][]byte, nd+np)
	var reads []mop
	have := 0
	for x := 0; x < nd+np; x++ {
		var r int
		if x < nd {
			r = a.dataRole(s, x)
		} else {
			r = a.parityRole(s, x-nd)
		}
		if m := a.member(r); a.inSync(m, s) {
			shards[x] = blockdev.AlignedBuffer(int(C))
			reads = append(reads, mop{m: m, buf: shards[x], off: a.moff(s, 0)})
			have++
		}
	}
	if have <= nd {
		return false, false, nil // nothing to compare against
	}
	if err := a.run(reads); err != nil {
		return false, false, err
	}
	if have < nd+np {
		// Degraded: rebuild the missing shards from the first nd, then
		// compare what is left.
		orig := make([][]byte, nd+np)
		copy(orig, shards)
		if err := a.coder.enc.Reconstruct(shards); err != nil {
			return false, false, err
		}
		ok, err := a.coder.enc.Verify(shards)
		return err == nil && !ok, false, err
	}
	syn := make([][]byte, np)
	for k := range syn {
		syn[k] = make([]byte, C)
		copy(syn[k], shards[nd+k])
		for i := 0; i < nd; i++ {
			a.coder.mulXor(k, i, shards[i], syn[k])
		}
	}
	bad := false
	for k := range syn {
		if !isZero(syn[k]) {
			bad = true
		}
	}
	if !bad {
		return false, false, nil
	}
	if !fix {
		return true, false, nil
	}
	if locate && np == 2 && !isZero(syn[0]) && !isZero(syn[1]) {
		if z := locateQ(syn[0], syn[1], nd); z >= 0 {
			xorInto(shards[z], syn[0])
			err := a.mwrite(a.member(a.dataRole(s, z)), shards[z], a.moff(s, 0), false)
			return true, err == nil, err
		}
	}
	// Rewrite the parity from the data (RAID-5 cannot tell which chunk
	// is wrong; RAID-6 with one bad parity chunk lands here too).
	for k := 0; k < np; k++ {
		if isZero(syn[k]) {
			continue
		}
		xorInto(shards[nd+k], syn[k])
		if err := a.mwrite(a.member(a.parityRole(s, k)), shards[nd+k], a.moff(s, 0), false); err != nil {
			return true, false, err
		}
	}
	return true, true, nil
}

// StartScrub queues a scrub: every stripe's parity is checked; with
// repair, mismatches are fixed (RAID-6 locates and repairs a single bad
// chunk; RAID-5 rewrites parity). Results arrive as ScrubMismatch and
// ScrubDone events.
func (a *Array) StartScrub(repair bool) error {
	if err := a.usable(); err != nil {
		return err
	}
	if a.degraded() {
		return fmt.Errorf("scrub needs every member in sync: %w", ErrDegraded)
	}
	a.bg.enqueue(task{kind: taskScrub, repair: repair})
	return nil
}

func (a *Array) scrub(repair bool) (bad int64, err error) {
	p := a.newProgress(ScrubProgress, "scrub", -1, a.geo.Stripes*a.geo.ChunkSize)
	a.bg.scrubUpdate(func(st *ScrubStatus) { *st = ScrubStatus{Running: true, Repair: repair, Started: a.clock.Now()} })
	defer func() {
		a.bg.scrubUpdate(func(st *ScrubStatus) {
			st.Running = false
			if err != nil {
				st.Err = err.Error()
			} else {
				st.Finished = a.clock.Now()
			}
		})
	}()
	a.emit(Event{Kind: ScrubStarted, Member: -1, Total: p.total})
	for s := int64(0); s < a.geo.Stripes; s++ {
		if a.bg.stopping() {
			return bad, ErrStopped
		}
		if err := a.usable(); err != nil {
			return bad, err
		}
		if a.degraded() {
			return bad, fmt.Errorf("scrub interrupted at stripe %d: %w", s, ErrDegraded)
		}
		a.lockStripe(s)
		mismatch, repaired, err := a.syncStripe(s, repair, true)
		a.unlockStripe(s)
		if err != nil {
			a.bg.scrubUpdate(func(st *ScrubStatus) { st.Unreadable++ })
			if !errors.Is(err, errGone) {
				return bad, err
			}
		}
		a.bg.scrubUpdate(func(st *ScrubStatus) {
			st.Stripes++
			if mismatch {
				st.Mismatches++
			}
			if repaired {
				st.Repaired++
			}
		})
		if mismatch {
			bad++
			a.emit(Event{Kind: ScrubMismatch, Member: -1, Stripe: s, Repaired: repaired})
		}
		p.step(a.geo.ChunkSize)
	}
	e := p.event()
	e.Kind, e.Count = ScrubDone, bad
	a.emit(e)
	return bad, nil
}

// Check verifies the parity (or mirrors) of every stripe that has a
// member to compare against and returns an error wrapping
// ErrInconsistent naming the bad stripes. It takes each stripe lock in
// turn and may run alongside I/O. Tests call it after every array.
func (a *Array) Check() error {
	if err := a.usable(); err != nil {
		return err
	}
	var bad []int64
	for s := int64(0); s < a.geo.Stripes; s++ {
		var mismatch bool
		var err error
		for attempt := 0; attempt <= a.geo.Members; attempt++ {
			a.lockStripe(s)
			mismatch, _, err = a.syncStripe(s, false, false)
			a.unlockStripe(s)
			if !errors.Is(err, errGone) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("raid %s check: stripe %d: %w", fmtUUID(a.uuid), s, err)
		}
		if mismatch {
			bad = append(bad, s)
		}
	}
	if len(bad) > 0 {
		show := bad
		if len(show) > 8 {
			show = show[:8]
		}
		return fmt.Errorf("raid %s: %d stripes fail the parity check, first %v: %w", fmtUUID(a.uuid), len(bad), show, ErrInconsistent)
	}
	return nil
}
