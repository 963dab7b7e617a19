package sim

import (
	"cmp"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/reliability/history"
)

var (
	flagSeeds  = flag.Int("sim.seeds", 0, "number of seeds TestSimSeeds runs (default 1000, 60 under -race, or $TIER0_SIM_SEEDS)")
	flagSeed   = flag.Uint64("sim.seed", 0, "run only this seed, with its timeline (replay of a failing seed)")
	flagFirst  = flag.Uint64("sim.first", 1, "first seed of TestSimSeeds")
	flagFaults = flag.String("sim.faults", "", "TestSimSeeds runs this schedule (\"KIND NODE at TICK for TICKS\" lines separated by ';') instead of drawn ones")
	flagLegacy = flag.Bool("sim.legacy", false, "TestSimSeeds with the pre-bd91d05 repair rule (issue 12 hole 1): expect failures")
	flagFor    = flag.Duration("sim.for", 0, "TestSimSeeds runs seeds from -sim.first until this much time has passed (a soak), instead of -sim.seeds")
	flagPower  = flag.Bool("sim.power", true, "TestSimSeeds draws power cuts of drive nodes too (docs/RELIABILITY.md known problem 8); -sim.power=false draws the kinds of before")
	flagTable  = flag.Bool("sim.table", false, "TestSimSeeds logs its runs, operations and failures per fault kind and per overlapping pair of kinds (docs/RELIABILITY.md's soak table)")
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
	return defaultSeeds
}

// defaultSeeds is TestSimSeeds' count without -sim.seeds or
// $TIER0_SIM_SEEDS: under the race detector a seed costs about ten times
// more, and make test runs the thousand seeds again without it.
var defaultSeeds = 1000

// Thousands of seeds of overlapping faults against the real action
// executor: none may break the reservation invariant, serve the array
// from two nodes at once, or give the workload a history that is not
// linearizable.
func TestSimSeeds(t *testing.T) {
	first, n := *flagFirst, seeds(t)
	if *flagSeed != 0 {
		first, n = *flagSeed, 1
	}
	faults := strings.ReplaceAll(*flagFaults, ";", "\n")
	var deadline time.Time
	if *flagFor > 0 && *flagSeed == 0 {
		deadline = time.Now().Add(*flagFor)
		n = math.MaxInt32
	}
	var (
		mu      sync.Mutex
		results []Result
		errs    []error
	)
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, err := Run(Options{Seed: first + uint64(i), Legacy: *flagLegacy, Faults: faults, Power: *flagPower})
				if r.OK() && *flagSeed == 0 {
					// A passing seed keeps only what the summary counts: a
					// soak runs tens of thousands, and their timelines and
					// histories would fill the memory.
					r = Result{Seed: r.Seed, Schedule: r.Schedule, Ops: r.Ops, History: history.Result{Linearizable: true}}
				}
				mu.Lock()
				results, errs = append(results, r), append(errs, err)
				if !deadline.IsZero() && len(results)%1000 == 0 {
					t.Logf("%d seeds run, %s left", len(results), time.Until(deadline).Round(time.Second))
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < n && (deadline.IsZero() || time.Now().Before(deadline)); i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	n = len(results)
	// Seeds finish out of order: report them in seed order.
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(results[a].Seed, results[b].Seed) })
	sorted, sortedErrs := make([]Result, n), make([]error, n)
	for i, j := range idx {
		sorted[i], sortedErrs[i] = results[j], errs[j]
	}
	results, errs = sorted, sortedErrs
	var tally Tally
	failed, ops := 0, 0
	var failedSeeds []uint64
	var unserved []string
	byKind := map[string]int{}
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("seed %d: %v", first+uint64(i), errs[i])
		}
		ops += r.Ops
		tally.Add(r)
		if r.Unserved {
			unserved = append(unserved, fmt.Sprintf("seed %d (%s)", r.Seed, strings.ReplaceAll(strings.TrimSpace(r.Schedule.String()), "\n", "; ")))
		}
		for _, f := range r.Schedule {
			byKind[f.Kind]++
		}
		if *flagSeed != 0 {
			t.Logf("%s", r.Report())
		}
		if !r.OK() {
			failed++
			failedSeeds = append(failedSeeds, r.Seed)
			if failed <= 3 {
				t.Errorf("%s", r.Report())
			}
		}
	}
	t.Logf("seeds %d-%d: faults %v, %d operations checked, %d seeds failed, %d left the array unserved after the faults ended", first, first+uint64(n)-1, byKind, ops, failed, len(unserved))
	if *flagTable {
		t.Logf("per fault kind and overlapping pair of kinds:\n%s", tally.Markdown())
	}
	for i, u := range unserved {
		if i == 5 {
			break
		}
		t.Logf("unserved: %s", u)
	}
	if failed > 0 {
		t.Errorf("%d of %d seeds failed: %v", failed, n, failedSeeds)
	}
}

