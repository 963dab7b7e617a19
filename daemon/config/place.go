package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

type nodeState struct {
	name   string
	idx    int
	domain string
	drives []string
	used   []int // arrays served by each drive
}

// ErrPlacement is wrapped by Place's errors: the request cannot be met.
var ErrPlacement = errors.New("placement impossible")

// PlaceNode is a node as Place sees it.
type PlaceNode struct {
	Name   string
	Domain string   // failure domain; only used when Domains is not "none"
	Drives []string // drive names, in order
}

// PlaceArray is an array as Place sees it.
type PlaceArray struct {
	Name   string
	Home   string
	Width  int // members wanted
	Parity int // member losses the level survives (for Domains "survive")
	// Members, when non-nil, are fixed by the configuration: Place keeps
	// them and counts their drives as used.
	Members []string
}

// PlaceRequest is the input of Place.
type PlaceRequest struct {
	Nodes  []PlaceNode
	Arrays []PlaceArray
	// Domains is "none", "distinct" or "survive" (see Placement).
	Domains string
}

// Place chooses the members of every array, in the order of req.Arrays,
// and returns them in the same order. It is pure and deterministic: the
// same request always gives the same answer.
//
// The rules:
//   - an array never has a member on its home node, nor two members on one
//     node;
//   - drives are spread evenly: with S member slots over D drives, no drive
//     serves more than ceil(S/D) arrays, so each drive serves one array
//     whenever S <= D;
//   - with Domains "distinct", an array's members are in distinct failure
//     domains; with "survive", at most Parity members share a domain.
//
// The choice is greedy, array by array: the array takes its Width nodes
// from the nodes other than its home that have the most drive capacity
// left, breaking ties by ring distance from the home node (the node after
// it first), and on each chosen node the least-used drive, breaking ties by
// drive order. For the seed topology (nodes A-E with drives X1-X4, five
// arrays of width 4 homed on A-E) that is exactly "array X takes from each
// other node Y the drive whose index is X's position among the arrays not
// homed on Y": A = B1 C1 D1 E1, B = A1 C2 D2 E2, C = A2 B2 D3 E3,
// D = A3 B3 C3 E4, E = A4 B4 C4 D4. Members are listed in node order.
//
// The cost is O(arrays x nodes x log nodes + drives). A request that cannot
// be met returns an error wrapping ErrPlacement that names the array and the
// reason.
func Place(req PlaceRequest) ([][]string, error) {
	nodes, byName, driveNode, total := placeNodes(req)
	slots := placeSlots(req)
	if total == 0 {
		if slots == 0 {
			return make([][]string, len(req.Arrays)), nil
		}
		return nil, fmt.Errorf("no node has drives: %w", ErrPlacement)
	}
	limit := (slots + total - 1) / total

	if err := checkPlaceable(req, nodes, byName); err != nil {
		return nil, err
	}
	countFixed(req, nodes, driveNode)
	free := func(ns *nodeState) int {
		f := 0
		for _, u := range ns.used {
			f += max(limit-u, 0)
		}
		return f
	}

	perDomainOf := func(a PlaceArray) int {
		switch req.Domains {
		case "distinct":
			return 1
		case "survive":
			return a.Parity
		}
		return len(nodes)
	}
	constrained := req.Domains == "distinct" || req.Domains == "survive"

	// First try the greedy rule, which keeps the seed's pattern; if it
	// paints itself into a corner, solve the node choice exactly as a
	// maximum flow.
	picks := placeGreedy(req, nodes, byName, free, perDomainOf, constrained)
	countFixed(req, nodes, driveNode)
	if picks == nil {
		var err error
		if picks, err = placeFlow(req, nodes, byName, free, perDomainOf, constrained, limit); err != nil {
			return nil, err
		}
	}
	return assignDrives(req, nodes, picks, limit), nil
}

