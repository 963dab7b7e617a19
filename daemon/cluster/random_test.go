package cluster

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// randomRun drives a random cluster through a random sequence of kills,
// returns, partitions, heals, drains, drive failures, failed fences and
// ticks, checking after every step that no array is served by two nodes
// and that epochs only increase. At the end every fault is repaired and the
// cluster must converge: every array optimal, served by exactly its owner.
// It returns the full transcript for the determinism check.
func randomRun(t *testing.T, seed uint64, steps int) string {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0x7431))
	lease := int64(4 + r.IntN(10))
	sf := int64(2 + r.IntN(int(lease-2)))
	s, err := newSim(Config{LeaseTicks: lease, SelfFenceTicks: sf, ReleaseTimeoutTicks: int64(1 + r.IntN(4))})
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	nNodes := 6 + r.IntN(8)
	level := "raid5"
	width := 4
	if r.IntN(2) == 0 {
		level, width = "raid6", 5
	}
	h := &history{t: t, seed: seed, r: r, s: s, lease: lease}
	h.do("gen-cluster", fmt.Sprint("nodes=", nNodes), "racks=1", fmt.Sprint("drives=", width), fmt.Sprint("width=", width), "level="+level, "domains=none")
	nodes := s.m.nodeOrder
	epochs := map[string]uint64{}
	for range steps {
		n := nodes[r.IntN(len(nodes))]
		arr := s.m.arrayOrder[r.IntN(len(s.m.arrayOrder))]
		h.fault(n, arr)
		for _, av := range s.m.Arrays() {
			if av.Epoch < epochs[av.Name] {
				t.Fatalf("seed %d: array %s epoch went back from %d to %d", seed, av.Name, epochs[av.Name], av.Epoch)
			}
			epochs[av.Name] = av.Epoch
		}
		if len(s.violations) > 0 {
			t.Fatalf("seed %d: %v\n%s", seed, s.violations, h.log.String())
		}
	}
	h.converge(nodes)
	return h.log.String()
}

// history is one random run: its sim, its source of randomness, and the
// log of every command with its output.
type history struct {
	t     *testing.T
	seed  uint64
	r     *rand.Rand
	s     *sim
	lease int64
	log   strings.Builder
}

func (h *history) do(cmd string, args ...string) {
	h.t.Helper()
	out, err := h.s.run(cmd, args)
	if err != nil {
		h.t.Fatalf("seed %d: %s %v: %v", h.seed, cmd, args, err)
	}
	fmt.Fprintf(&h.log, "%s %s\n%s\n", cmd, strings.Join(args, " "), out)
}

