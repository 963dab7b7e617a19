package nemesis

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Fault kinds.
const (
	Kill         = "kill"          // kill -9 a node; restart it when the fault ends
	Freeze       = "freeze"        // SIGSTOP a node for below, around or above the lease TTL; SIGCONT
	RestartStorm = "restart-storm" // kill -9 and restart a node again and again
	PowerLoss    = "power-loss"    // kill -9 with the node's unflushed drive writes lost; restart
	Latency      = "latency"       // added latency and jitter on a link
	Bandwidth    = "bandwidth"     // a bandwidth cap on a link
	Stall        = "stall"         // a link's data vanishes both ways, no RST
	Reset        = "reset"         // a link's connections are reset (RST), new ones too
	OneWay       = "one-way"       // one direction of a link stalls
	Partition    = "partition"     // every link into a node stalls; its outbound links work
	SlowDisk     = "slow-disk"     // every request to one of a node's drives waits 0.5-3 s
	DiskError    = "disk-error"    // every request to one of a node's drives fails (media error)
	Drain        = "drain"         // drain a node through the API; undrain when the fault ends
	FailDrive    = "fail-drive"    // fail a member drive through the API; replace it when the fault ends
)

// AllKinds lists every kind, the default of --nemesis all.
var AllKinds = []string{Kill, Freeze, RestartStorm, PowerLoss, SlowDisk, DiskError, Latency, Bandwidth, Stall, Reset, OneWay, Partition, Drain, FailDrive}

// disruptive kinds take their node out (or part of it); they count against
// the parity and quorum budget.
var disruptive = map[string]bool{Kill: true, Freeze: true, RestartStorm: true, PowerLoss: true, Stall: true, Reset: true, OneWay: true, Partition: true, Drain: true, FailDrive: true, SlowDisk: true, DiskError: true}

// linkKinds act on one link.
var linkKinds = map[string]bool{Latency: true, Bandwidth: true, Stall: true, Reset: true, OneWay: true}

// Link classes; a link is class:node (the proxy in front of that node's
// listener: every connection to it, from any peer or the host).
const (
	LinkFrontend = "frontend" // host -> node's frontend
	LinkBackend  = "backend"  // owners -> node's drives
	LinkEtcd     = "etcd"     // everyone -> node's etcd member (client and peer ports)
)

