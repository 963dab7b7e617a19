package cluster

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"tier0/daemon/config"
)

// sim drives a Machine the way a cluster of daemons would: live nodes
// heartbeat every tick, actions are performed by their nodes and their
// outcome is fed back. A dead node performs nothing. A partitioned node
// fences itself (a local decision) and finds the intents queued for it when
// it reconnects: if its lease survived it performs them late, in order;
// if not, it registers anew and discards them. Ownership claims go through
// a model of the store's compare-and-swap, and a node turns a namespace
// optimized only if the store still records it as owner at that epoch. The
// sim tracks which nodes actually serve each array and records every
// violation of the safety invariants.
type sim struct {
	m           *Machine
	dead        map[string]bool
	partitioned map[string]bool
	acting      map[string]map[string]bool // array -> nodes serving it optimized
	maxEpoch    map[string]uint64
	failFence   map[string]bool
	nodeFails   map[string]int      // node -> fences it still fails (-1: all of them)
	refuse      map[string]string   // array -> reason its owner refuses every repair with
	acts        []timed             // every action, with the tick it was decided at
	backlog     map[string][]Action // intents queued for a cut-off node
	store       map[string]claim    // array -> the store's ownership record
	repairs     map[string]uint64   // "array/member" -> epoch of the latest Resync/Rebuild
	rack        map[string]string
	violations  []string
	quiet       bool
	counts      map[string]int
	out         *strings.Builder
}

func newSim(cfg Config) (*sim, error) {
	m, err := New(cfg, nil)
	if err != nil {
		return nil, err
	}
	return &sim{
		m: m, dead: map[string]bool{}, partitioned: map[string]bool{},
		acting: map[string]map[string]bool{}, maxEpoch: map[string]uint64{},
		failFence: map[string]bool{}, nodeFails: map[string]int{}, refuse: map[string]string{}, backlog: map[string][]Action{}, store: map[string]claim{}, repairs: map[string]uint64{}, rack: map[string]string{}, counts: map[string]int{},
		out: &strings.Builder{},
	}, nil
}

func (s *sim) violate(format string, args ...any) {
	v := fmt.Sprintf("t=%d VIOLATION: ", s.m.Now()) + fmt.Sprintf(format, args...)
	s.violations = append(s.violations, v)
	fmt.Fprintln(s.out, v)
}

func (s *sim) reachable(n string) bool { return !s.dead[n] && !s.partitioned[n] }

// step feeds one event and performs the resulting actions to quiescence.
func (s *sim) step(ev Event) error {
	if err := s.m.Step(ev); err != nil {
		return err
	}
	s.drain()
	return nil
}

func (s *sim) tick(n int) {
	for range n {
		for _, id := range s.m.nodeOrder {
			if s.reachable(id) {
				if err := s.m.Step(Heartbeat{Node: id}); err != nil {
					panic(err)
				}
			}
		}
		s.drain()
		s.m.Tick()
		s.drain()
	}
}

func (s *sim) otherActing(array, node string) []string {
	var o []string
	for n := range s.acting[array] {
		if n != node {
			o = append(o, n)
		}
	}
	sort.Strings(o)
	return o
}

// timed is an action and the tick it came out of Ready.
type timed struct {
	tick int64
	act  Action
}

type claim struct {
	node  string
	epoch uint64
}

func (s *sim) drain() {
	for {
		acts := s.m.Ready()
		if len(acts) == 0 {
			return
		}
		var replies []Event
		for _, a := range acts {
			s.acts = append(s.acts, timed{s.m.Now(), a})
			kind, _, _ := strings.Cut(a.String(), " ")
			s.counts[kind]++
			switch r := a.(type) {
			case Resync: // queued intents are performed eventually
				s.repairs[r.Array+"/"+r.Member] = r.Epoch
			case Rebuild:
				s.repairs[r.Array+"/"+r.Member] = r.Epoch
			case Fence:
				if r.NewEpoch <= s.maxEpoch[r.Array] {
					s.violate("array %s epoch %d not above %d", r.Array, r.NewEpoch, s.maxEpoch[r.Array])
				}
				s.maxEpoch[r.Array] = r.NewEpoch
			}
			p := a.Performer()
			_, self := a.(SelfFence)
			note := ""
			if p != "" && s.dead[p] {
				note = " [not performed: " + p + " is dead]"
			} else if !self && p != "" && s.partitioned[p] {
				note = " [queued: " + p + " is cut off]"
				s.backlog[p] = append(s.backlog[p], a)
			}
			if !s.quiet {
				fmt.Fprintf(s.out, "t=%d %s%s\n", s.m.Now(), a, note)
			}
			if note == "" {
				replies = append(replies, s.perform(a)...)
			}
		}
		for _, ev := range replies {
			if err := s.m.Step(ev); err != nil {
				panic(err)
			}
		}
	}
}

