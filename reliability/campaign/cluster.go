package campaign

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/internal/localcluster"
)

// Cluster is a local cluster of tier0d processes started from one site
// configuration, each node a process on 127.0.0.1 with file drives under
// the work directory (internal/localcluster runs them; each node's log is
// WORKDIR/NODE.log). Only the processes it started are ever signalled.
type Cluster struct {
	Config  *config.Config
	Site    string // the site file the processes run with
	Workdir string
	log     *slog.Logger
	procs   *localcluster.Procs

	mu sync.Mutex
	// proxies, when set (UseFrontendProxies), stand between the host and
	// each node's frontend so that a fault can reset the connections.
	proxies map[string]*frontProxy
}

// LocalOptions configure StartLocal.
type LocalOptions struct {
	// CoordinatorOnVoter starts the embedded etcd voters first and the
	// other nodes once a coordinator is elected, so that the first
	// coordinator runs on a voter (freeze-etcd-voter freezes it).
	CoordinatorOnVoter bool
	// Site is the site configuration file (every node on a loopback
	// address).
	Site string
	// Binary is the tier0d executable.
	Binary string
	// Workdir receives the drives, state, etcd data and one log per node;
	// the site's workdir is replaced by it. Created if missing; it must be
	// empty (old drive contents would confuse the checker).
	Workdir string
	// PortShift is added to every port in the site file (to run beside
	// another cluster of the same site); 0 keeps them.
	PortShift int
	// Netns, when set, runs each node in its own namespace (the site's
	// node addresses must be those SetupNetns gave them); the caller runs
	// in the hub namespace.
	Netns *Netns
	// Logger (default: discard).
	Logger *slog.Logger
}

var workdirLine = regexp.MustCompile(`(?m)^workdir:.*$`)

// StartLocal writes the site for the work directory, starts every node's
// tier0d and returns once each process runs (not yet healthy: see
// WaitHealthy).
func StartLocal(ctx context.Context, o LocalOptions) (*Cluster, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	data, err := os.ReadFile(o.Site)
	if err != nil {
		return nil, fmt.Errorf("site configuration: %w", err)
	}
	wd, err := filepath.Abs(o.Workdir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(wd, 0o755); err != nil {
		return nil, fmt.Errorf("work directory: %w", err)
	}
	if ents, err := os.ReadDir(wd); err != nil || len(ents) > 0 {
		return nil, fmt.Errorf("work directory %s is not empty (or unreadable: %v); a campaign starts from blank drives: remove it or name another", wd, err)
	}
	text := string(data)
	if !workdirLine.MatchString(text) {
		return nil, fmt.Errorf("site %s has no top-level workdir line; a local campaign needs one to place the drive files", o.Site)
	}
	text = workdirLine.ReplaceAllString(text, "workdir: "+wd)
	if o.PortShift != 0 {
		text = localcluster.ShiftPorts(text, o.PortShift)
	}
	site := filepath.Join(wd, "site.yaml")
	if err := os.WriteFile(site, []byte(text), 0o644); err != nil {
		return nil, err
	}
	cfg, err := config.Load(site)
	if err != nil {
		return nil, err
	}
	for _, n := range cfg.Nodes {
		if h := n.AdvertiseAddr(n.API); !isLoopback(h) && o.Netns == nil {
			return nil, fmt.Errorf("node %s's API %s is not on a loopback address; a local campaign runs every node on this machine", n.Name, h)
		}
	}
	if _, err := os.Stat(o.Binary); err != nil {
		return nil, fmt.Errorf("tier0d binary: %w; build it with `make build` or pass its path", err)
	}
	po := localcluster.Options{Binary: o.Binary, Site: site, Workdir: wd, Logger: o.Logger}
	if o.Netns != nil {
		po.Netns = o.Netns.Namespace
	}
	c := &Cluster{Config: cfg, Site: site, Workdir: wd, log: o.Logger, procs: localcluster.New(po)}
	voters := c.etcdPeers()
	var rest []string
	for _, n := range cfg.Nodes {
		if o.CoordinatorOnVoter && !slices.Contains(voters, n.Name) {
			rest = append(rest, n.Name)
			continue
		}
		if err := c.Start(n.Name); err != nil {
			c.Close()
			return nil, err
		}
	}
	if len(rest) > 0 {
		// The first coordinator is elected among the voters.
		deadline := time.Now().Add(30 * time.Second)
		for c.Coordinator(ctx) == "" && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
		}
		for _, n := range rest {
			if err := c.Start(n); err != nil {
				c.Close()
				return nil, err
			}
		}
	}
	return c, nil
}

