package raid

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
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
	// stepped (tests only, Policy.replay): the worker takes a step (a
	// task's start, one pass of a task's stripe loop) only when granted
	// one (step); parked: it waits for a grant.
	stepped bool
	grant   int
	parked  bool
	task    task // the one running
}

// replayKnobs are test-only scheduling knobs (Policy.replay; nil in
// production) that make an array's run replay from a seed: serial runs a
// batch's member requests and a request's stripes one after another on
// the caller's goroutine, whatever the members' latency; stepped runs the
// background worker only in the steps the test grants (background.step,
// WaitIdle).
type replayKnobs struct {
	serial  bool
	stepped bool
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
	b.stepped = a.pol.replay != nil && a.pol.replay.stepped
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
		for (len(b.queue) == 0 || b.stepped && b.grant == 0) && !b.stopped {
			b.park()
		}
		b.parked = false
		if b.stopped {
			b.mu.Unlock()
			return
		}
		if b.stepped {
			b.grant--
		}
		t := b.queue[0]
		b.queue = b.queue[1:]
		b.running, b.task = true, t
		b.mu.Unlock()
		b.a.runTask(t)
		b.mu.Lock()
		b.running = false
		b.cur = ""
		if b.stopped && t.kind == taskResync {
			// Stopped (Close, Abort) maybe before it finished: still
			// owed, so that Close neither clears the write-intent bits
			// of stripes it did not reach nor records the array clean
			// (TestCloseDuringResyncKeepsWriteIntentBits).
			b.queue = append([]task{t}, b.queue...)
		}
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
		if b.stepped {
			b.grant = math.MaxInt32
			b.cond.Broadcast()
		}
		b.cond.Wait()
	}
	b.grant = 0
}

// park waits for the worker's next wake-up (b.mu held), telling a
// stepping test that the worker waits.
func (b *background) park() {
	if b.stepped {
		b.parked = true
		b.cond.Broadcast()
	}
	b.cond.Wait()
}

// pass is the head of a task's stripe loop: in stepped mode it waits for
// a granted step. It reports whether the worker is stopping.
func (b *background) pass() bool {
	if b.stepped {
		b.mu.Lock()
		for b.grant == 0 && !b.stopped {
			b.park()
		}
		b.parked = false
		if b.grant > 0 {
			b.grant--
		}
		b.mu.Unlock()
	}
	return b.stopping()
}

// step (stepped mode, tests) grants the worker n steps and waits until it
// took them or ran out of work, the worker parked again.
func (b *background) step(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.stepped || !b.started {
		return
	}
	b.grant += n
	b.cond.Broadcast()
	for !b.stopped && !(b.parked && (b.grant == 0 || len(b.queue) == 0 && !b.running)) {
		b.cond.Wait()
	}
	b.grant = 0
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
