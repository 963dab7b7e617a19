package nemesis

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"tier0/daemon/config"
)

// proxyHost is the loopback address of node i's proxies (i from 0): every
// address the site advertises for that node points there, and a proxy on
// the same port forwards to the node's real listener on its own address.
// Linux routes all of 127.0.0.0/8 to the loopback interface, so no setup
// and no root are needed.
func proxyHost(i int) string { return fmt.Sprintf("127.0.%d.%d", 100+i/250, 1+i%250) }

// RewriteSite returns the site text with every node's backend, frontend
// and API endpoint advertised on its proxy host (the API's advertised host
// also carries the node's etcd URLs).
func RewriteSite(text string) (string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return "", fmt.Errorf("site: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return "", fmt.Errorf("site: not a YAML mapping")
	}
	nodes := mapGet(doc.Content[0], "nodes")
	if nodes == nil || nodes.Kind != yaml.SequenceNode {
		return "", fmt.Errorf("site: no nodes list")
	}
	for i, n := range nodes.Content {
		for _, ep := range []string{"backend", "frontend", "api"} {
			e := mapGet(n, ep)
			if e == nil || e.Kind != yaml.MappingNode {
				return "", fmt.Errorf("site: node %d has no %s mapping", i, ep)
			}
			if a := mapGet(e, "advertise"); a != nil {
				return "", fmt.Errorf("site: node %d's %s already has an advertise address (%s); the nemesis needs to set it", i, ep, a.Value)
			}
			e.Style = 0
			e.Content = append(e.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Value: "advertise"},
				&yaml.Node{Kind: yaml.ScalarNode, Value: proxyHost(i)})
		}
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return "", err
	}
	return string(out), nil
}

func mapGet(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// link is one proxy: the named link class of a node.
type link struct {
	node, class string
	proxies     []*toxiproxy.Proxy // etcd: client and peer
}

// Net is the set of proxies in front of every node's listeners.
type Net struct {
	srv   *toxiproxy.ApiServer
	mu    sync.Mutex
	links map[string]*link // "class:node"
	seq   int
}

// StartNet starts a proxy for every advertised endpoint of cfg (loaded
// from a site rewritten by RewriteSite): advertised host:port -> the
// node's listen host:port.
func StartNet(cfg *config.Config) (*Net, error) {
	n := newNet()
	add := n.add
	peers := map[string]config.EtcdPeer{}
	for _, p := range cfg.EtcdPeers() {
		peers[p.Node] = p
	}
	for i := range cfg.Nodes {
		nd := &cfg.Nodes[i]
		steps := [][4]string{
			{nd.Name, LinkFrontend, nd.AdvertiseAddr(nd.Frontend), nd.ListenAddr(nd.Frontend)},
			{nd.Name, LinkBackend, nd.AdvertiseAddr(nd.Backend), nd.ListenAddr(nd.Backend)},
			{nd.Name, "api", nd.AdvertiseAddr(nd.API), nd.ListenAddr(nd.API)},
		}
		if p, ok := peers[nd.Name]; ok {
			for _, u := range []string{p.ClientURL, p.PeerURL} {
				hp := strings.TrimPrefix(u, "http://")
				_, port, _ := net.SplitHostPort(hp)
				steps = append(steps, [4]string{nd.Name, LinkEtcd, hp, net.JoinHostPort(p.ListenHost, port)})
			}
		}
		for _, s := range steps {
			if err := add(s[0], s[1], s[2], s[3]); err != nil {
				n.Close()
				return nil, err
			}
		}
	}
	return n, nil
}

func newNet() *Net {
	return &Net{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), links: map[string]*link{}}
}

// add starts a proxy adv -> up for node's link class.
func (n *Net) add(node, class, adv, up string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.links[class+":"+node]
	if l == nil {
		l = &link{node: node, class: class}
		n.links[class+":"+node] = l
	}
	p := toxiproxy.NewProxy(n.srv, class+"-"+node+"-"+strconv.Itoa(len(l.proxies)), adv, up)
	if err := p.Start(); err != nil {
		return fmt.Errorf("proxy for node %s's %s (%s -> %s): %w; a nemesis run needs the loopback addresses 127.0.100.0/24 free", node, class, adv, up, err)
	}
	l.proxies = append(l.proxies, p)
	return nil
}

// Close stops every proxy.
func (n *Net) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range n.links {
		for _, p := range l.proxies {
			p.Stop()
		}
	}
}

// Toxic is one toxic added to a link, to remove at the heal.
type Toxic struct {
	l     *link
	names []string
}

// Add adds a toxic of type typ with attrs (JSON object text) to the link
// class:node in stream ("upstream": towards the node; "downstream":
// from it; "both").
func (n *Net) Add(class, node, typ, stream, attrs string) (*Toxic, error) {
	n.mu.Lock()
	l := n.links[class+":"+node]
	n.seq++
	seq := n.seq
	n.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("no link %s:%s (node %s has no %s listener)", class, node, node, class)
	}
	t := &Toxic{l: l}
	streams := []string{stream}
	if stream == "both" {
		streams = []string{"upstream", "downstream"}
	}
	for _, p := range l.proxies {
		for _, s := range streams {
			name := fmt.Sprintf("%s-%s-%d", typ, s, seq)
			body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, s, attrs)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
				t.Remove()
				return nil, fmt.Errorf("toxic %s on %s: %w", body, p.Name, err)
			}
			t.names = append(t.names, p.Name+"\x00"+name)
		}
	}
	return t, nil
}

// Remove heals the toxic (a stalled link's connections are closed: data
// that vanished cannot come back into a TCP stream).
func (t *Toxic) Remove() {
	for _, pn := range t.names {
		pname, name, _ := strings.Cut(pn, "\x00")
		for _, p := range t.l.proxies {
			if p.Name == pname {
				_ = p.Toxics.RemoveToxic(context.Background(), name)
			}
		}
	}
	t.names = nil
}

// linksInto lists the link classes of node (for a partition).
func (n *Net) linksInto(node string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for _, c := range []string{LinkFrontend, LinkBackend, LinkEtcd} {
		if n.links[c+":"+node] != nil {
			out = append(out, c)
		}
	}
	return out
}

// writeSite writes text to path.
func writeSite(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }
