package localcluster

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"tier0/daemon/config"
)

// ErrPortBusy: a port the local cluster needs is taken by another program.
var ErrPortBusy = errors.New("port in use")

// ListenPort is one TCP port a node listens on.
type ListenPort struct {
	Node, What, Addr string
}

// Ports lists every TCP listener of the site's nodes: backend, frontend,
// API and, with an embedded store, each etcd member's client and peer
// ports.
func Ports(cfg *config.Config) []ListenPort {
	var out []ListenPort
	for i := range cfg.Nodes {
		n := &cfg.Nodes[i]
		out = append(out,
			ListenPort{n.Name, "backend", n.ListenAddr(n.Backend)},
			ListenPort{n.Name, "frontend", n.ListenAddr(n.Frontend)},
			ListenPort{n.Name, "api", n.ListenAddr(n.API)})
	}
	if len(cfg.ControlPlane.Etcd.Endpoints) == 0 {
		for _, p := range cfg.EtcdPeers() {
			for what, u := range map[string]string{"etcd client": p.ClientURL, "etcd peer": p.PeerURL} {
				_, port, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
				if err == nil {
					out = append(out, ListenPort{p.Node, what, net.JoinHostPort(p.ListenHost, port)})
				}
			}
		}
	}
	return out
}

// CheckPorts tries to listen on every port of Ports; the error (wrapping
// ErrPortBusy) names each busy one and what to do.
func CheckPorts(cfg *config.Config) error {
	var busy, more []string
	all := Ports(cfg)
	for _, p := range all {
		l, err := net.Listen("tcp", p.Addr)
		if err != nil {
			_, port, _ := net.SplitHostPort(p.Addr)
			if len(busy) < 3 {
				busy = append(busy, fmt.Sprintf("%s (node %s %s): %v; find the holder with `ss -ltnp 'sport = :%s'` and stop it, or change the port in %s",
					p.Addr, p.Node, p.What, errors.Unwrap(err), port, cfg.File))
			} else {
				more = append(more, port)
			}
			continue
		}
		l.Close()
	}
	if len(busy) == 0 {
		return nil
	}
	msg := strings.Join(busy, "; ")
	if len(more) > 0 {
		msg += fmt.Sprintf("; and %d more: %s", len(more), strings.Join(more, ", "))
	}
	if len(busy)+len(more) == len(all) {
		msg += ". Every port of the site is taken: a cluster of this site seems to be running already (an earlier run with --keep, or one started by hand); stop its tier0d processes, or validate it without --local"
	}
	return fmt.Errorf("%w: %s", ErrPortBusy, msg)
}

var portField = regexp.MustCompile(`(port: *)([0-9]+)`)

// ShiftPorts adds shift to every "port: N" value in a site file's text.
func ShiftPorts(text string, shift int) string {
	return portField.ReplaceAllStringFunc(text, func(s string) string {
		m := portField.FindStringSubmatch(s)
		p, _ := strconv.Atoi(m[2])
		return m[1] + strconv.Itoa(p+shift)
	})
}

// FreePortShift returns the first shift among candidates for which every
// port of the site text can be bound on 127.0.0.1 now.
func FreePortShift(text string, candidates []int) (int, error) {
	var ports []int
	for _, m := range portField.FindAllStringSubmatch(text, -1) {
		p, _ := strconv.Atoi(m[2])
		ports = append(ports, p)
	}
next:
	for _, s := range candidates {
		for _, p := range ports {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+s)))
			if err != nil {
				continue next
			}
			l.Close()
		}
		return s, nil
	}
	return 0, fmt.Errorf("no port shift in %v leaves every port of the site free on 127.0.0.1; stop the other local clusters", candidates)
}