// perform carries out one action as its performer would and returns the
// reports it sends.
func (s *sim) perform(a Action) []Event {
	switch a := a.(type) {
	case Fence:
		if k := s.nodeFails[a.Node]; k != 0 { // the node lost its lease, its store calls time out
			if k > 0 {
				s.nodeFails[a.Node] = k - 1
			}
			return []Event{FenceFailed{Array: a.Array, Node: a.Node, Epoch: a.NewEpoch, Reason: "this node has lost its lease"}}
		}
		cur := s.store[a.Array]
		if cur.epoch >= a.NewEpoch && cur != (claim{a.Node, a.NewEpoch}) {
			return []Event{OwnershipLost{Array: a.Array, Node: a.Node, Epoch: a.NewEpoch, Winner: cur.node, WinnerEpoch: cur.epoch}}
		}
		if s.failFence[a.Array] {
			delete(s.failFence, a.Array)
			return []Event{FenceFailed{Array: a.Array, Node: a.Node, Epoch: a.NewEpoch, Reason: "injected"}}
		}
		s.store[a.Array] = claim{a.Node, a.NewEpoch}
		if o := s.otherActing(a.Array, a.Node); len(o) > 0 {
			s.violate("array %s fenced by %s while %v still serves it", a.Array, a.Node, o)
		}
		return []Event{FenceDone{Array: a.Array, Node: a.Node, Epoch: a.NewEpoch}}
	case Assemble:
		return []Event{ArrayAssembled{Array: a.Array, Node: a.Node, Epoch: a.Epoch}}
	case SetANA:
		if a.State != ANAOptimized {
			delete(s.acting[a.Array], a.Node)
			return nil
		}
		if s.store[a.Array] != (claim{a.Node, a.Epoch}) {
			return nil // a stale intent: the performer drops it
		}
		if o := s.otherActing(a.Array, a.Node); len(o) > 0 {
			s.violate("array %s optimized on %s while %v still serves it", a.Array, a.Node, o)
		}
		if s.acting[a.Array] == nil {
			s.acting[a.Array] = map[string]bool{}
		}
		s.acting[a.Array][a.Node] = true
	case Resync:
		if r := s.refuse[a.Array]; r != "" {
			return []Event{RepairFailed{Array: a.Array, Member: a.Member, Epoch: a.Epoch, Reason: r}}
		}
	case Rebuild:
		if r := s.refuse[a.Array]; r != "" {
			return []Event{RepairFailed{Array: a.Array, Member: a.Member, Epoch: a.Epoch, Reason: r}}
		}
	case Release:
		delete(s.acting[a.Array], a.Node)
		return []Event{Released{Array: a.Array, Node: a.Node, Epoch: a.Epoch}}
	case SelfFence:
		s.stopActing(a.Node)
	}
	return nil
}

func (s *sim) stopActing(node string) {
	for _, set := range s.acting {
		delete(set, node)
	}
}

func (s *sim) kill(n string) {
	s.dead[n] = true
	s.stopActing(n)
}

// revive restarts a dead node (a fresh daemon registers: NodeReturned) or
// reconnects a partitioned one. A reconnecting node whose lease expired
// meanwhile registers anew and discards its queued intents; one whose
// lease survived renews it (Heartbeat) and performs them, late, in order.
func (s *sim) revive(n string) error {
	var ev Event = Heartbeat{Node: n}
	if s.dead[n] {
		ev = NodeReturned{Node: n}
	}
	wasCutOff := s.partitioned[n] && !s.dead[n]
	delete(s.dead, n)
	delete(s.partitioned, n)
	backlog := s.backlog[n]
	delete(s.backlog, n)
	if wasCutOff && s.m.nodes[n].state != NodeDown {
		var replies []Event
		for _, a := range backlog {
			if !s.quiet {
				fmt.Fprintf(s.out, "t=%d late %s\n", s.m.Now(), a)
			}
			replies = append(replies, s.perform(a)...)
		}
		for _, r := range replies {
			if err := s.m.Step(r); err != nil {
				return err
			}
		}
		s.drain()
	}
	return s.step(ev)
}

