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
	var log strings.Builder
	do := func(cmd string, args ...string) {
		out, err := s.run(cmd, args)
		if err != nil {
			t.Fatalf("seed %d: %s %v: %v", seed, cmd, args, err)
		}
		fmt.Fprintf(&log, "%s %s\n%s\n", cmd, strings.Join(args, " "), out)
	}
	do("gen-cluster", fmt.Sprint("nodes=", nNodes), "racks=1", fmt.Sprint("drives=", width), fmt.Sprint("width=", width), "level="+level, "domains=none")
	nodes := s.m.nodeOrder
	epochs := map[string]uint64{}
	for range steps {
		n := nodes[r.IntN(len(nodes))]
		arr := s.m.arrayOrder[r.IntN(len(s.m.arrayOrder))]
		switch k := r.IntN(23); {
		case k < 3:
			do("kill", n)
		case k < 5:
			do("partition", n)
		case k < 8:
			if s.dead[n] || s.partitioned[n] {
				do("return", n)
			}
		case k < 9:
			do("drain", n)
		case k < 10:
			do("undrain", n)
		case k < 11:
			// Failed drives lose data for good; keep them within what
			// the level survives so that the array can converge.
			av, _ := s.m.Array(arr)
			broken := 0
			for _, mb := range av.Members {
				if mb.State == MemberDriveFailed || mb.State == MemberReplaced || mb.State == MemberRebuilding {
					broken++
				}
			}
			if broken < s.m.arrays[arr].level.Parity() {
				do("fail-drive", arr, av.Members[r.IntN(len(av.Members))].Drive)
			}
		case k < 12:
			av, _ := s.m.Array(arr)
			do("replace-drive", av.Members[r.IntN(len(av.Members))].Drive)
		case k < 13:
			do("fail-next-fence", arr)
		case k < 14:
			// A report from a superseded owner must change nothing.
			av, _ := s.m.Array(arr)
			for _, mb := range av.Members {
				if (mb.State == MemberResyncing || mb.State == MemberRebuilding) && av.Epoch > 1 {
					if err := s.step(RebuildDone{Array: arr, Member: mb.Drive, Epoch: av.Epoch - 1}); err != nil {
						t.Fatal(err)
					}
					if now, _ := s.m.Array(arr); now.Members[slices.IndexFunc(now.Members, func(m MemberView) bool { return m.Drive == mb.Drive })].State != mb.State {
						t.Fatalf("seed %d: stale RebuildDone for %s/%s took effect", seed, arr, mb.Drive)
					}
				}
			}
			do("resync-all")
		case k < 15:
			do("suspect", n)
		case k < 16:
			do("unsuspect", n)
		case k < 17:
			// Refused and failed actions (issue 12): a node whose fences
			// fail for a while, an owner that refuses repairs, an owner
			// whose RAID reports the array failed.
			switch r.IntN(4) {
			case 0:
				do("fail-fences", n, fmt.Sprint("n=", 1+r.IntN(4)))
			case 1:
				do("refuse-repairs", arr, "injected")
			case 2:
				do("allow-repairs", arr)
			case 3:
				if a := s.m.arrays[arr]; a.phase == phaseActive && s.acting[arr][a.owner] {
					do("array-failed", arr, "injected")
				}
			}
		default:
			do("tick", fmt.Sprint(1+r.IntN(int(lease)+2)))
		}
		for _, av := range s.m.Arrays() {
			if av.Epoch < epochs[av.Name] {
				t.Fatalf("seed %d: array %s epoch went back from %d to %d", seed, av.Name, epochs[av.Name], av.Epoch)
			}
			epochs[av.Name] = av.Epoch
		}
		if len(s.violations) > 0 {
			t.Fatalf("seed %d: %v\n%s", seed, s.violations, log.String())
		}
	}
	// Repair everything and let the cluster converge.
	for _, n := range nodes {
		do("heal-fences", n)
	}
	for _, a := range s.m.arrayOrder {
		do("allow-repairs", a)
	}
	for _, n := range nodes {
		if s.dead[n] || s.partitioned[n] {
			do("return", n)
		}
		do("undrain", n)
		do("unsuspect", n)
	}
	for _, a := range s.m.Arrays() {
		for _, mb := range a.Members {
			if mb.State == MemberDriveFailed {
				do("replace-drive", mb.Drive)
			}
		}
	}
	for range 4 {
		do("tick", fmt.Sprint(lease))
		do("resync-all")
	}
	// Actions refused before the repair may be backing off still.
	do("tick", fmt.Sprint(DefaultBackoffMaxTicks+1))
	do("resync-all")
	do("tick", fmt.Sprint(lease))
	for _, a := range s.m.Arrays() {
		if a.State != StateOptimal || a.Owner != a.Home || a.Phase != "active" {
			t.Fatalf("seed %d: array %s did not converge: %+v\n%s", seed, a.Name, a, log.String())
		}
		if len(s.acting[a.Name]) != 1 || !s.acting[a.Name][a.Owner] {
			t.Fatalf("seed %d: array %s owner %s but served by %v\n%s", seed, a.Name, a.Owner, s.acting[a.Name], log.String())
		}
	}
	if len(s.violations) > 0 {
		t.Fatalf("seed %d: %v", seed, s.violations)
	}
	return log.String()
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
