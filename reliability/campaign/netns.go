package campaign

import (
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// Netns is a small network of namespaces for a real partition test: a hub
// namespace holding a bridge (and the campaign's host), and one namespace
// per node, each linked to the bridge by a veth pair. Cutting a node takes
// its veth link down in the hub: the node keeps running but reaches
// nobody, and nobody reaches it. Nothing outside these namespaces is
// touched. Needs root and iproute2.
type Netns struct {
	Hub   string            // hub namespace name
	nodes map[string]string // node -> its namespace
	links map[string]string // node -> hub-side veth name
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// SetupNetns creates the hub (bridge at subnet.254/24) and one namespace
// per node with the address addrs[node] (in subnet) on its eth0. prefix
// names the namespaces (prefix-hub, prefix-<node>); existing namespaces of
// that name are deleted first.
func SetupNetns(prefix string, addrs map[string]string) (*Netns, error) {
	n := NetnsFor(prefix, addrs)
	_ = ipCmd("netns", "del", n.Hub)
	steps := [][]string{
		{"netns", "add", n.Hub},
		{"-n", n.Hub, "link", "set", "lo", "up"},
		{"-n", n.Hub, "link", "add", "br0", "type", "bridge"},
	}
	var hubAddr string
	for node, addr := range addrs {
		ns, link := n.nodes[node], n.links[node]
		_ = ipCmd("netns", "del", ns)
		if hubAddr == "" {
			hubAddr = addr[:strings.LastIndex(addr, ".")] + ".254/24"
		}
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"-n", n.Hub, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"-n", n.Hub, "link", "set", link, "master", "br0"},
			[]string{"-n", n.Hub, "link", "set", link, "up"},
			[]string{"-n", ns, "addr", "add", addr + "/24", "dev", "eth0"},
			[]string{"-n", ns, "link", "set", "eth0", "up"},
		)
	}
	steps = append(steps,
		[]string{"-n", n.Hub, "addr", "add", hubAddr, "dev", "br0"},
		[]string{"-n", n.Hub, "link", "set", "br0", "up"},
	)
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// NetnsFor names the namespaces and links SetupNetns creates, without
// creating anything (for a process started inside the hub).
func NetnsFor(prefix string, addrs map[string]string) *Netns {
	n := &Netns{Hub: prefix + "-hub", nodes: map[string]string{}, links: map[string]string{}}
	names := make([]string, 0, len(addrs))
	for node := range addrs {
		names = append(names, node)
	}
	slices.Sort(names)
	for i, node := range names {
		n.nodes[node], n.links[node] = prefix+"-"+strings.ToLower(node), fmt.Sprintf("v%d", i+1)
	}
	return n
}

// Close deletes every namespace it created.
func (n *Netns) Close() {
	for _, ns := range n.nodes {
		_ = ipCmd("netns", "del", ns)
	}
	_ = ipCmd("netns", "del", n.Hub)
}

// Namespace is node's namespace.
func (n *Netns) Namespace(node string) string { return n.nodes[node] }

// Cut isolates node: its link to the bridge goes down.
func (n *Netns) Cut(node string) error {
	l, ok := n.links[node]
	if !ok {
		return fmt.Errorf("node %s has no namespace", node)
	}
	return ipCmd("-n", n.Hub, "link", "set", l, "down")
}

// Heal reconnects node.
func (n *Netns) Heal(node string) error {
	l, ok := n.links[node]
	if !ok {
		return fmt.Errorf("node %s has no namespace", node)
	}
	return ipCmd("-n", n.Hub, "link", "set", l, "up")
}