// placeNodes builds the placement state of req's nodes, indexed by
// position, by name and by drive, and counts their drives.
func placeNodes(req PlaceRequest) (nodes []*nodeState, byName, driveNode map[string]*nodeState, total int) {
	nodes = make([]*nodeState, len(req.Nodes))
	byName = map[string]*nodeState{}
	driveNode = map[string]*nodeState{}
	for i, n := range req.Nodes {
		ns := &nodeState{name: n.Name, idx: i, domain: n.Domain, drives: n.Drives, used: make([]int, len(n.Drives))}
		nodes[i] = ns
		byName[n.Name] = ns
		for _, d := range n.Drives {
			driveNode[d] = ns
		}
		total += len(n.Drives)
	}
	return nodes, byName, driveNode, total
}

// placeSlots is the members all arrays need: the fixed ones listed and
// the automatic ones' widths.
func placeSlots(req PlaceRequest) int {
	slots := 0
	for _, a := range req.Arrays {
		if a.Members != nil {
			slots += len(a.Members)
		} else {
			slots += a.Width
		}
	}
	return slots
}

// checkPlaceable returns an error wrapping ErrPlacement for the first
// automatic array that could not be placed even on its own, ignoring the
// other arrays: its home is unknown, or too few nodes (or failure domains)
// other than its home have drives.
func checkPlaceable(req PlaceRequest, nodes []*nodeState, byName map[string]*nodeState) error {
	for _, a := range req.Arrays {
		if a.Members != nil {
			continue
		}
		if _, ok := byName[a.Home]; !ok {
			return fmt.Errorf("array %s: home node %q is not one of the nodes: %w", a.Name, a.Home, ErrPlacement)
		}
		if a.Width > len(nodes)-1 {
			return fmt.Errorf("array %s: width %d needs %d nodes besides its home node %s, but the cluster has only %d nodes: %w",
				a.Name, a.Width, a.Width, a.Home, len(nodes), ErrPlacement)
		}
		// On its own, ignoring the other arrays: how many members fit?
		eligible, perDom := 0, map[string]int{}
		for _, ns := range nodes {
			if ns.name != a.Home && len(ns.drives) > 0 {
				eligible++
				perDom[ns.domain]++
			}
		}
		fit := eligible
		switch req.Domains {
		case "distinct":
			fit = len(perDom)
		case "survive":
			fit = 0
			for _, n := range perDom {
				fit += min(n, a.Parity)
			}
		}
		if fit < a.Width {
			why := fmt.Sprintf("only %d nodes other than its home node %s have drives", eligible, a.Home)
			switch req.Domains {
			case "distinct":
				why = fmt.Sprintf("only %d distinct failure domains have a node with drives other than %s; add domains or lower the width", fit, a.Home)
			case "survive":
				why = fmt.Sprintf("with at most %d members per failure domain (its parity) only %d members fit; add domains or lower the width", a.Parity, fit)
			}
			return fmt.Errorf("array %s: needs %d members: %s: %w", a.Name, a.Width, why, ErrPlacement)
		}
	}
	return nil
}

// countFixed resets the nodes' use counts to the fixed members: they count
// as used, wherever they are in the list.
func countFixed(req PlaceRequest, nodes []*nodeState, driveNode map[string]*nodeState) {
	for _, ns := range nodes {
		clear(ns.used)
	}
	for _, a := range req.Arrays {
		for _, m := range a.Members {
			if ns, ok := driveNode[m]; ok {
				ns.used[slices.Index(ns.drives, m)]++
			}
		}
	}
}

// assignDrives hands out drives for the picked nodes: on each chosen node
// the least-used drive with room. Fixed arrays keep their members.
func assignDrives(req PlaceRequest, nodes []*nodeState, picks [][]int, limit int) [][]string {
	out := make([][]string, len(req.Arrays))
	for ai, a := range req.Arrays {
		if a.Members != nil {
			out[ai] = slices.Clone(a.Members)
			continue
		}
		members := make([]string, len(picks[ai]))
		for i, ni := range picks[ai] {
			ns := nodes[ni]
			best := -1
			for j, u := range ns.used {
				if u < limit && (best < 0 || u < ns.used[best]) {
					best = j
				}
			}
			ns.used[best]++
			members[i] = ns.drives[best]
		}
		out[ai] = members
	}
	return out
}

