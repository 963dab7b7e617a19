package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func grid(nodes, drives int, domains int) []PlaceNode {
	var out []PlaceNode
	for i := 0; i < nodes; i++ {
		n := PlaceNode{Name: fmt.Sprintf("n%02d", i), Domain: fmt.Sprintf("r%d", i%max(domains, 1))}
		for d := 0; d < drives; d++ {
			n.Drives = append(n.Drives, fmt.Sprintf("n%02dd%d", i, d))
		}
		out = append(out, n)
	}
	return out
}

func homed(nodes []PlaceNode, width, parity int) []PlaceArray {
	var out []PlaceArray
	for _, n := range nodes {
		out = append(out, PlaceArray{Name: "a" + n.Name, Home: n.Name, Width: width, Parity: parity})
	}
	return out
}

// checkPlacement verifies Place's rules on a result.
func checkPlacement(t *testing.T, req PlaceRequest, res [][]string) {
	t.Helper()
	nodeOf, domainOf := map[string]string{}, map[string]string{}
	total := 0
	for _, n := range req.Nodes {
		for _, d := range n.Drives {
			nodeOf[d] = n.Name
			domainOf[d] = n.Domain
		}
		total += len(n.Drives)
	}
	slots := 0
	uses := map[string]int{}
	for i, a := range req.Arrays {
		slots += a.Width
		if len(res[i]) != a.Width {
			t.Fatalf("array %s: %d members, want %d", a.Name, len(res[i]), a.Width)
		}
		onNode, inDomain := map[string]bool{}, map[string]int{}
		for _, m := range res[i] {
			uses[m]++
			if nodeOf[m] == a.Home {
				t.Fatalf("array %s: member %s on its home node", a.Name, m)
			}
			if onNode[nodeOf[m]] {
				t.Fatalf("array %s: two members on node %s: %v", a.Name, nodeOf[m], res[i])
			}
			onNode[nodeOf[m]] = true
			inDomain[domainOf[m]]++
			if req.Domains == "distinct" && inDomain[domainOf[m]] > 1 ||
				req.Domains == "survive" && inDomain[domainOf[m]] > a.Parity {
				t.Fatalf("array %s: too many members in domain %s: %v", a.Name, domainOf[m], res[i])
			}
		}
	}
	limit := (slots + total - 1) / total
	for d, u := range uses {
		if u > limit {
			t.Fatalf("drive %s serves %d arrays, limit %d", d, u, limit)
		}
	}
}

