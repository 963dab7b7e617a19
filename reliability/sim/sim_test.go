package sim

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

var (
	flagSeeds = flag.Int("sim.seeds", 0, "number of seeds TestSimSeeds runs (default 1000, or $TIER0_SIM_SEEDS)")
	flagSeed  = flag.Uint64("sim.seed", 0, "run only this seed, with its timeline (replay of a failing seed)")
	flagFirst = flag.Uint64("sim.first", 1, "first seed of TestSimSeeds")
)

func seeds(t *testing.T) int {
	if *flagSeeds > 0 {
		return *flagSeeds
	}
	if v := os.Getenv("TIER0_SIM_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("TIER0_SIM_SEEDS=%q: expected a positive number of seeds", v)
		}
		return n
	}
	return 1000
}

// Thousands of seeds of overlapping faults against the real action
// executor: none may break the reservation invariant, serve the array
// from two nodes at once, or give the workload a history that is not
// linearizable.
func TestSimSeeds(t *testing.T) {
	first, n := *flagFirst, seeds(t)
	if *flagSeed != 0 {
		first, n = *flagSeed, 1
	}
	failed := 0
	for seed := first; seed < first+uint64(n); seed++ {
		r, err := Run(Options{Seed: seed})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if *flagSeed != 0 {
			t.Logf("%s", r.Report())
		}
		if !r.OK() {
			failed++
			if failed <= 3 {
				t.Errorf("%s", r.Report())
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d seeds failed", failed, n)
	}
}