// staleRepair is issue 12 hole 1 as a schedule: drive node C dies and
// returns while owner A is frozen, so the coordinator's resync of C1 waits
// in A's queue; A's lease expires, B takes the array over under a newer
// epoch and fences C1; A thaws and runs the queued resync.
const staleRepair = "kill C at 5 for 12\nfreeze A at 16 for 30"

// The simulation finds hole 1 on the rule before its fix (bd91d05's
// parent: a repair under the array's old epoch, a fence that preempts any
// other key), and nothing with the fix. Whether the thawed node runs its
// queued task before its lease watchdog is the seed's draw; seed 2 has
// the task first.
func TestSimFindsStaleRepair(t *testing.T) {
	var found []uint64
	for seed := uint64(1); seed <= 6; seed++ {
		r, err := Run(Options{Seed: seed, Faults: staleRepair, Legacy: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range r.Violations {
			if strings.Contains(v, "member C1: node A took the reservation under key") {
				found = append(found, seed)
				if seed == 2 {
					t.Logf("seed 2 with the old rule: %s", v)
				}
				break
			}
		}
		r, err = Run(Options{Seed: seed, Faults: staleRepair})
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK() {
			t.Errorf("seed %d with the fix:\n%s", seed, r.Report())
		}
	}
	if !slices.Contains(found, 2) {
		t.Errorf("with the old repair rule the stale owner's re-fence was found by seeds %v of 1-6, not by seed 2", found)
	}
}

// A seed replays: the same schedule, the same timeline of tasks, reports
// and workload operations.
//
// A run whose RAID background work outlasted the simulation's real-time
// bound (a machine under heavy load; the timeline says so) is not under
// the seed there: such a pair is run again, three times at most.
func TestSimSeedReplays(t *testing.T) {
	var a, b Result
	for attempt := 1; ; attempt++ {
		var err error
		if a, err = Run(Options{Seed: 7}); err != nil {
			t.Fatal(err)
		}
		if b, err = Run(Options{Seed: 7}); err != nil {
			t.Fatal(err)
		}
		if !slowTasks(a) && !slowTasks(b) {
			break
		}
		if attempt == 3 {
			t.Fatalf("seed 7: three pairs of runs each had a RAID task outlast the %s bound: the machine is too loaded to check the replay", quiesceBound)
		}
	}
	if a.Schedule.String() != b.Schedule.String() {
		t.Fatalf("seed 7 drew two schedules:\n%s\n%s", a.Schedule, b.Schedule)
	}
	for i := range max(len(a.Timeline), len(b.Timeline)) {
		if i >= len(a.Timeline) || i >= len(b.Timeline) || a.Timeline[i] != b.Timeline[i] {
			t.Fatalf("seed 7 did not replay: the timelines differ at line %d of %d/%d:\n%s\n%s", i, len(a.Timeline), len(b.Timeline), line(a.Timeline, i), line(b.Timeline, i))
		}
	}
	p, err := ParseSchedule(a.Schedule.String())
	if err != nil || p.String() != a.Schedule.String() {
		t.Fatalf("schedule does not read back: %v\n%s\n%s", err, a.Schedule, p)
	}
}

func line(l []string, i int) string {
	if i < len(l) {
		return l[i]
	}
	return "(end)"
}

// slowTasks reports whether a run's timeline notes a background task that
// outlasted the quiesce bound.
func slowTasks(r Result) bool {
	for _, l := range r.Timeline {
		if strings.Contains(l, "background tasks still running") {
			return true
		}
	}
	return false
}

// The seeds of the hour's soak that left the array unserved after the
// faults ended (docs/RELIABILITY.md known problem 7). Four of them: the
// owner's array failed while the store was cut, its "array-failed" report
// was lost with the cut, and the machine, still believing it served, never
// ordered the fence and assembly that would have brought it back (fixed by
// the node's report outbox). Seed 117044: the owner re-assembled the
// failed array itself when its members answered again and said so, and
// the machine, waiting for a member's node to return, ignored it. Each
// must end served, with nothing else found. (The schedules are the soak's,
// given explicitly: the kinds drawn since include power cuts.)
func TestSimSoakUnservedSeeds(t *testing.T) {
	for seed, faults := range map[uint64]string{
		121576: "storecut A at 50 for 6\noneway A at 51 for 4",
		108560: "kill B at 6 for 8\nstorecut A at 21 for 4\nlinkcut A at 24 for 16",
		127209: "storecut A at 46 for 6\nlinkcut A at 47 for 8",
		148192: "drivefail C at 38 for 12\nstorecut A at 43 for 4\noneway A at 45 for 2",
		117044: "freeze E at 17 for 20\nlinkcut D at 18 for 30\nkill B at 36 for 6",
	} {
		r, err := Run(Options{Seed: seed, Faults: faults})
		if err != nil {
			t.Fatal(err)
		}
		if slowTasks(r) {
			t.Logf("seed %d: a RAID task outlasted the real-time bound (machine loaded); not under the seed", seed)
			continue
		}
		if !r.OK() {
			t.Errorf("seed %d (%s):\n%s", seed, strings.ReplaceAll(r.Schedule.String(), "\n", "; "), r.Report())
		}
	}
}

// Known problem 9's unserved seeds (power cuts drawn): the owner A is cut
// off on the backend while drive nodes go away, so the array fails on A
// and each of the coordinator's re-assemblies (a fence under a new epoch)
// fails too; its backoff then outlasts the cut. A member cut off on the
// backend alone brings no NodeReturned, so only the owner's own retry
// (daemon/node retryFailed) can end the failure once the members answer:
// a failed fence of a failed array must leave it failed under the epoch
// the fence claimed, not stopped. Before, each ended `final read: no node
// serves the array after the faults ended`.
func TestSimSoakUnservedPowerSeeds(t *testing.T) {
	for seed, faults := range map[uint64]string{
		111304: "linkcut A at 22 for 30\npower C at 28 for 12\nkill E at 30 for 20",
		142546: "oneway A at 3 for 30\npower D at 9 for 14\nlinkcut A at 46 for 14",
		167673: "oneway A at 34 for 30\nfreeze C at 47 for 9\npower E at 51 for 10",
	} {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { powerSeed(t, seed, faults) })
	}
}

// Session 14's soak (seeds 9100000-9204036, power cuts drawn): four
// seeds left the array unserved after the faults ended, each the same way
// (docs/RELIABILITY.md known problem 10). The array fails back to its
// home A: B releases it, A fences and assembles it, and A's store is cut
// just as the coordinator's optimized ANA order reaches it. A could not
// confirm its ownership in the store and dropped the order; the
// coordinator had seen the array assembled and never ordered it again, so
// A ran the array behind inaccessible paths for good. Before the fix each
// ended `final read: no node serves the array after the faults ended`.
func TestSimOptimizedOrderDuringStoreCut(t *testing.T) {
	for seed, faults := range map[uint64]string{
		9104662: "power C at 12 for 4\nkill A at 23 for 12\nstorecut A at 36 for 2",
		9143537: "storecut A at 14 for 10\nkill E at 21 for 2\nstorecut A at 25 for 6",
		9160812: "linkcut A at 27 for 6\nkill A at 28 for 12\nstorecut A at 41 for 4",
		9175546: "kill D at 5 for 14\nstorecut A at 9 for 30\nstorecut A at 40 for 4",
	} {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) { powerSeed(t, seed, faults) })
	}
}

