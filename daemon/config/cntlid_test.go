package config

import (
	"fmt"
	"strings"
	"testing"
)

func manyNodes(n int) string {
	var b strings.Builder
	b.WriteString("cluster: t\nnodes:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: n%d, address: 10.%d.%d.1, backend: {port: 5001}, frontend: {port: 5002}, api: {port: 5003}, drives: [{name: d%d, path: /x/d%d}]}\n", i, i/250, i%250, i, i)
	}
	b.WriteString("control_plane:\n  etcd: {peers: [n0], client_port: 5100, peer_port: 5101}\narrays: []\n")
	return b.String()
}

// Every node's frontend hands out controller IDs from its own range; a
// site larger than the 16-bit controller ID space allows is refused
// (issue 12, hole 7: 1+idx*256 overflowed past 255 nodes and node 256
// reused node 0's IDs).
func TestTooManyNodesForControllerIDs(t *testing.T) {
	if ps := problems(t, manyNodes(MaxNodes)); len(ps) != 0 {
		t.Fatalf("a site of %d nodes must be accepted: %v", MaxNodes, ps)
	}
	ps := problems(t, manyNodes(MaxNodes+1))
	want := fmt.Sprintf("site.yaml: nodes: %d nodes; expected at most %d", MaxNodes+1, MaxNodes)
	if len(ps) != 1 || !strings.HasPrefix(ps[0], want) || !strings.Contains(ps[0], "controller IDs") {
		t.Fatalf("a site of %d nodes: problems %q, want one starting %q and naming controller IDs", MaxNodes+1, ps, want)
	}
}

func TestControllerIDRangesDisjoint(t *testing.T) {
	next := 1
	for i := range MaxNodes {
		base, count := CntlIDRange(i)
		if int(base) != next {
			t.Fatalf("node %d: range starts at %d, want %d (right after the previous node's)", i, base, next)
		}
		next = int(base) + int(count)
		if next-1 > 0xFFEF {
			t.Fatalf("node %d: range [%d, %d] passes 0xFFEF, the largest valid controller ID", i, base, next-1)
		}
	}
}
