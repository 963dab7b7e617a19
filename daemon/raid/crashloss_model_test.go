package raid

import (
	"bytes"
	"flag"
	"fmt"
	"testing"
	"time"
)

// The crash-with-loss model replays by seed (replayKnobs); go test runs
// one seed per configuration, make test 40 without the race detector
// (docs/RELIABILITY.md, "Known problems found", 6).
var (
	_              = flag.Bool("raid.crashloss", false, "accepted for old command lines: TestModelCrashWithMemberLoss runs by default now (-raid.crashloss.seeds)")
	crashLossSeeds = flag.Int("raid.crashloss.seeds", 1, "seeds per configuration in TestModelCrashWithMemberLoss (make test: 40 without the race detector; -short: none)")
	crashLossTrace = flag.Bool("raid.crashloss.trace", false, "debug: trace the engine (debugf) in TestModelCrashWithMemberLoss")
	crashLossIdle  = flag.Bool("raid.crashloss.idle", false, "debug: TestModelCrashWithMemberLoss waits for background work before a crash with loss")
	crashLossCheck = flag.Bool("raid.crashloss.verify", false, "debug: TestModelCrashWithMemberLoss reads the whole array after every operation (finds where a failure starts; reads may change the run)")
	crashLossFree  = flag.Bool("raid.crashloss.free", false, "TestModelCrashWithMemberLoss on real timing (member batches inline or not by latency, background worker and bursts free-running): not replayable")
)

// tick is one step of the model's clock, between two of its operations:
// the background worker takes a few steps (replayable runs) and the fake
// clock moves on (progress events, rebuild checkpoints).
func (s *sim) tick() {
	if s.replay == nil {
		return
	}
	n := s.rng.Intn(6)
	if s.rng.Intn(8) == 0 {
		n = 40
	}
	if n > 0 {
		s.a.bg.step(n)
		s.logf("background: %d steps, task %q", n, s.a.Status().Task)
	}
	s.clk.Advance(200 * time.Millisecond)
}

// crashWithLoss: owner crash (members keep a random subset of unflushed
// writes) and, at once, up to redundancy members lost; assembled without
// them; they come back later by ReAdd.
func (s *sim) crashWithLoss(held map[int]bool) {
	red := s.level.redundancy(s.n) - s.notActive()
	if red <= 0 {
		return
	}
	if *crashLossIdle {
		s.a.WaitIdle()
	}
	if s.resyncPending() && !s.inWindow() {
		// Members lost before the last crash's resync is done: parity
		// it tore may rebuild them (the documented limit, sim.step).
		return
	}
	st := s.a.Status()
	s.logf("crash with loss: task %q dirty %d", st.Task, st.Dirty)
	s.a.Abort()
	for r := range s.mems {
		s.faults[r].ClearRules()
		delete(s.failing, r)
		s.mems[r].CrashRandom(s.rng)
	}
	s.crashes++
	s.lossy++
	k := 1 + s.rng.Intn(red)
	clear(held)
	for len(held) < k {
		r := s.rng.Intn(s.n)
		if st.Members[r].State == "active" {
			held[r] = true
		}
	}
	d := devs(s.faults)
	for r := range held {
		d[r] = nil
	}
	a, rej, err := Assemble(d, AssembleOptions{Epoch: 0, Policy: s.policy()})
	if err != nil {
		s.fatalf("assemble after crash %d without %v: %v", s.crashes, held, err)
	}
	s.a = checked(s.t, a)
	s.logf("crash %d without members %v: reassembled, %d rejected, state %s", s.crashes, held, len(rej), a.describe())
	s.verifyAfterCrash(true)
}

// handoff: clean release (Close) and assembly elsewhere, background work
// possibly under way.
func (s *sim) handoff() {
	if err := s.a.Close(); err != nil {
		s.logf("close: %v", err)
	}
	for r := range s.mems {
		s.mems[r].Crash() // only what was flushed survives
	}
	a, rej, err := Assemble(devs(s.faults), AssembleOptions{Epoch: 0, Policy: s.policy()})
	if err != nil {
		s.fatalf("assemble after hand-off: %v", err)
	}
	s.a = checked(s.t, a)
	s.logf("hand-off: reassembled, %d rejected, state %s", len(rej), a.describe())
	s.verifyAfterCrash(false)
}

// TestModelCrashWithMemberLoss extends TestModel's sim with crashes that
// lose members at once (the owner and member nodes dying together: the
// array is assembled without them, they return later by ReAdd) and with
// clean hand-offs (Close, then Assemble, as a failback does), background
// work possibly under way. Durable blocks must survive; blocks of writes
// in flight on a member lost with the crash may read as neither old nor
// new (docs/RAID.md, limits). No member is lost while a resync after a
// crash is pending (the documented window; -raid.window). More seeds:
// go test ./daemon/raid/ -run TestModelCrashWithMemberLoss -args
// -raid.crashloss.seeds=40 (a seed fails every time it is run).
func TestModelCrashWithMemberLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the crash-with-loss model takes seconds (make test runs 160 seeded runs)")
	}
	seeds := *crashLossSeeds
	configs := []struct {
		level Level
		n     int
	}{{RAID5, 4}, {RAID5, 5}, {RAID6, 5}, {RAID6, 6}}
	for ci, c := range configs {
		for k := 0; k < seeds; k++ {
			seed := int64(7000 + 100*k + ci)
			t.Run(fmt.Sprintf("%s-%d/seed=%d", c.level, c.n, seed), func(t *testing.T) { runCrashLoss(t, c.level, c.n, seed) })
		}
	}
}