// A member cut off for a moment and taken back (ReAdd of the same device)
// catches up the stripes written while it was away, and also those it held
// unflushed when it left: its node's power cut lost its volatile cache.
// Seed 965 with power cuts drawn cuts D's power for 1 s, then fails E's
// drive: E's chunks are reconstructed from D, which must not hold an
// older block (docs/RELIABILITY.md known problem 8).
func TestSimPowerCutOfAReturnedMember(t *testing.T) {
	powerSeed(t, 965, "power D at 38 for 2\ndrivefail E at 42 for 30\nkill A at 49 for 10")
}

// Two drive nodes out at once, one losing its cache: E dies, the array
// runs on C and D alone, then C's power is cut. The writes acknowledged
// meanwhile were in C's cache only; with no redundancy left the array now
// makes each write durable before its ack (docs/RAID.md "Durability").
func TestSimPowerCutWhileDegraded(t *testing.T) {
	powerSeed(t, 166, "kill E at 17 for 30\npower C at 26 for 4\nlinkcut B at 42 for 20")
}

// A cache lost while the array had failed on every member: E's power cut
// and C's link cut at once fail the array (C missing first); the owner
// re-assembles from C and D, then takes E back. E's node restarted, so
// it may have lost writes it held unflushed when it left: it catches up
// the bitmap's dirty regions rather than only this run's writes
// (daemon/raid incarnation.go). Before, C was rebuilt from E's old blocks.
func TestSimPowerCutWhileArrayFailed(t *testing.T) {
	powerSeed(t, 899, "kill C at 12 for 8\npower E at 39 for 12\nlinkcut C at 39 for 2")
}