// ParseKinds parses a comma list ("all" for every kind).
func ParseKinds(s string) ([]string, error) {
	if s == "" || s == "all" {
		return slices.Clone(AllKinds), nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		switch {
		case k == "process":
			out = append(out, Kill, Freeze, RestartStorm)
		case k == "network":
			out = append(out, Latency, Bandwidth, Stall, Reset, OneWay, Partition)
		case k == "disk":
			out = append(out, PowerLoss, SlowDisk, DiskError)
		case k == "ops":
			out = append(out, Drain, FailDrive)
		case slices.Contains(AllKinds, k):
			out = append(out, k)
		default:
			return nil, fmt.Errorf("nemesis kind %q unknown; expected all, process, network, disk, ops or a comma list of %s", k, strings.Join(AllKinds, ", "))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Fault is one fault of a schedule.
type Fault struct {
	Kind string `json:"kind"`
	// Node is the node hit (for link faults, the node whose listener the
	// link leads to); Link the link class for link faults.
	Node string `json:"node"`
	Link string `json:"link,omitempty"`
	// Start and Dur are from the start of the window.
	Start time.Duration `json:"start_ns"`
	Dur   time.Duration `json:"dur_ns"`
	// Param is the kind's setting: latency/jitter in ms, bandwidth in
	// KB/s, the stalled direction, the freeze class; Detail says it in
	// words.
	Param  []int64 `json:"param,omitempty"`
	Detail string  `json:"detail"`
}

// End is when the fault is healed, from the start of the window.
func (f Fault) End() time.Duration { return f.Start + f.Dur }

func (f Fault) String() string {
	where := f.Node
	if f.Link != "" {
		where = f.Link + ":" + f.Node
	}
	return fmt.Sprintf("%-13s %-11s +%5.1fs for %5.1fs  %s", f.Kind, where, f.Start.Seconds(), f.Dur.Seconds(), f.Detail)
}

// Schedule is one run's faults.
type Schedule struct {
	Seed   uint64        `json:"seed"`
	Window time.Duration `json:"window_ns"`
	Faults []Fault       `json:"faults"`
}

func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "schedule seed %d, window %.0fs, %d faults:\n", s.Seed, s.Window.Seconds(), len(s.Faults))
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	return b.String()
}

// Site is what Generate needs to know of the cluster.
type Site struct {
	Nodes     []string
	EtcdPeers []string
	// Parity is the smallest parity among the arrays (1 RAID-5, 2 RAID-6).
	Parity   int
	LeaseTTL time.Duration
	// Drives maps node -> its drive names (for fail-drive).
	Drives map[string][]string
}

// Generate draws the schedule of seed: 1–3 faults of the given kinds
// starting in the first half of window, each healed by its end.
func Generate(seed uint64, kinds []string, site Site, window time.Duration) Schedule {
	rng := rand.New(rand.NewPCG(seed, 0x6e656d65736973))
	s := Schedule{Seed: seed, Window: window}
	if len(kinds) == 0 || len(site.Nodes) == 0 {
		return s
	}
	budget := max(1, site.Parity)
	quorum := (len(site.EtcdPeers) - 1) / 2
	var victims []string
	n := 1 + rng.IntN(3)
	for range n {
		k := kinds[rng.IntN(len(kinds))]
		var node string
		if disruptive[k] {
			// Reuse a victim, or add one within the budgets.
			var fresh []string
			peers := 0
			for _, v := range victims {
				if slices.Contains(site.EtcdPeers, v) {
					peers++
				}
			}
			for _, c := range site.Nodes {
				if slices.Contains(victims, c) {
					continue
				}
				if slices.Contains(site.EtcdPeers, c) && peers >= quorum {
					continue
				}
				fresh = append(fresh, c)
			}
			if len(victims) > 0 && (len(victims) >= budget || len(fresh) == 0 || rng.IntN(2) == 0) {
				node = victims[rng.IntN(len(victims))]
			} else if len(fresh) > 0 {
				node = fresh[rng.IntN(len(fresh))]
				victims = append(victims, node)
			} else {
				continue
			}
		} else {
			node = site.Nodes[rng.IntN(len(site.Nodes))]
		}
		f := Fault{Kind: k, Node: node}
		f.Start = time.Duration(rng.Int64N(int64(window / 2)))
		rest := window - f.Start
		f.Dur = min(rest, time.Duration(float64(window/4)*(0.5+rng.Float64())))
		ttl := site.LeaseTTL
		if linkKinds[k] {
			links := []string{LinkFrontend, LinkBackend}
			if slices.Contains(site.EtcdPeers, node) {
				links = append(links, LinkEtcd)
			}
			f.Link = links[rng.IntN(len(links))]
		}
		switch k {
		case Freeze:
			// Below, around or above the lease TTL.
			class := rng.IntN(3)
			mult := []float64{0.5 + 0.3*rng.Float64(), 0.9 + 0.3*rng.Float64(), 2 + 2*rng.Float64()}[class]
			f.Dur = min(rest, time.Duration(float64(ttl)*mult))
			f.Param = []int64{int64(class)}
			f.Detail = fmt.Sprintf("SIGSTOP %.1fs (%s the %v lease TTL), SIGCONT", f.Dur.Seconds(), []string{"below", "around", "above"}[class], ttl)
		case Kill:
			f.Detail = "kill -9, restart at the end"
		case PowerLoss:
			f.Detail = "power loss: kill -9, unflushed drive writes lost, restart at the end"
		case RestartStorm:
			every := time.Duration(500+rng.IntN(1500)) * time.Millisecond
			f.Param = []int64{every.Milliseconds()}
			f.Detail = fmt.Sprintf("kill -9 and restart every %.1fs", every.Seconds())
		case Latency:
			lat, jit := 20+rng.Int64N(480), rng.Int64N(200)
			f.Param = []int64{lat, jit}
			f.Detail = fmt.Sprintf("latency %dms ± %dms both ways", lat, jit)
		case Bandwidth:
			kbs := 64 + rng.Int64N(4000)
			f.Param = []int64{kbs}
			f.Detail = fmt.Sprintf("bandwidth %d KB/s both ways", kbs)
		case Stall:
			f.Detail = "data vanishes both ways (no RST); connections closed at the heal"
		case Reset:
			f.Detail = "connections reset (RST), new ones too"
		case OneWay:
			dir := rng.Int64N(2)
			f.Param = []int64{dir}
			f.Detail = []string{"requests to the node vanish, replies flow", "replies from the node vanish, requests flow"}[dir]
		case Partition:
			f.Detail = "asymmetric partition: every link into the node stalls, its own connections out work"
		case Drain:
			f.Detail = "drain through the API (its arrays move away), undrain at the end (failback)"
		case FailDrive, SlowDisk, DiskError:
			ds := site.Drives[node]
			if len(ds) == 0 {
				continue
			}
			i := rng.IntN(len(ds))
			f.Param = []int64{int64(i)}
			switch k {
			case FailDrive:
				f.Detail = "fail drive " + ds[i] + " through the API, replace it at the end (rebuild)"
			case SlowDisk:
				ms := 500 + rng.Int64N(2500)
				f.Param = append(f.Param, ms)
				f.Detail = fmt.Sprintf("every request to drive %s waits %dms; replaced at the end if its member failed", ds[i], ms)
			case DiskError:
				f.Detail = "every request to drive " + ds[i] + " fails (media error); replaced at the end if its member failed"
			}
		}
		s.Faults = append(s.Faults, f)
	}
	slices.SortStableFunc(s.Faults, func(a, b Fault) int { return int(a.Start - b.Start) })
	return s
}
