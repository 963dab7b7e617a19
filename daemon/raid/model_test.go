package raid

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
)

var (
	longModel     = flag.Bool("raid.long", false, "run the randomized model test ladder up to its large sizes")
	modelSeeds    = flag.Int("raid.seeds", 1, "seeds per configuration and rung in TestModel")
	modelWindow   = flag.Bool("raid.window", false, "debug: the model fails members and crashes losing members in the resync window after a crash too (a documented limit: it then fails)")
	modelLogLines = flag.Int("raid.loglines", 30, "steps of the sim's log printed on a failure")
)

// sim drives an array with random I/O, member failures and returns, and
// crashes, against a plain byte-slice model of the volume.
type sim struct {
	t      *testing.T
	rng    *rand.Rand
	level  Level
	n      int
	msize  int64
	mems   []*blockdev.Mem
	faults []*blockdev.Fault
	a      *Array
	cur    []byte
	// cand: for each 512-byte block written since its last durable
	// point, every value a crash may leave (durable value first).
	cand    map[int64][][]byte
	failing map[int]bool // fault rule set, maybe not yet discovered
	crashes int
	rebuilt int
	skipped int // faults not injected (resyncPending)
	lossy   int // crashes that lost members
	log     []string
	// replay, clk: the crash-with-loss model's replayable scheduling
	// (replayKnobs; nil: real timing, as TestModel runs).
	replay *replayKnobs
	clk    *clock.Fake
}

// policy is the Policy of every array the sim creates or assembles.
func (s *sim) policy() Policy {
	p := quietPolicy(nil)
	if s.replay != nil {
		p.replay, p.Clock = s.replay, s.clk
	}
	return p
}

func (s *sim) logf(format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf(format, args...))
	if len(s.log) > *modelLogLines {
		s.log = s.log[1:]
	}
}

func (s *sim) fatalf(format string, args ...any) {
	s.t.Helper()
	for _, l := range s.log {
		s.t.Log(l)
	}
	s.t.Fatalf(format, args...)
}

func newSim(t *testing.T, level Level, n int, msize int64, seed int64) *sim {
	return newSimWith(t, level, n, msize, seed, nil)
}

// newSimWith is newSim with the arrays' scheduling knobs (nil: none).
func newSimWith(t *testing.T, level Level, n int, msize int64, seed int64, replay *replayKnobs) *sim {
	s := &sim{t: t, rng: rand.New(rand.NewSource(seed)), level: level, n: n, msize: msize, cand: map[int64][][]byte{}, failing: map[int]bool{}}
	if replay != nil {
		s.replay, s.clk = replay, clock.NewFake(time.Unix(0, 0))
	}
	s.mems = newMems(n, msize)
	s.faults = make([]*blockdev.Fault, n)
	for i := range s.faults {
		s.faults[i] = blockdev.NewFault(s.mems[i])
	}
	cfg := testCfg(level, nil)
	cfg.Policy = s.policy()
	if s.rng.Intn(2) == 0 {
		cfg.ChunkSize = 4096
	}
	s.a = mustCreate(t, devs(s.faults), cfg)
	s.cur = make([]byte, s.a.Size())
	return s
}

func (s *sim) record(off int64, p []byte, fua bool) {
	for b := int64(0); b < int64(len(p)); b += 512 {
		blk := (off + b) / 512
		nw := append([]byte(nil), p[b:b+512]...)
		if fua {
			delete(s.cand, blk)
		} else {
			if _, ok := s.cand[blk]; !ok {
				s.cand[blk] = [][]byte{append([]byte(nil), s.cur[off+b:off+b+512]...)}
			}
			s.cand[blk] = append(s.cand[blk], nw)
		}
	}
	copy(s.cur[off:], p)
}

func (s *sim) randRange() (int64, int) {
	g := s.a.Geometry()
	var n int
	switch s.rng.Intn(4) {
	case 0: // whole stripes
		k := 1 + s.rng.Intn(3)
		st := s.rng.Int63n(g.Stripes - int64(k) + 1)
		return st * g.StripeSize, k * int(g.StripeSize)
	case 1:
		n = 512 * (1 + s.rng.Intn(8))
	default:
		n = 512 * (1 + s.rng.Intn(int(2*g.StripeSize/512)))
	}
	off := s.rng.Int63n(s.a.Size()-int64(n)+1) / 512 * 512
	return off, n
}

func (s *sim) notActive() int {
	c := 0
	for r, m := range s.a.Status().Members {
		if m.State != "active" || s.failing[r] {
			c++
		}
	}
	return c
}