// placeGreedy picks the nodes of each automatic array (indexes into nodes,
// in node order), or returns nil when it paints itself into a corner. It
// updates the nodes' use counts as it goes, choosing drives by the same rule
// as Place will.
func placeGreedy(req PlaceRequest, nodes []*nodeState, byName map[string]*nodeState, free func(*nodeState) int,
	perDomainOf func(PlaceArray) int, constrained bool) [][]int {
	picks := make([][]int, len(req.Arrays))
	cand := make([]*nodeState, 0, len(nodes))
	for ai, a := range req.Arrays {
		if a.Members != nil {
			continue
		}
		home := byName[a.Home]
		perDomain := perDomainOf(a)
		cand = cand[:0]
		for _, ns := range nodes {
			if ns != home && free(ns) > 0 {
				cand = append(cand, ns)
			}
		}
		ring := func(ns *nodeState) int { return (ns.idx - home.idx + len(nodes)) % len(nodes) }
		slices.SortStableFunc(cand, func(x, y *nodeState) int {
			if fx, fy := free(x), free(y); fx != fy {
				return fy - fx
			}
			return ring(x) - ring(y)
		})
		inDomain := map[string]int{}
		var picked []*nodeState
		for _, ns := range cand {
			if len(picked) == a.Width {
				break
			}
			if constrained && inDomain[ns.domain] >= perDomain {
				continue
			}
			inDomain[ns.domain]++
			picked = append(picked, ns)
		}
		if len(picked) < a.Width {
			return nil
		}
		slices.SortFunc(picked, func(x, y *nodeState) int { return x.idx - y.idx })
		for _, ns := range picked {
			picks[ai] = append(picks[ai], ns.idx)
			best := -1
			for j, u := range ns.used {
				if best < 0 || u < ns.used[best] {
					best = j
				}
			}
			ns.used[best]++
		}
	}
	return picks
}

// placeFlow chooses the nodes of every automatic array exactly: a maximum
// flow from the arrays (capacity Width) through (array, domain) pairs
// (capacity: members allowed per domain) to the nodes other than the home
// node (capacity 1: one member per node) to the sink (capacity: the node's
// free drive slots). A flow that saturates every array is a placement; any
// shortfall proves that none exists.
func placeFlow(req PlaceRequest, nodes []*nodeState, byName map[string]*nodeState, free func(*nodeState) int,
	perDomainOf func(PlaceArray) int, constrained bool, limit int) ([][]int, error) {
	domains := []string{""}
	domainIdx := map[string]int{"": 0}
	nodeDom := make([]int, len(nodes))
	if constrained {
		domains = domains[:0]
		clear(domainIdx)
		for i, ns := range nodes {
			d, ok := domainIdx[ns.domain]
			if !ok {
				d = len(domains)
				domainIdx[ns.domain] = d
				domains = append(domains, ns.domain)
			}
			nodeDom[i] = d
		}
	}
	var auto []int
	for ai, a := range req.Arrays {
		if a.Members == nil {
			auto = append(auto, ai)
		}
	}
	// Vertex numbering: source, sink, arrays, (array, domain), nodes.
	const src, sink = 0, 1
	arrV := func(k int) int { return 2 + k }
	pairV := func(k, d int) int { return 2 + len(auto) + k*len(domains) + d }
	nodeV := func(i int) int { return 2 + len(auto) + len(auto)*len(domains) + i }
	g := newFlow(2 + len(auto) + len(auto)*len(domains) + len(nodes))
	for i, ns := range nodes {
		g.edge(nodeV(i), sink, free(ns))
	}
	type nodeEdge struct{ k, node, e int }
	var nodeEdges []nodeEdge
	for k, ai := range auto {
		a := req.Arrays[ai]
		home := byName[a.Home]
		g.edge(src, arrV(k), a.Width)
		for d := range domains {
			g.edge(arrV(k), pairV(k, d), perDomainOf(a))
		}
		for i := range nodes {
			if nodes[i] != home {
				nodeEdges = append(nodeEdges, nodeEdge{k, i, g.edge(pairV(k, nodeDom[i]), nodeV(i), 1)})
			}
		}
	}
	g.maxflow(src, sink)
	picks := make([][]int, len(req.Arrays))
	for _, ne := range nodeEdges {
		if g.flowOn(ne.e) > 0 {
			ai := auto[ne.k]
			picks[ai] = append(picks[ai], ne.node)
		}
	}
	for _, ai := range auto {
		a := req.Arrays[ai]
		if len(picks[ai]) < a.Width {
			why := fmt.Sprintf("at most %d members fit on nodes other than its home node %s with a drive with room left (each drive may serve at most %d arrays)", len(picks[ai]), a.Home, limit)
			switch req.Domains {
			case "distinct":
				why = fmt.Sprintf("with one member per failure domain at most %d members fit alongside the other arrays; add domains or lower the width", len(picks[ai]))
			case "survive":
				why = fmt.Sprintf("with at most %d members per failure domain (its parity) at most %d members fit alongside the other arrays; add domains or lower the width", perDomainOf(a), len(picks[ai]))
			}
			return nil, fmt.Errorf("array %s: needs %d members: %s: %w", a.Name, a.Width, why, ErrPlacement)
		}
	}
	return picks, nil
}