// verifyAll (debug) reads the whole array: it must read as the model.
func (s *sim) verifyAll() {
	got := make([]byte, s.a.Size())
	if _, err := s.a.ReadAt(got, 0); err != nil {
		s.fatalf("verify: read: %v", err)
	}
	if i := firstDiff(got, s.cur); i >= 0 {
		s.fatalf("verify: array byte %d (block %d, stripe %d) differs from the model (state %s)", i, i/512, int64(i)/s.a.Geometry().StripeSize, s.a.describe())
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// badStripes (debug) lists the stripes whose members, all in sync, do
// not agree with their parity (read from the member devices directly).
func (s *sim) badStripes() []int64 {
	a := s.a
	if a.coder.enc == nil {
		return nil
	}
	w := a.geo.DataDisks + a.geo.ParityDisks
	snaps := make([][]byte, s.n)
	var bad []int64
	for st := int64(0); st < a.geo.Stripes; st++ {
		sh := make([][]byte, w)
		all := true
		for x := 0; x < w; x++ {
			r := a.shardRole(st, x)
			m := a.member(r)
			if !a.inSync(m, st) {
				all = false
				break
			}
			if snaps[r] == nil {
				snaps[r] = s.mems[r].Snapshot()
			}
			sh[x] = snaps[r][a.moff(st, 0):a.moff(st, a.geo.ChunkSize)]
		}
		if !all {
			continue
		}
		if ok, err := a.coder.enc.Verify(sh); err != nil || !ok {
			bad = append(bad, st)
		}
	}
	return bad
}

// runCrashLoss is one seeded run of TestModelCrashWithMemberLoss.
func runCrashLoss(t *testing.T, level Level, n int, seed int64) {
	var rk *replayKnobs
	if !*crashLossFree {
		rk = &replayKnobs{serial: true, stepped: true}
	}
	if *crashLossTrace {
		debugf = t.Logf
		defer func() { debugf = nil }()
	}
	s := newSimWith(t, level, n, 768<<10, seed, rk)
	if *crashLossTrace {
		// The engine's trace in the sim's log, in order.
		debugf = func(f string, args ...any) { s.logf("  engine: "+f, args...) }
	}
	held := map[int]bool{}
	for i := 0; i < 150; i++ {
		if *crashLossCheck {
			s.verifyAll()
			if b := s.badStripes(); len(b) > 0 {
				s.logf("stripes not matching their parity: %v", b)
			}
		}
		s.tick()
		switch x := s.rng.Intn(100); {
		case x < 8:
			if len(held) == 0 {
				s.crashWithLoss(held)
			}
		case x < 16 && len(held) > 0:
			// The lowest role held (a map's order is random).
			r := s.n
			for h := range held {
				r = min(r, h)
			}
			if err := s.a.ReAdd(r, s.faults[r]); err != nil {
				s.logf("re-add %d: %v", r, err)
			} else {
				s.logf("re-add %d", r)
			}
			delete(held, r)
		case x < 20:
			if len(held) == 0 {
				s.handoff()
			}
		default:
			if len(held) > 0 {
				// Members held back: plain writes and reads
				// only (no further faults, no crash).
				off, n := s.randRange()
				if s.rng.Intn(2) == 0 {
					p := randBuf(s.rng, n)
					if _, err := s.a.WriteAt(p, off); err != nil {
						s.fatalf("write %d@%d: %v", n, off, err)
					}
					s.record(off, p, false)
					s.logf("write %d@%d (held %v)", n, off, held)
				} else {
					got := make([]byte, n)
					if _, err := s.a.ReadAt(got, off); err != nil {
						s.fatalf("read %d@%d: %v", n, off, err)
					}
					if !bytes.Equal(got, s.cur[off:off+int64(n)]) {
						s.fatalf("read %d@%d differs from the model (held %v, state %s)", n, off, held, s.a.describe())
					}
				}
				continue
			}
			s.step()
		}
	}
	s.a.WaitIdle()
	t.Logf("%d crashes (%d losing members), %d member returns, %d faults skipped in a resync window", s.crashes, s.lossy, s.rebuilt, s.skipped)
}

// TestModelCrashWithMemberLossFoundSeeds replays the crash-model seeds
// that found engine bugs outside make test's 40 seeds. raid6-5 26402 and
// 32602 (-raid.crashloss.seeds=300): a RAID-6 stripe whose P and Q
// members were both absent after a crash (one failed before it, one lost
// with it) lost its in-flight write's log entry; the member's return did
// not catch the stripe up and served a stale parity chunk
// (missedInFlightParityAbsent).
func TestModelCrashWithMemberLossFoundSeeds(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the crash-with-loss model takes seconds")
	}
	for _, seed := range []int64{26402, 32602} {
		t.Run(fmt.Sprintf("raid6-5/seed=%d", seed), func(t *testing.T) { runCrashLoss(t, RAID6, 5, seed) })
	}
}