func (s *sim) step() {
	a := s.a
	switch op := s.rng.Intn(100); {
	case op < 40:
		off, n := s.randRange()
		p := randBuf(s.rng, n)
		fua := s.rng.Intn(10) == 0
		var err error
		if fua {
			_, err = a.WriteAtFUA(p, off)
		} else {
			_, err = a.WriteAt(p, off)
		}
		if err != nil {
			s.fatalf("write %d@%d: %v (state %s)", n, off, err, a.describe())
		}
		s.record(off, p, fua)
		s.logf("write %d@%d fua=%v", n, off, fua)
	case op < 60:
		off, n := s.randRange()
		got := make([]byte, n)
		if _, err := a.ReadAt(got, off); err != nil {
			s.fatalf("read %d@%d: %v", n, off, err)
		}
		if !bytes.Equal(got, s.cur[off:off+int64(n)]) {
			i := 0
			for got[i] == s.cur[off+int64(i)] {
				i++
			}
			s.fatalf("read %d@%d differs from the model at array byte %d (state %s)", n, off, off+int64(i), a.describe())
		}
		s.logf("read %d@%d", n, off)
	case op < 66:
		if err := a.Flush(); err != nil {
			s.fatalf("flush: %v", err)
		}
		clear(s.cand)
		s.logf("flush")
	case op < 72:
		if s.notActive() >= s.level.redundancy(s.n) {
			return
		}
		if s.resyncPending() {
			// A member lost before the resync after a crash is done
			// may be rebuilt from parity the crash tore: a documented
			// limit (docs/RAID.md, "No write hole"), as with md.
			if !s.inWindow() {
				return
			}
		}
		r := s.rng.Intn(s.n)
		if s.a.Status().Members[r].State != "active" {
			return
		}
		if s.rng.Intn(2) == 0 {
			a.FailMember(r, "model: pulled")
			s.logf("fail member %d", r)
		} else {
			// The drive starts failing every request; the next I/O
			// that touches it finds out.
			s.faults[r].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail})
			s.failing[r] = true
			s.logf("member %d starts failing I/O", r)
		}
	case op < 78:
		st := a.Status()
		for r, m := range st.Members {
			if m.State != "failed" {
				continue
			}
			s.faults[r].ClearRules()
			delete(s.failing, r)
			var err error
			if s.rng.Intn(2) == 0 {
				err = a.ReAdd(r, s.faults[r])
				s.logf("re-add member %d", r)
			} else {
				s.mems[r] = blockdev.NewMem(s.msize, 512)
				s.faults[r] = blockdev.NewFault(s.mems[r])
				err = a.Replace(r, s.faults[r])
				s.logf("replace member %d", r)
			}
			if err != nil {
				s.fatalf("return member %d: %v", r, err)
			}
			s.rebuilt++
			break
		}
	case op < 83:
		s.crash()
	case op < 88:
		s.burst()
	case op < 94:
		a.WaitIdle()
		if err := a.Check(); err != nil {
			s.fatalf("check: %v (state %s)", err, a.describe())
		}
		s.logf("idle+check")
	default:
		if err := a.Sweep(); err != nil {
			s.fatalf("sweep: %v", err)
		}
		clear(s.cand)
		s.logf("sweep")
	}
}

// inWindow: a fault comes in a resync window; it is injected only with
// -raid.window (the documented limit then fails the model).
func (s *sim) inWindow() bool {
	if *modelWindow {
		s.logf("fault in a resync window")
		return true
	}
	s.logf("no fault: resync pending")
	s.skipped++
	return false
}

// resyncPending reports whether a resync is queued or running: the
// window after a crash in which parity may still be torn.
func (s *sim) resyncPending() bool {
	b := s.a.bg
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running && b.task.kind == taskResync {
		return true
	}
	for _, t := range b.queue {
		if t.kind == taskResync {
			return true
		}
	}
	return false
}