func isLoopback(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Nodes returns the node names in site order.
func (c *Cluster) Nodes() []string {
	var out []string
	for _, n := range c.Config.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// Start starts node's tier0d (it must not be running), logging to
// <workdir>/<node>.log (appended).
func (c *Cluster) Start(node string) error { return c.procs.Start(node) }

// frozen reports whether node was stopped by Freeze and not thawed.
func (c *Cluster) frozen(node string) bool { return c.procs.Frozen(node) }

// Running reports whether node's process runs (frozen counts as running).
func (c *Cluster) Running(node string) bool { return c.procs.Running(node) }

// Kill sends SIGKILL to node's process and waits for it to exit.
func (c *Cluster) Kill(node string) error {
	_, err := c.procs.Kill(node)
	return err
}

// Freeze stops node's process with SIGSTOP: it keeps its sockets but does
// nothing, like a node cut off or paused (it cannot renew its lease).
func (c *Cluster) Freeze(node string) error { return c.procs.Freeze(node) }

// Thaw resumes a frozen node with SIGCONT.
func (c *Cluster) Thaw(node string) error { return c.procs.Thaw(node) }

// UseFrontendProxies makes the arrays opened from now on reach each node's
// frontend through a TCP proxy that ResetFrontend can reset.
func (c *Cluster) UseFrontendProxies() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proxies != nil {
		return nil
	}
	c.proxies = map[string]*frontProxy{}
	for _, n := range c.Config.Nodes {
		p, err := newFrontProxy(n.AdvertiseAddr(n.Frontend))
		if err != nil {
			return fmt.Errorf("frontend proxy for node %s: %w", n.Name, err)
		}
		c.proxies[n.Name] = p
	}
	return nil
}

// ResetFrontend resets (TCP RST) every host connection to node's frontend
// and returns how many there were; 0 without UseFrontendProxies.
func (c *Cluster) ResetFrontend(node string) int {
	c.mu.Lock()
	p := c.proxies[node]
	c.mu.Unlock()
	if p == nil {
		return 0
	}
	return p.Reset()
}

// Close stops every node it started: SIGCONT and SIGTERM, then SIGKILL for
// those still running after 5 s.
func (c *Cluster) Close() {
	c.mu.Lock()
	for _, p := range c.proxies {
		_ = p.Close()
	}
	c.mu.Unlock()
	c.procs.Stop(5 * time.Second)
}

// client returns an API client for node.
func (c *Cluster) client(node string) *api.Client {
	n, _ := c.Config.Node(node)
	return api.NewClient("http://"+n.AdvertiseAddr(n.API), "", &httpClient)
}

// Arrays returns the cluster's array views, asked of the running, unfrozen
// nodes in turn.
func (c *Cluster) Arrays(ctx context.Context) ([]api.Array, error) {
	var errs []error
	for _, n := range c.Nodes() {
		if !c.Running(n) || c.frozen(n) {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		as, err := c.client(n).Arrays(actx)
		cancel()
		if err == nil {
			return as, nil
		}
		errs = append(errs, fmt.Errorf("node %s: %w", n, err))
	}
	return nil, fmt.Errorf("no running node answered the array query: %w", errors.Join(errs...))
}

// Coordinator names the node that runs the state machine now ("" when
// unknown).
func (c *Cluster) Coordinator(ctx context.Context) string {
	for _, n := range c.Nodes() {
		if !c.Running(n) || c.frozen(n) {
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := c.client(n).Status(actx)
		cancel()
		if err == nil {
			return st.Coordinator
		}
	}
	return ""
}

// Healthy reports whether every array is active and optimal, and if not,
// which are not (as "name:state/phase@owner").
func Healthy(as []api.Array) (bool, []string) {
	var bad []string
	for _, a := range as {
		if a.State != cluster.StateOptimal || a.Phase != "active" || a.Owner == "" {
			var ms []string
			for _, m := range a.Members {
				if m.State != cluster.MemberOK {
					ms = append(ms, fmt.Sprintf("%s=%s", m.Drive, m.State))
				}
			}
			bad = append(bad, fmt.Sprintf("%s:%s/%s@%s%v", a.Name, a.State, a.Phase, a.Owner, ms))
		}
	}
	return len(bad) == 0, bad
}

// ErrStuck is returned by WaitHealthy when arrays stay unhealthy past the
// bound.
var ErrStuck = errors.New("arrays not back active and optimal")

// WaitHealthy waits until every array is active and optimal, checking
// every 250 ms, for at most bound. It returns how long that took; on
// timeout, an error wrapping ErrStuck naming the arrays still unhealthy.
func (c *Cluster) WaitHealthy(ctx context.Context, bound time.Duration) (time.Duration, []string, error) {
	return c.waitHealthy(ctx, bound, nil)
}

// waitHealthy is WaitHealthy calling trace with the unhealthy arrays
// whenever that list changes.
func (c *Cluster) waitHealthy(ctx context.Context, bound time.Duration, trace func(time.Duration, []string)) (time.Duration, []string, error) {
	start := time.Now()
	var last []string
	var lastErr error
	for {
		as, err := c.Arrays(ctx)
		if err == nil && len(as) == len(c.Config.Arrays) {
			ok, bad := Healthy(as)
			if ok {
				return time.Since(start), nil, nil
			}
			if trace != nil && !slices.Equal(bad, last) {
				trace(time.Since(start), bad)
			}
			last, lastErr = bad, nil
		} else if err != nil {
			lastErr = err
		}
		if time.Since(start) > bound {
			if last == nil {
				last = []string{"(no array view)"}
			}
			return time.Since(start), last, fmt.Errorf("after %v: %s (last query error: %v): %w", bound, strings.Join(last, " "), lastErr, ErrStuck)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), last, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// WaitArray waits until cond holds for the named array's view.
func (c *Cluster) WaitArray(ctx context.Context, name string, bound time.Duration, cond func(api.Array) bool) (api.Array, error) {
	start := time.Now()
	var last api.Array
	for {
		if as, err := c.Arrays(ctx); err == nil {
			for _, a := range as {
				if a.Name == name {
					last = a
					if cond(a) {
						return a, nil
					}
				}
			}
		}
		if time.Since(start) > bound {
			return last, fmt.Errorf("array %s: condition not reached in %v (last: %s/%s owner %s epoch %d)", name, bound, last.State, last.Phase, last.Owner, last.Epoch)
		}
		select {
		case <-ctx.Done():
			return last, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// hostID is the campaign host's NVMe host ID.
var hostID = [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 0x2d, 0x63, 0x61, 0x6d, 0x70, 0x61, 0x69, 0x67, 0x6e, 0x00, 0x01}

// OpenArray connects a multipath device to array over every node's
// frontend. Paths of nodes not running are left out (they cannot be added
// later).
func (c *Cluster) OpenArray(array string, hold time.Duration, log *slog.Logger) (*host.Multipath, error) {
	if _, ok := c.Config.Array(array); !ok {
		return nil, fmt.Errorf("array %q is not in the site", array)
	}
	var paths []host.PathSpec
	for _, n := range c.Config.Nodes {
		if !c.Running(n.Name) {
			continue
		}
		addr := n.AdvertiseAddr(n.Frontend)
		c.mu.Lock()
		if p := c.proxies[n.Name]; p != nil {
			addr = p.Addr()
		}
		c.mu.Unlock()
		paths = append(paths, host.PathSpec{Addr: addr, Options: host.Options{
			SubNQN:          c.Config.SubsystemNQN(array),
			HostNQN:         "nqn.2014-08.io.tier0:campaign-host",
			HostID:          hostID,
			IOQueues:        1,
			QueueDepth:      32,
			KATO:            2 * time.Second,
			IOTimeout:       5 * time.Second,
			DialTimeout:     time.Second,
			ReconnectDelay:  200 * time.Millisecond,
			CtrlLossTimeout: time.Second,
			Logger:          log,
		}})
	}
	return host.NewMultipath(paths, host.MPOptions{HoldTimeout: hold, Logger: log})
}

type apiArray = api.Array

// LogPath is node's log file.
func (c *Cluster) LogPath(node string) string { return c.procs.LogPath(node) }

// LogSize is the current size of node's log file (0 if none).
func (c *Cluster) LogSize(node string) int64 {
	st, err := os.Stat(c.procs.LogPath(node))
	if err != nil {
		return 0
	}
	return st.Size()
}

// CountLog counts the lines of node's log after byte offset from that
// contain substr.
func (c *Cluster) CountLog(node string, from int64, substr string) int {
	b, err := os.ReadFile(c.procs.LogPath(node))
	if err != nil || from > int64(len(b)) {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(b[from:]), "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// Owners maps each array to its owner now.
func Owners(as []api.Array) map[string]string {
	m := map[string]string{}
	for _, a := range as {
		m[a.Name] = a.Owner
	}
	return m
}

// etcdPeers returns the nodes that run an embedded etcd member.
func (c *Cluster) etcdPeers() []string {
	var out []string
	for _, p := range c.Config.EtcdPeers() {
		out = append(out, p.Node)
	}
	slices.Sort(out)
	return out
}
