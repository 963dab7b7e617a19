package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

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
	type nodeState struct {
		idx    int
		domain string
		drives []string
		used   []int
	}
	nodes := make([]*nodeState, len(req.Nodes))
	byName := map[string]*nodeState{}
	driveNode := map[string]*nodeState{}
	total := 0
	for i, n := range req.Nodes {
		ns := &nodeState{idx: i, domain: n.Domain, drives: n.Drives, used: make([]int, len(n.Drives))}
		nodes[i] = ns
		byName[n.Name] = ns
		for _, d := range n.Drives {
			driveNode[d] = ns
		}
		total += len(n.Drives)
	}
	slots := 0
	for _, a := range req.Arrays {
		if a.Members != nil {
			slots += len(a.Members)
		} else {
			slots += a.Width
		}
	}
	if total == 0 {
		if slots == 0 {
			return make([][]string, len(req.Arrays)), nil
		}
		return nil, fmt.Errorf("no node has drives: %w", ErrPlacement)
	}
	limit := (slots + total - 1) / total

	// Fixed members count first, wherever they are in the list.
	for _, a := range req.Arrays {
		for _, m := range a.Members {
			if ns, ok := driveNode[m]; ok {
				ns.used[slices.Index(ns.drives, m)]++
			}
		}
	}
	free := func(ns *nodeState) int {
		f := 0
		for _, u := range ns.used {
			f += max(limit-u, 0)
		}
		return f
	}

	out := make([][]string, len(req.Arrays))
	cand := make([]*nodeState, 0, len(nodes))
	for ai, a := range req.Arrays {
		if a.Members != nil {
			out[ai] = slices.Clone(a.Members)
			continue
		}
		home, ok := byName[a.Home]
		if !ok {
			return nil, fmt.Errorf("array %s: home node %q is not one of the nodes: %w", a.Name, a.Home, ErrPlacement)
		}
		if a.Width > len(nodes)-1 {
			return nil, fmt.Errorf("array %s: width %d needs %d nodes besides its home node %s, but the cluster has only %d nodes: %w",
				a.Name, a.Width, a.Width, a.Home, len(nodes), ErrPlacement)
		}
		perDomain := len(nodes)
		switch req.Domains {
		case "distinct":
			perDomain = 1
		case "survive":
			perDomain = a.Parity
		}
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
			if req.Domains != "" && req.Domains != "none" && inDomain[ns.domain] >= perDomain {
				continue
			}
			inDomain[ns.domain]++
			picked = append(picked, ns)
		}
		if len(picked) < a.Width {
			why := fmt.Sprintf("only %d nodes other than its home node %s have a drive with room left (each drive may serve at most %d arrays)",
				len(cand), a.Home, limit)
			switch {
			case req.Domains == "distinct":
				why = fmt.Sprintf("only %d distinct failure domains have a node other than %s with a drive with room left; add domains or lower the width", len(picked), a.Home)
			case req.Domains == "survive":
				why = fmt.Sprintf("with at most %d members per failure domain (its parity) only %d members fit; add domains or lower the width", perDomain, len(picked))
			}
			return nil, fmt.Errorf("array %s: needs %d members: %s: %w", a.Name, a.Width, why, ErrPlacement)
		}
		slices.SortFunc(picked, func(x, y *nodeState) int { return x.idx - y.idx })
		members := make([]string, len(picked))
		for i, ns := range picked {
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
	return out, nil
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