// fault applies one random fault (or repair, or passage of time) to node n
// or array arr.
func (h *history) fault(n, arr string) {
	switch k := h.r.IntN(23); {
	case k < 3:
		h.do("kill", n)
	case k < 5:
		h.do("partition", n)
	case k < 8:
		if h.s.dead[n] || h.s.partitioned[n] {
			h.do("return", n)
		}
	case k < 9:
		h.do("drain", n)
	case k < 10:
		h.do("undrain", n)
	case k < 11:
		// Failed drives lose data for good; keep them within what
		// the level survives so that the array can converge.
		av, _ := h.s.m.Array(arr)
		broken := 0
		for _, mb := range av.Members {
			if mb.State == MemberDriveFailed || mb.State == MemberReplaced || mb.State == MemberRebuilding {
				broken++
			}
		}
		if broken < h.s.m.arrays[arr].level.Parity() {
			h.do("fail-drive", arr, av.Members[h.r.IntN(len(av.Members))].Drive)
		}
	case k < 12:
		av, _ := h.s.m.Array(arr)
		h.do("replace-drive", av.Members[h.r.IntN(len(av.Members))].Drive)
	case k < 13:
		h.do("fail-next-fence", arr)
	case k < 14:
		// A report from a superseded owner must change nothing.
		av, _ := h.s.m.Array(arr)
		for _, mb := range av.Members {
			if (mb.State == MemberResyncing || mb.State == MemberRebuilding) && av.Epoch > 1 {
				if err := h.s.step(RebuildDone{Array: arr, Member: mb.Drive, Epoch: av.Epoch - 1}); err != nil {
					h.t.Fatal(err)
				}
				if now, _ := h.s.m.Array(arr); now.Members[slices.IndexFunc(now.Members, func(m MemberView) bool { return m.Drive == mb.Drive })].State != mb.State {
					h.t.Fatalf("seed %d: stale RebuildDone for %s/%s took effect", h.seed, arr, mb.Drive)
				}
			}
		}
		h.do("resync-all")
	case k < 15:
		h.do("suspect", n)
	case k < 16:
		h.do("unsuspect", n)
	case k < 17:
		// Refused and failed actions (issue 12): a node whose fences
		// fail for a while, an owner that refuses repairs, an owner
		// whose RAID reports the array failed.
		switch h.r.IntN(4) {
		case 0:
			h.do("fail-fences", n, fmt.Sprint("n=", 1+h.r.IntN(4)))
		case 1:
			h.do("refuse-repairs", arr, "injected")
		case 2:
			h.do("allow-repairs", arr)
		case 3:
			if a := h.s.m.arrays[arr]; a.phase == phaseActive && h.s.acting[arr][a.owner] {
				h.do("array-failed", arr, "injected")
			}
		}
	default:
		h.do("tick", fmt.Sprint(1+h.r.IntN(int(h.lease)+2)))
	}
}

// converge repairs every fault and checks that the cluster converges:
// every array optimal, at home, served by exactly its owner.
func (h *history) converge(nodes []string) {
	h.t.Helper()
	for _, n := range nodes {
		h.do("heal-fences", n)
	}
	for _, a := range h.s.m.arrayOrder {
		h.do("allow-repairs", a)
	}
	for _, n := range nodes {
		if h.s.dead[n] || h.s.partitioned[n] {
			h.do("return", n)
		}
		h.do("undrain", n)
		h.do("unsuspect", n)
	}
	for _, a := range h.s.m.Arrays() {
		for _, mb := range a.Members {
			if mb.State == MemberDriveFailed {
				h.do("replace-drive", mb.Drive)
			}
		}
	}
	for range 4 {
		h.do("tick", fmt.Sprint(h.lease))
		h.do("resync-all")
	}
	// Actions refused before the repair may be backing off still.
	h.do("tick", fmt.Sprint(DefaultBackoffMaxTicks+1))
	h.do("resync-all")
	h.do("tick", fmt.Sprint(h.lease))
	for _, a := range h.s.m.Arrays() {
		if a.State != StateOptimal || a.Owner != a.Home || a.Phase != "active" {
			h.t.Fatalf("seed %d: array %s did not converge: %+v\n%s", h.seed, a.Name, a, h.log.String())
		}
		if len(h.s.acting[a.Name]) != 1 || !h.s.acting[a.Name][a.Owner] {
			h.t.Fatalf("seed %d: array %s owner %s but served by %v\n%s", h.seed, a.Name, a.Owner, h.s.acting[a.Name], h.log.String())
		}
	}
	if len(h.s.violations) > 0 {
		h.t.Fatalf("seed %d: %v", h.seed, h.s.violations)
	}
}

func TestRandomInvariants(t *testing.T) {
	seeds, steps := 300, 60
	if testing.Short() || raceEnabled {
		seeds = 40
	}
	for seed := range uint64(seeds) {
		randomRun(t, seed, steps)
	}
}

func TestDeterministic(t *testing.T) {
	for seed := range uint64(5) {
		if a, b := randomRun(t, seed, 80), randomRun(t, seed, 80); a != b {
			t.Fatalf("seed %d: two runs of the same events differ", seed)
		}
	}
}