// checkOwners verifies, at any instant, that no array has two nodes serving
// it and that the machine's owner is one of the nodes actually serving it
// when the array is active.
func (s *sim) checkOwners() {
	for _, name := range s.m.arrayOrder {
		if len(s.acting[name]) > 1 {
			s.violate("array %s served by %v", name, slices.Sorted(maps.Keys(s.acting[name])))
		}
	}
}

func (s *sim) status() string {
	var b strings.Builder
	for _, n := range s.m.Nodes() {
		flags := ""
		if n.Draining {
			flags += " draining"
		}
		if s.dead[n.Name] {
			flags += " (dead)"
		}
		if s.partitioned[n.Name] {
			flags += " (partitioned)"
		}
		fmt.Fprintf(&b, "node %s %s owns=%s%s\n", n.Name, n.State, dash(strings.Join(n.Owns, ",")), flags)
	}
	for _, a := range s.m.Arrays() {
		var ms []string
		for _, mb := range a.Members {
			st := string(mb.State)
			if mb.State == MemberRebuilding || mb.State == MemberResyncing {
				st += fmt.Sprintf("(%d%%)", mb.Progress)
			}
			ms = append(ms, mb.Drive+":"+st)
		}
		fmt.Fprintf(&b, "array %s %s home=%s owner=%s epoch=%d %s %s\n", a.Name, a.Level, a.Home, dash(a.Owner), a.Epoch, a.State, strings.Join(ms, " "))
	}
	return strings.TrimRight(b.String(), "\n")
}

func (s *sim) summary() string {
	states := map[ArrayState]int{}
	owned := map[string]int{}
	var unreadable []string
	worst := 0
	for _, a := range s.m.Arrays() {
		lost := 0
		for _, mb := range a.Members {
			if mb.State != MemberOK {
				lost++
			}
		}
		worst = max(worst, lost)
		states[a.State]++
		if a.Owner != "" {
			owned[a.Owner]++
		}
		if a.State == StateFailed {
			unreadable = append(unreadable, a.Name)
		}
	}
	var b strings.Builder
	b.WriteString("arrays:")
	for _, st := range []ArrayState{StateOptimal, StateDegraded, StateRebuilding, StateOffline, StateFailed} {
		fmt.Fprintf(&b, " %s=%d", st, states[st])
	}
	maxOwned, up := 0, 0
	for _, n := range s.m.Nodes() {
		maxOwned = max(maxOwned, owned[n.Name])
		if n.State == NodeUp {
			up++
		}
	}
	fmt.Fprintf(&b, "\nnodes up=%d max-owned=%d", up, maxOwned)
	fmt.Fprintf(&b, "\nmost members lost by one array: %d", worst)
	fmt.Fprintf(&b, "\nunreadable: %s", dash(strings.Join(unreadable, ",")))
	return b.String()
}

func (s *sim) flushCounts() {
	if len(s.counts) == 0 {
		return
	}
	keys := slices.Sorted(maps.Keys(s.counts))
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, s.counts[k]))
	}
	fmt.Fprintf(s.out, "actions: %s\n", strings.Join(parts, " "))
	clear(s.counts)
}

// genCluster builds nodes n00.. in racks r0.. (contiguous blocks) and one
// array per node.
func (s *sim) genCluster(nNodes, nRacks, nDrives, width int, level Level, domains string) error {
	req := config.PlaceRequest{Domains: domains}
	for i := range nNodes {
		name := fmt.Sprintf("n%02d", i)
		pn := config.PlaceNode{Name: name, Domain: fmt.Sprintf("r%d", i*nRacks/nNodes)}
		for d := range nDrives {
			pn.Drives = append(pn.Drives, fmt.Sprintf("%s-d%d", name, d))
		}
		req.Nodes = append(req.Nodes, pn)
		req.Arrays = append(req.Arrays, config.PlaceArray{Name: fmt.Sprintf("a%02d", i), Home: name, Width: width, Parity: level.Parity()})
		s.rack[name] = pn.Domain
		if err := s.m.Step(NodeJoined{Node: name, Domain: pn.Domain, Drives: pn.Drives}); err != nil {
			return err
		}
	}
	placed, err := config.Place(req)
	if err != nil {
		return err
	}
	for i, drives := range placed {
		var ms []MemberSpec
		for _, d := range drives {
			ms = append(ms, MemberSpec{Drive: d})
		}
		if err := s.m.Step(ArrayDefined{Name: req.Arrays[i].Name, Level: level, Home: req.Arrays[i].Home, Members: ms}); err != nil {
			return err
		}
	}
	s.drain()
	return nil
}