func TestPlaceSeedRule(t *testing.T) {
	nodes := []PlaceNode{}
	for _, n := range "ABCDE" {
		pn := PlaceNode{Name: string(n)}
		for d := 1; d <= 4; d++ {
			pn.Drives = append(pn.Drives, fmt.Sprintf("%c%d", n, d))
		}
		nodes = append(nodes, pn)
	}
	res, err := Place(PlaceRequest{Nodes: nodes, Arrays: homed(nodes, 4, 1)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range res {
		got = append(got, strings.Join(m, " "))
	}
	want := "B1 C1 D1 E1|A1 C2 D2 E2|A2 B2 D3 E3|A3 B3 C3 E4|A4 B4 C4 D4"
	if strings.Join(got, "|") != want {
		t.Fatalf("placement %q\nwant      %q", strings.Join(got, "|"), want)
	}
}

// TestPlaceLadder runs Place over a ladder of cluster shapes and checks
// every rule, and that each drive is used once whenever there are enough.
func TestPlaceLadder(t *testing.T) {
	for nodes := 3; nodes <= 12; nodes++ {
		for drives := 1; drives <= 4; drives++ {
			for width := 2; width <= nodes-1; width++ {
				ns := grid(nodes, drives, 0)
				req := PlaceRequest{Nodes: ns, Arrays: homed(ns, width, 1)}
				res, err := Place(req)
				if err != nil {
					t.Fatalf("%d nodes x %d drives, width %d: %v", nodes, drives, width, err)
				}
				checkPlacement(t, req, res)
			}
		}
	}
}

func TestPlaceDomains(t *testing.T) {
	// 8 nodes in 4 racks, RAID-6 width 7: survive puts at most 2 per rack.
	ns := grid(8, 7, 4)
	req := PlaceRequest{Nodes: ns, Arrays: homed(ns, 7, 2), Domains: "survive"}
	res, err := Place(req)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, req, res)
	// 9 nodes in 3 racks, width 3, distinct racks.
	ns = grid(9, 3, 3)
	req = PlaceRequest{Nodes: ns, Arrays: homed(ns, 3, 1), Domains: "distinct"}
	if res, err = Place(req); err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, req, res)
	// Width 4 in distinct racks with only 3 racks is impossible.
	req.Arrays = homed(ns, 4, 1)
	_, err = Place(req)
	if want := "array an00: needs 4 members: only 3 distinct failure domains have a node with drives other than n00; add domains or lower the width: placement impossible"; !errors.Is(err, ErrPlacement) || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
	// Feasible for each array alone, impossible together: 5 nodes with one
	// drive, n00 and n04 in one rack. n01-n03 must serve arrays n02-n04
	// (whose other choices are all in one rack) and so have no room for
	// n00's second member from outside its rack. Greedy fails and the
	// exact solver proves it.
	ns = grid(5, 1, 4)
	req = PlaceRequest{Nodes: ns, Arrays: homed(ns, 3, 1), Domains: "distinct"}
	_, err = Place(req)
	if !errors.Is(err, ErrPlacement) || !strings.Contains(err.Error(), "alongside the other arrays") {
		t.Fatalf("want a joint placement error, got %v", err)
	}
	// A case where greedy gets stuck but a placement exists: the exact
	// solver must find it.
	ns = grid(4, 1, 3)
	req = PlaceRequest{Nodes: ns, Arrays: homed(ns, 2, 1), Domains: "distinct"}
	if res, err = Place(req); err != nil {
		t.Fatalf("4 nodes, 3 racks, width 2: %v", err)
	}
	checkPlacement(t, req, res)
}

func TestPlaceFixedMembersCount(t *testing.T) {
	ns := grid(4, 1, 0)
	req := PlaceRequest{Nodes: ns, Arrays: []PlaceArray{
		{Name: "x", Home: "n00", Width: 3, Members: []string{"n01d0", "n02d0", "n03d0"}},
		{Name: "y", Home: "n01", Width: 3},
	}}
	res, err := Place(req)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(res[1], " "); got != "n00d0 n02d0 n03d0" {
		t.Fatalf("y = %s", got)
	}
	if got := strings.Join(res[0], " "); got != "n01d0 n02d0 n03d0" {
		t.Fatalf("fixed x changed: %s", got)
	}
}

func TestPlaceDeterministic(t *testing.T) {
	ns := grid(10, 3, 0)
	req := PlaceRequest{Nodes: ns, Arrays: homed(ns, 5, 1)}
	a, _ := Place(req)
	b, _ := Place(req)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("Place is not deterministic")
	}
}

func TestPlace64(t *testing.T) {
	ns := grid(64, 4, 8)
	req := PlaceRequest{Nodes: ns, Arrays: homed(ns, 8, 2), Domains: "survive"}
	start := time.Now()
	res, err := Place(req)
	d := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, req, res)
	t.Logf("64 nodes x 4 drives, 64 arrays of width 8: %v", d)
	ns = grid(64, 1, 0)
	req = PlaceRequest{Nodes: ns, Arrays: homed(ns, 63, 1)}
	if res, err = Place(req); err != nil {
		t.Fatal(err)
	}
	checkPlacement(t, req, res)
}

func BenchmarkPlace64(b *testing.B) {
	ns := grid(64, 4, 8)
	req := PlaceRequest{Nodes: ns, Arrays: homed(ns, 8, 2), Domains: "survive"}
	for b.Loop() {
		if _, err := Place(req); err != nil {
			b.Fatal(err)
		}
	}
}
