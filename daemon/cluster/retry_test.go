package cluster

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Regression tests for failed and refused actions (issue 12, holes 5 and
// 6): takeovers that keep failing, a home node that fenced itself and came
// back, an array whose owner reports it failed, repairs the owner refuses.

// seedSim builds the seed topology of testdata/seed5.txt: nodes A-E with
// drives X1-X4, RAID-5 array x homed on node X with one member on every
// other node. failback maps arrays to their policy (default: cfg's).
func seedSim(t *testing.T, cfg Config, failback map[string]string) *sim {
	t.Helper()
	s, err := newSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	members := map[string]string{"a": "B1,C1,D1,E1", "b": "A1,C2,D2,E2", "c": "A2,B2,D3,E3", "d": "A3,B3,C3,E4", "e": "A4,B4,C4,D4"}
	for _, n := range "ABCDE" {
		s.mustRun(t, "add-node", string(n))
	}
	for _, a := range "abcde" {
		args := []string{string(a), "level=raid5", "home=" + strings.ToUpper(string(a)), "members=" + members[string(a)]}
		if p := failback[string(a)]; p != "" {
			args = append(args, "failback="+p)
		}
		s.mustRun(t, "add-array", args...)
	}
	return s
}

func (s *sim) mustRun(t *testing.T, cmd string, args ...string) string {
	t.Helper()
	out, err := s.run(cmd, args)
	if err != nil {
		t.Fatalf("%s %v: %v", cmd, args, err)
	}
	if strings.Contains(out, "error:") {
		t.Fatalf("%s %v: %s", cmd, args, out)
	}
	return out
}

// fences returns the Fence actions for array decided since s.acts[from].
func (s *sim) fences(array string, from int) []timed {
	var out []timed
	for _, ta := range s.acts[from:] {
		if f, ok := ta.act.(Fence); ok && f.Array == array {
			out = append(out, ta)
		}
	}
	return out
}

// repairsOf returns the ticks at which Resync/Rebuild of array/member was
// ordered.
func (s *sim) repairsOf(array, member string) []int64 {
	var out []int64
	for _, ta := range s.acts {
		switch r := ta.act.(type) {
		case Resync:
			if r.Array == array && r.Member == member {
				out = append(out, ta.tick)
			}
		case Rebuild:
			if r.Array == array && r.Member == member {
				out = append(out, ta.tick)
			}
		}
	}
	return out
}

// viewJSON is the array's view as the API and the CLI read it.
func viewJSON(t *testing.T, m *Machine, array string) map[string]any {
	t.Helper()
	v, ok := m.Array(array)
	if !ok {
		t.Fatalf("array %q unknown", array)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func memberState(m *Machine, array, drive string) MemberState {
	v, _ := m.Array(array)
	for _, mb := range v.Members {
		if mb.Drive == drive {
			return mb.State
		}
	}
	return ""
}

// gaps returns the differences between successive distinct ticks, and the
// largest number of entries at one tick.
func gaps(ticks []int64) (out []int64, perTick int) {
	count := map[int64]int{}
	for i, tk := range ticks {
		count[tk]++
		perTick = max(perTick, count[tk])
		if i > 0 && tk != ticks[i-1] {
			out = append(out, tk-ticks[i-1])
		}
	}
	return out, perTick
}

// checkBackoff: the waits between attempts never shrink, grow to at least
// minLast and never exceed the cap.
func checkBackoff(t *testing.T, what string, ticks []int64, minLast, cap int64) {
	t.Helper()
	g, perTick := gaps(ticks)
	if perTick > 2 {
		t.Errorf("%s: %d attempts in one tick (ticks %v); want at most 2", what, perTick, ticks)
	}
	if len(g) < 3 {
		t.Fatalf("%s: attempts at ticks %v: want retries at growing intervals", what, ticks)
	}
	for i := 1; i < len(g); i++ {
		if g[i] < g[i-1] {
			t.Errorf("%s: interval shrank from %d to %d ticks (attempts at %v)", what, g[i-1], g[i], ticks)
		}
	}
	if last := g[len(g)-1]; last < minLast || last > cap {
		t.Errorf("%s: last interval %d ticks, want between %d and the cap %d (attempts at %v)", what, last, minLast, cap, ticks)
	}
}

// (a) Every survivor fails its fences (they all lost their leases to a
// frozen etcd voter) while B's array needs a new owner: the machine must
// back off instead of minting an epoch per failure.
func TestTakeoverFailuresBackOff(t *testing.T) {
	s := seedSim(t, Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	for _, n := range []string{"A", "C", "D", "E"} {
		s.mustRun(t, "fail-fences", n)
	}
	s.mustRun(t, "kill", "B")
	start := len(s.acts)
	s.mustRun(t, "tick", "80")
	fs := s.fences("b", start)
	var ticks []int64
	for _, f := range fs {
		ticks = append(ticks, f.tick)
	}
	epoch := s.m.arrays["b"].epoch
	t.Logf("b: %d fences at ticks %v, epoch now %d", len(fs), ticks, epoch)
	// Lost at tick 10; 70 ticks of failures with a cap of 32 ticks: two
	// attempts at once, then after 1, 2, 4, 8, 16, 32 ticks.
	if len(fs) > 10 || epoch > 11 {
		t.Fatalf("b: %d takeover attempts (epoch 1 -> %d) in 70 ticks of failing fences; want at most 10", len(fs), epoch)
	}
	checkBackoff(t, "b takeovers", ticks, 16, DefaultBackoffMaxTicks)
	if v := viewJSON(t, s.m, "b"); !strings.Contains(fmt.Sprint(v["last_error"]), "lost its lease") {
		t.Errorf("b view last_error = %v, want the fence failure's reason", v["last_error"])
	}
	// The survivors regain their leases: b is taken over within one
	// backoff interval, under one more epoch.
	for _, n := range []string{"A", "C", "D", "E"} {
		s.mustRun(t, "heal-fences", n)
	}
	s.mustRun(t, "tick", fmt.Sprint(DefaultBackoffMaxTicks+1))
	if v, _ := s.m.Array("b"); v.Phase != "active" || v.Epoch != epoch+1 {
		t.Fatalf("b after the fences heal: %+v, want active at epoch %d", v, epoch+1)
	}
	if len(s.violations) > 0 {
		t.Fatal(s.violations)
	}
}

// (b) The home node fenced itself (its lease renewal stalled), came back
// with a lease, and its first fence fails (its store calls still time out):
// its array is taken back by the home, not moved to another node. Once
// with the coordinator's configuration (no tick-driven leases: the node
// reports "returned") and once with the machine modelling the leases.
func TestHomeSelfFenceKeepsArray(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		bounce func(s *sim)
	}{
		{"coordinator", Config{}, func(s *sim) {
			s.mustRun(t, "report-returned", "C") // NodeReturned while its lease lives
		}},
		{"lease-model", Config{LeaseTicks: 10, SelfFenceTicks: 6}, func(s *sim) {
			s.mustRun(t, "partition", "C")
			s.mustRun(t, "tick", "7") // fences itself at 6, lease expires at 10
			s.mustRun(t, "heal", "C")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := seedSim(t, tc.cfg, map[string]string{"c": "manual"})
			s.mustRun(t, "fail-fences", "C", "n=1")
			start := len(s.acts)
			tc.bounce(s)
			s.mustRun(t, "tick", "20")
			for _, f := range s.fences("c", start) {
				if fc := f.act.(Fence); fc.Node != "C" {
					t.Errorf("t=%d: %s: array c moved off its healthy home C", f.tick, fc)
				}
			}
			if v, _ := s.m.Array("c"); v.Owner != "C" || v.Phase != "active" {
				t.Fatalf("c after C came back: owner %q phase %s, want active on C", v.Owner, v.Phase)
			}
			// The other arrays never moved either.
			for _, a := range []string{"a", "b", "d", "e"} {
				if v, _ := s.m.Array(a); v.Owner != v.Home || v.Phase != "active" {
					t.Errorf("array %s: owner %q phase %s, want active at home %s", a, v.Owner, v.Phase, v.Home)
				}
			}
			if len(s.violations) > 0 {
				t.Fatal(s.violations)
			}
		})
	}
}

// (c) B returns and its members resync; the owner of a then loses D too
// (a double fault on RAID-5) and reports a failed. The view says failed,
// with the reason, everywhere; the home is drained in Slurm; no repair is
// ordered while it is failed; when D is back the machine re-assembles a
// at a fresh epoch with both returned members stale, and a resyncs to
// optimal.
func TestArrayFailedRecovers(t *testing.T) {
	s := seedSim(t, Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	s.mustRun(t, "kill", "B")
	s.mustRun(t, "tick", "10")
	s.mustRun(t, "return", "B")
	if st := memberState(s.m, "a", "B1"); st != MemberResyncing {
		t.Fatalf("a/B1 after B returned: %s, want resyncing", st)
	}
	s.mustRun(t, "kill", "D") // the second fault, while B1 resyncs
	s.mustRun(t, "tick", "10")
	if st := memberState(s.m, "a", "D1"); st != MemberMissing {
		t.Fatalf("a/D1 after D's lease expired: %s, want missing", st)
	}
	before := s.m.arrays["a"].epoch
	s.mustRun(t, "array-failed", "a", "2 of 4 members failed, raid5 tolerates 1")
	v := viewJSON(t, s.m, "a")
	if v["state"] != string(StateFailed) {
		t.Fatalf("a after its owner reported it failed: state %v, want failed (view %v)", v["state"], v)
	}
	if !strings.Contains(fmt.Sprint(v["reason"]), "raid5 tolerates 1") || !slices.Contains(anyStrings(v["missing"]), "D1") {
		t.Errorf("a view reason = %v missing = %v, want the owner's reason and D1 missing", v["reason"], v["missing"])
	}
	drained := false
	for _, ta := range s.acts {
		if d, ok := ta.act.(SlurmDrain); ok && d.Node == "A" && strings.Contains(d.Reason, "array a failed") {
			drained = true
		}
	}
	if !drained {
		t.Errorf("a failed but its home A was not drained in Slurm")
	}
	mark := len(s.acts)
	s.mustRun(t, "tick", "40")
	for _, ta := range s.acts[mark:] {
		switch r := ta.act.(type) {
		case Resync:
			if r.Array == "a" {
				t.Errorf("t=%d: %s ordered while a is failed", ta.tick, r)
			}
		case Fence:
			if r.Array == "a" {
				t.Errorf("t=%d: %s while a has two members out (B1 stale, D1 missing)", ta.tick, r)
			}
		}
	}
	if v, _ := s.m.Array("a"); v.State != StateFailed {
		t.Errorf("a with B1 stale and D1 missing: %s, want failed", v.State)
	}
	mark = len(s.acts)
	s.mustRun(t, "return", "D")
	var asm *Assemble
	for _, ta := range s.acts[mark:] {
		if a, ok := ta.act.(Assemble); ok && a.Array == "a" {
			asm = &a
		}
	}
	if asm == nil || asm.Epoch <= before {
		t.Fatalf("a not re-assembled at a fresh epoch (was %d) after D returned: %v", before, asm)
	}
	if !slices.Equal(asm.Stale, []string{"B1", "D1"}) || len(asm.Degraded) != 0 {
		t.Errorf("a re-assembled as %s, want both returned members stale, none missing", asm)
	}
	s.mustRun(t, "tick", "1")
	s.mustRun(t, "resync-done", "a")
	s.mustRun(t, "tick", "1")
	if v, _ := s.m.Array("a"); v.State != StateOptimal || v.Owner != "A" {
		t.Fatalf("a after recovery: %+v, want optimal on A", v)
	}
	if v := viewJSON(t, s.m, "a"); v["reason"] != nil {
		t.Errorf("a optimal again but reason %v still shown", v["reason"])
	}
	if len(s.violations) > 0 {
		t.Fatal(s.violations)
	}
}

// (c') A failed RAID-5 array whose members are all back (the freeze was
// shorter than the lease) comes back on its own after a backoff.
func TestArrayFailedAllMembersBackRecovers(t *testing.T) {
	s := seedSim(t, Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	before := s.m.arrays["c"].epoch
	s.mustRun(t, "array-failed", "c", "member D3 timed out while B2 resynced")
	if v, _ := s.m.Array("c"); v.State != StateFailed {
		t.Fatalf("c: %s, want failed", v.State)
	}
	s.mustRun(t, "tick", "3")
	if v, _ := s.m.Array("c"); v.Phase != "active" || v.Owner != "C" || v.Epoch <= before || v.State == StateFailed {
		t.Fatalf("c 3 ticks after it failed with every member up: %+v, want active again on C at a fresh epoch", v)
	}
}

// (d) The owner refuses every repair of B's member: the machine re-orders
// it with exponential backoff, says why in the view, shows the member stale
// (not "rebuilding 0%" for good), and resyncs once the owner accepts.
func TestRefusedRepairBacksOff(t *testing.T) {
	s := seedSim(t, Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	s.mustRun(t, "kill", "B")
	s.mustRun(t, "tick", "10")
	s.mustRun(t, "refuse-repairs", "a", "too many failed members")
	s.mustRun(t, "return", "B")
	s.mustRun(t, "tick", "80")
	ticks := s.repairsOf("a", "B1")
	t.Logf("a/B1 repairs ordered at ticks %v", ticks)
	checkBackoff(t, "a/B1 repairs", ticks, 16, DefaultBackoffMaxTicks)
	v := viewJSON(t, s.m, "a")
	if !strings.Contains(fmt.Sprint(v["last_error"]), "too many failed members") {
		t.Errorf("a view last_error = %v, want the owner's refusal", v["last_error"])
	}
	if st := memberState(s.m, "a", "B1"); st != MemberStale {
		t.Errorf("a/B1 while its repair is refused: %s, want stale", st)
	}
	if v["state"] == string(StateRebuilding) {
		t.Errorf("a shows rebuilding while no repair runs")
	}
	s.mustRun(t, "allow-repairs", "a")
	s.mustRun(t, "tick", fmt.Sprint(DefaultBackoffMaxTicks+1))
	s.mustRun(t, "resync-done", "a")
	s.mustRun(t, "tick", "1")
	if v := viewJSON(t, s.m, "a"); v["state"] != string(StateOptimal) || v["last_error"] != nil {
		t.Fatalf("a after the owner accepts the repair: state %v last_error %v, want optimal and no error", v["state"], v["last_error"])
	}
}

func anyStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, x := range l {
			out = append(out, fmt.Sprint(x))
		}
	}
	return out
}

// The owner's assembly found too few members: it reports ArrayFailed, then
// AssembleFailed (daemon/node sends them in this order). The array is
// failed and waits for members; it does not tour the other nodes.
func TestAssemblyFindsArrayFailed(t *testing.T) {
	s := seedSim(t, Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	s.mustRun(t, "kill", "B")
	s.mustRun(t, "tick", "10")
	s.mustRun(t, "return", "B")
	s.mustRun(t, "kill", "D")
	s.mustRun(t, "kill", "A") // a's owner dies too: a is taken over with B1 stale, D1 lost
	s.mustRun(t, "tick", "10")
	a := s.m.arrays["a"]
	if a.phase != phaseActive || a.owner == "A" {
		t.Fatalf("a: phase %s on %s, want taken over", a.phase, a.owner)
	}
	// The sim assembled it; the real owner found too few members usable.
	a.phase = phaseAssembling
	owner, epoch := a.owner, a.epoch
	for _, ev := range []Event{
		ArrayFailed{Array: "a", Node: owner, Epoch: epoch, Reason: "assembly found 2 of 4 members usable"},
		AssembleFailed{Array: "a", Node: owner, Epoch: epoch, Reason: "too many failed members"},
	} {
		if err := s.step(ev); err != nil {
			t.Fatal(err)
		}
	}
	mark := len(s.acts)
	s.mustRun(t, "tick", "40")
	if v := viewJSON(t, s.m, "a"); v["state"] != string(StateFailed) || !strings.Contains(fmt.Sprint(v["reason"]), "2 of 4 members usable") {
		t.Fatalf("a: %v %q, want failed with the owner's reason", v["state"], v["reason"])
	}
	if fs := s.fences("a", mark); len(fs) > 0 {
		t.Fatalf("a taken over again while members are missing: %v", fs[0].act)
	}
	s.mustRun(t, "return", "D")
	if v, _ := s.m.Array("a"); v.Phase != "active" || v.Owner != owner || v.Epoch <= epoch {
		t.Fatalf("a after D returned: %+v, want assembled again by %s at a fresh epoch", v, owner)
	}
}