// powerSeed runs seed with power cuts drawn, checks that it draws faults,
// and fails on any finding.
func powerSeed(t *testing.T, seed uint64, faults string) {
	t.Helper()
	var r Result
	for attempt := 1; ; attempt++ {
		var err error
		if r, err = Run(Options{Seed: seed, Power: true}); err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(r.Schedule.String()) != faults {
			t.Fatalf("seed %d with power cuts drew\n%s\nwant\n%s", seed, r.Schedule, faults)
		}
		if !slowTasks(r) {
			break
		}
		if attempt == 3 {
			t.Fatalf("three runs each had a RAID task outlast the %s bound: the machine is too loaded to run the seed", quiesceBound)
		}
	}
	if !r.OK() {
		t.Fatalf("%s", r.Report())
	}
}

// Owner A's backend cut fails the array with no superblock written; A
// re-assembles it without D1 (cut off in turn), whose log held entries
// of the first run under sequence numbers A then issues again; A dies
// and B's assembly takes D1 back under a resync. Its replay merged D1's
// old entry (another stripe's partial parity) into E1's new one of the
// same number and wrote wrong parity: D1's resync put unit 8's block at
// unit 4 (`corrupt unit 4: a block written for another device or unit`,
// docs/RELIABILITY.md known problem 9; daemon/raid
// TestStaleLogOfMemberTakenBackAtAssembly). Which copy the replay read
// first is the engine's parallel member I/O, not the seed's: on the
// parent about half the runs failed, so it runs five times.
func TestSimStaleLogOfReturnedMember(t *testing.T) {
	const faults = "linkcut A at 15 for 9\nlinkcut D at 31 for 12\nkill A at 36 for 30"
	for run := 1; run <= 5; run++ {
		r, err := Run(Options{Seed: 133638, Power: true})
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(r.Schedule.String()) != faults {
			t.Fatalf("seed 133638 drew\n%s\nwant\n%s", r.Schedule, faults)
		}
		if !r.OK() {
			t.Fatalf("run %d:\n%s", run, r.Report())
		}
	}
}

// Known problem 11: a drive failed by its errors is reported to the
// coordinator, which holds it failed until it is replaced. Three drives
// fail in turn, each for a while: E (reported), then D while E is out
// (the array fails with D, which is as current as C), then C. The owner
// must not take E back at a re-assembly (it is rejected as stale there,
// and was re-added under a resync): the engine then ran E in sync while
// the coordinator held it failed, so C's failure counted as a second
// loss and no node served the array for good. With E left out, the array
// serves from C and D once C's drive answers again.
func TestSimDriveHeldFailedLeftOutAtAssembly(t *testing.T) {
	powerSeed(t, 502924, "drivefail E at 24 for 6\ndrivefail D at 27 for 8\ndrivefail C at 37 for 12")
}