// burst runs concurrent writes and reads on disjoint zones.
func (s *sim) burst() {
	const k = 4
	zone := s.a.Size() / k / 512 * 512
	type w struct {
		off int64
		p   []byte
	}
	ws := make([]w, k)
	for i := range ws {
		n := 512 * (1 + s.rng.Intn(int(min(zone, 3*s.a.Geometry().StripeSize)/512)))
		off := int64(i)*zone + s.rng.Int63n(zone-int64(n)+1)/512*512
		ws[i] = w{off, randBuf(s.rng, n)}
	}
	var wg sync.WaitGroup
	errs := make([]error, k)
	for i := range ws {
		wg.Add(1)
		do := func() {
			defer wg.Done()
			_, errs[i] = s.a.WriteAt(ws[i].p, ws[i].off)
			if errs[i] == nil {
				_, errs[i] = s.a.ReadAt(make([]byte, 4096), int64(i)*zone)
			}
		}
		if s.replay != nil && s.replay.serial {
			do() // replayable: one after another
		} else {
			go do()
		}
	}
	wg.Wait()
	for i, e := range errs {
		if e != nil {
			s.fatalf("burst write %d: %v", i, e)
		}
		s.record(ws[i].off, ws[i].p, false)
	}
	s.logf("burst of %d writes", k)
}

// crash cuts power: every member keeps a random subset of its unflushed
// writes; then the array is assembled again and checked block by block.
func (s *sim) crash() {
	s.a.Abort()
	for r := range s.mems {
		s.faults[r].ClearRules()
		delete(s.failing, r)
		s.mems[r].CrashRandom(s.rng)
	}
	s.crashes++
	a, rej, err := Assemble(devs(s.faults), AssembleOptions{Policy: s.policy()})
	if err != nil {
		s.fatalf("assemble after crash %d: %v", s.crashes, err)
	}
	s.a = checked(s.t, a)
	s.logf("crash %d: reassembled, %d rejected, state %s", s.crashes, len(rej), a.describe())
	s.verifyAfterCrash(false)
	a.WaitIdle()
	if err := a.Check(); err != nil {
		s.fatalf("check after crash recovery: %v", err)
	}
}

// verifyAfterCrash reads the whole array after a crash: a block written
// since its last durable point holds one of the values a crash may leave
// (any value when lossy: its member was lost with the crash), every other
// block is unchanged. What was read becomes the model.
func (s *sim) verifyAfterCrash(lossy bool) {
	a := s.a
	got := make([]byte, a.Size())
	if _, err := a.ReadAt(got, 0); err != nil {
		s.fatalf("read after crash: %v", err)
	}
	for blk := int64(0); blk < a.Size()/512; blk++ {
		b := got[blk*512 : (blk+1)*512]
		if vs, ok := s.cand[blk]; ok {
			found := false
			for _, v := range vs {
				if bytes.Equal(b, v) {
					found = true
					break
				}
			}
			if !found && !lossy {
				s.fatalf("after crash %d: block %d (of a write in flight) matches none of its %d possible values (stripe %d)", s.crashes, blk, len(vs), blk*512/a.Geometry().StripeSize)
			}
			continue
		}
		if !bytes.Equal(b, s.cur[blk*512:(blk+1)*512]) {
			s.fatalf("after crash %d: block %d was durable and changed (stripe %d)", s.crashes, blk, blk*512/a.Geometry().StripeSize)
		}
	}
	copy(s.cur, got)
	clear(s.cand)
}

func TestModel(t *testing.T) {
	type rung struct {
		steps int
		msize int64
	}
	ladder := []rung{{40, 512 << 10}, {100, 768 << 10}}
	if *longModel {
		ladder = append(ladder, rung{1000, 2 << 20}, rung{5000, 4 << 20})
	}
	if testing.Short() {
		ladder = ladder[:1]
	}
	configs := []struct {
		level Level
		n     int
	}{{RAID0, 3}, {RAID1, 2}, {RAID1, 3}, {RAID5, 3}, {RAID5, 5}, {RAID6, 4}, {RAID6, 6}}
	for ri, r := range ladder {
		for ci, c := range configs {
			for k := 0; k < *modelSeeds; k++ {
				seed := int64(100000*ri + 100*k + ci)
				t.Run(fmt.Sprintf("%s-%d/steps=%d/seed=%d", c.level, c.n, r.steps, seed), func(t *testing.T) {
					s := newSim(t, c.level, c.n, r.msize, seed)
					for i := 0; i < r.steps; i++ {
						s.step()
					}
					s.a.WaitIdle()
					t.Logf("%d steps, %d crashes, %d member returns", r.steps, s.crashes, s.rebuilt)
				})
			}
		}
	}
}

func TestModelDebug(t *testing.T) {
	if flag.Lookup("test.run").Value.String() != "TestModelDebug" {
		t.Skip("debug entry point: go test -run TestModelDebug")
	}
	debugf = t.Logf
	defer func() { debugf = nil }()
	s := newSim(t, RAID1, 2, 768<<10, 100701)
	for i := 0; i < 100; i++ {
		s.step()
	}
}
