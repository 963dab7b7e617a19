package api

import "tier0/daemon/cluster"

// HealthInput is what a daemon knows about itself, for HealthFrom.
type HealthInput struct {
	Node          string
	Daemon        string // default "ok"
	Fenced        bool
	LeaseHeld     bool
	DrivesMissing []string // configured local drives that cannot be opened
	Arrays        []cluster.ArrayView
	// PathUsable says whether this node reaches the array's owner on the
	// frontend fabric; nil means yes. An array that is failed or offline
	// never has a usable path.
	PathUsable func(array string) bool
}

// HealthFrom builds the /v1/node/health report:
//   - redundant: every array member on this node is in sync (after a
//     return, its drives carry their share of redundancy again) and no
//     array is failed;
//   - rebuild_active: an array with a member on this node, or owned by it,
//     is resyncing or rebuilding;
//   - lease: "held" or "lost".
func HealthFrom(in HealthInput) NodeHealth {
	h := NodeHealth{Node: in.Node, Daemon: in.Daemon, Fenced: in.Fenced, Lease: "lost",
		DrivesMissing: append([]string{}, in.DrivesMissing...), Arrays: []ArrayHealth{}, Redundant: true}
	if h.Daemon == "" {
		h.Daemon = "ok"
	}
	if in.LeaseHeld {
		h.Lease = "held"
	}
	for _, a := range in.Arrays {
		usable := a.State != cluster.StateFailed && a.State != cluster.StateOffline
		if usable && in.PathUsable != nil {
			usable = in.PathUsable(a.Name)
		}
		h.Arrays = append(h.Arrays, ArrayHealth{Name: a.Name, State: string(a.State), Owner: a.Owner, PathUsable: usable})
		mine := a.Owner == in.Node
		for _, mb := range a.Members {
			if mb.Node != in.Node {
				continue
			}
			mine = true
			if mb.State != cluster.MemberOK {
				h.Redundant = false
			}
		}
		if a.State == cluster.StateFailed {
			h.Redundant = false
		}
		if mine && a.State == cluster.StateRebuilding {
			h.RebuildActive = true
		}
	}
	return h
}
