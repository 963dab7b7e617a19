package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
)

// Fault kinds.
const (
	Kill      = "kill"      // kill -9 at Start, restart at Start+Len
	Freeze    = "freeze"    // SIGSTOP: no progress, its drives stall; SIGCONT at the end
	StoreCut  = "storecut"  // partitioned from the store (etcd)
	LinkCut   = "linkcut"   // every backend link to and from the node cut
	OneWay    = "oneway"    // the node's own backend commands fail; others reach its drives
	DriveFail = "drivefail" // the node's drive fails its commands
	// Power is a power cut of a drive node: kill -9, and its drive loses
	// every write not flushed or written FUA (each such block keeps its
	// old content or one of the versions written since, drawn by the
	// seed); power back and restart at Start+Len. At most one a schedule:
	// the frontend advertises a volatile write cache, so two drives that
	// lose their caches at once may lose writes the hosts never flushed
	// (RAID-5 rebuilds one member's lost cache from the others). Drawn
	// only with Options.Power (-sim.power): open findings remain,
	// docs/RELIABILITY.md known problem 8.
	Power = "power"
)

// kinds are drawn by default; allKinds are those a schedule may name.
var (
	kinds    = []string{Kill, Freeze, StoreCut, LinkCut, OneWay, DriveFail}
	allKinds = append(slices.Clone(kinds), Power)
)

// Fault is one fault of a schedule, in ticks.
type Fault struct {
	Kind       string
	Node       string
	Start, Len int
}

func (f Fault) String() string {
	return fmt.Sprintf("%s %s at %d for %d", f.Kind, f.Node, f.Start, f.Len)
}

// Schedule is a run's faults, ordered by start.
type Schedule []Fault

func (s Schedule) String() string {
	var b strings.Builder
	for _, f := range s {
		b.WriteString(f.String() + "\n")
	}
	return b.String()
}

// ParseSchedule reads Schedule.String's format: "KIND NODE at TICK for
// TICKS" per line.
func ParseSchedule(text string) (Schedule, error) {
	var s Schedule
	for i, line := range strings.Split(strings.TrimSpace(text), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		var f Fault
		if _, err := fmt.Sscanf(line, "%s %s at %d for %d", &f.Kind, &f.Node, &f.Start, &f.Len); err != nil {
			return nil, fmt.Errorf("schedule line %d %q: %v; expected \"KIND NODE at TICK for TICKS\"", i+1, line, err)
		}
		if !slices.Contains(allKinds, f.Kind) {
			return nil, fmt.Errorf("schedule line %d: fault kind %q; expected one of %s", i+1, f.Kind, strings.Join(allKinds, ", "))
		}
		if !slices.Contains(nodeNames, f.Node) {
			return nil, fmt.Errorf("schedule line %d: node %q; expected one of %s", i+1, f.Node, strings.Join(nodeNames, ", "))
		}
		if (f.Kind == DriveFail || f.Kind == Power) && f.Node < "C" {
			return nil, fmt.Errorf("schedule line %d: node %s has no drive; drive nodes are C, D, E", i+1, f.Node)
		}
		if f.Start < 1 || f.Len < 1 {
			return nil, fmt.Errorf("schedule line %d: start %d and length %d must be at least 1", i+1, f.Start, f.Len)
		}
		s = append(s, f)
	}
	sort.SliceStable(s, func(i, j int) bool { return s[i].Start < s[j].Start })
	return s, nil
}

// durations in ticks: below, around and above the lease TTL (10 ticks).
var durations = []int{2, 4, 6, 8, 9, 10, 11, 12, 14, 16, 20, 30}

// drawSchedule draws 1 to 3 faults, possibly overlapping, of kinds (or
// allKinds with power).
func drawSchedule(rng *rand.Rand, ticks int, power bool) Schedule {
	ks := kinds
	if power {
		ks = allKinds
	}
	var s Schedule
	for range 1 + rng.IntN(3) {
		f := Fault{Kind: ks[rng.IntN(len(ks))], Start: 3 + rng.IntN(max(1, ticks-10)), Len: durations[rng.IntN(len(durations))]}
		if f.Kind == Power && slices.ContainsFunc(s, func(g Fault) bool { return g.Kind == Power }) {
			f.Kind = Kill // one power cut a schedule (above)
		}
		if f.Kind == DriveFail || f.Kind == Power {
			f.Node = nodeNames[2+rng.IntN(3)]
		} else {
			f.Node = nodeNames[rng.IntN(len(nodeNames))]
		}
		s = append(s, f)
	}
	sort.SliceStable(s, func(i, j int) bool { return s[i].Start < s[j].Start })
	return s
}

// apply starts (on) or ends a fault.
func (w *world) apply(f Fault, on bool) {
	n := w.nodes[f.Node]
	w.note("fault %s: %s", map[bool]string{true: "starts", false: "ends"}[on], f)
	switch f.Kind {
	case Kill, Power:
		if on {
			if f.Kind == Power {
				w.fab.PowerCut(f.Node, int64(w.rng.Uint64()))
			}
			if n.dead {
				return
			}
			n.dead = true
			w.fab.Stall(f.Node, false) // a killed process's commands die with it
			w.storeCut(f.Node, true)
			w.fabricCut(f.Node, true)
			if n.lease != nil {
				n.lease.Abandon()
				n.lease = nil
			}
			n.sn.Stop()
			return
		}
		if !n.dead {
			return
		}
		w.storeCut(f.Node, false)
		w.fabricCut(f.Node, false)
		if err := w.boot(f.Node); err != nil {
			w.violate("restart of %s failed: %v", f.Node, err)
		}
	case Freeze:
		if on {
			n.frozen++
		} else {
			n.frozen--
		}
		// Its own commands wait; the others' commands to its drives fail
		// (they time out).
		w.fab.Stall(f.Node, n.frozen > 0 && !n.dead)
		w.inCut[f.Node] += map[bool]int{true: 1, false: -1}[on]
		w.relink()
	case StoreCut:
		w.storeCut(f.Node, on)
	case LinkCut:
		w.fabricCut(f.Node, on)
	case OneWay:
		w.oneWay[f.Node] += map[bool]int{true: 1, false: -1}[on]
		w.relink()
	case DriveFail:
		w.driveFail[f.Node] += map[bool]int{true: 1, false: -1}[on]
		w.fab.FailDrive(f.Node+"1", w.driveFail[f.Node] > 0)
	}
}

// storeCut partitions a node from the store while any fault wants it.
func (w *world) storeCut(name string, on bool) {
	w.stCut[name] += map[bool]int{true: 1, false: -1}[on]
	w.st.Partition(name, w.stCut[name] > 0)
}

// fabricCut isolates a node on the backend fabric while any fault wants it.
func (w *world) fabricCut(name string, on bool) {
	w.fabIso[name] += map[bool]int{true: 1, false: -1}[on]
	w.relink()
}

// relink sets every link from the faults in force: a link from one node
// to another is cut while either is isolated, while the first's own
// commands fail (one way), or while the second is frozen (commands to its
// drives time out).
func (w *world) relink() {
	for _, from := range nodeNames {
		for _, to := range nodeNames {
			if from != to {
				w.fab.Cut(from, to, w.fabIso[from] > 0 || w.fabIso[to] > 0 || w.oneWay[from] > 0 || w.inCut[to] > 0)
			}
		}
	}
}