// flow is a small Dinic maximum-flow solver over adjacency lists; edges are
// stored in pairs (forward, reverse) so that e^1 is e's reverse.
type flow struct {
	head       [][]int
	to, cap    []int
	orig       []int
	level, ptr []int
}

func newFlow(n int) *flow {
	return &flow{head: make([][]int, n), level: make([]int, n), ptr: make([]int, n)}
}

func (f *flow) edge(u, v, c int) int {
	e := len(f.to)
	f.to = append(f.to, v, u)
	f.cap = append(f.cap, c, 0)
	f.orig = append(f.orig, c, 0)
	f.head[u] = append(f.head[u], e)
	f.head[v] = append(f.head[v], e+1)
	return e
}

func (f *flow) flowOn(e int) int { return f.orig[e] - f.cap[e] }

func (f *flow) maxflow(s, t int) int {
	total := 0
	for {
		for i := range f.level {
			f.level[i] = -1
		}
		f.level[s] = 0
		q := []int{s}
		for len(q) > 0 {
			u := q[0]
			q = q[1:]
			for _, e := range f.head[u] {
				if f.cap[e] > 0 && f.level[f.to[e]] < 0 {
					f.level[f.to[e]] = f.level[u] + 1
					q = append(q, f.to[e])
				}
			}
		}
		if f.level[t] < 0 {
			return total
		}
		clear(f.ptr)
		for {
			pushed := f.dfs(s, t, int(^uint(0)>>1))
			if pushed == 0 {
				break
			}
			total += pushed
		}
	}
}

func (f *flow) dfs(u, t, limit int) int {
	if u == t {
		return limit
	}
	for ; f.ptr[u] < len(f.head[u]); f.ptr[u]++ {
		e := f.head[u][f.ptr[u]]
		v := f.to[e]
		if f.cap[e] <= 0 || f.level[v] != f.level[u]+1 {
			continue
		}
		if got := f.dfs(v, t, min(limit, f.cap[e])); got > 0 {
			f.cap[e] -= got
			f.cap[e^1] += got
			return got
		}
	}
	return 0
}

// placeRequest builds Place's input from the configuration.
func (c *Config) placeRequest() PlaceRequest {
	req := PlaceRequest{Domains: strings.ToLower(c.Placement.Domains)}
	for _, n := range c.Nodes {
		pn := PlaceNode{Name: n.Name, Domain: n.Domain}
		for _, d := range n.Drives {
			pn.Drives = append(pn.Drives, d.Name)
		}
		req.Nodes = append(req.Nodes, pn)
	}
	for _, a := range c.Arrays {
		pa := PlaceArray{Name: a.Name, Home: a.Home, Width: a.Width, Parity: a.Parity()}
		if !a.Auto {
			pa.Members = a.Members
		}
		req.Arrays = append(req.Arrays, pa)
	}
	return req
}
