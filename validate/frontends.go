package validate

import (
	"fmt"
	"os"
	"strings"
	"time"

	"tier0/bench"
	"tier0/daemon/host"
)

// arrayID is the bench target ID of an array (the same on every layer, so
// that verify blocks written through one are valid through the other).
func arrayID(name string) string { return "array-" + strings.ToLower(name) }

func (r *runner) hostOptions(array string) host.Options {
	nqn := r.o.HostNQN
	if nqn == "" {
		h, _ := os.Hostname()
		nqn = "nqn.2014-08.io.tier0:validate:" + strings.ToLower(h)
	}
	return host.Options{
		SubNQN: r.cfg.SubsystemNQN(array), HostNQN: nqn,
		IOQueues: 2, QueueDepth: 64,
		KATO: 5 * time.Second, IOTimeout: 10 * time.Second,
		DialTimeout: 2 * time.Second, ReconnectDelay: 200 * time.Millisecond,
		CtrlLossTimeout: time.Second,
		Logger:          r.hostLog.With("array", array),
	}
}

// connectFrontends opens every array through every node's frontend.
func (r *runner) connectFrontends() error {
	for _, a := range r.arrays {
		var paths []host.PathSpec
		for i := range r.cfg.Nodes {
			n := &r.cfg.Nodes[i]
			paths = append(paths, host.PathSpec{Addr: n.AdvertiseAddr(n.Frontend), Options: r.hostOptions(a)})
		}
		m, err := host.NewMultipath(paths, host.MPOptions{HoldTimeout: r.t.hold, Logger: r.hostLog.With("array", a)})
		if err != nil {
			return fmt.Errorf("array %s frontend: %w", a, err)
		}
		r.fronts[a] = m
		if got := len(m.Paths()); got != len(paths) {
			return fmt.Errorf("array %s frontend: %d of %d paths connected; every node should serve it", a, got, len(paths))
		}
	}
	return nil
}

func (r *runner) frontTargets() []bench.Target {
	var ts []bench.Target
	for _, a := range r.arrays {
		ts = append(ts, bench.Target{ID: arrayID(a), Dev: r.fronts[a], Length: r.regionOf(r.fronts[a])})
	}
	return ts
}
