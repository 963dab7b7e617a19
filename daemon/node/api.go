package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
	"tier0/daemon/nvme"
	"tier0/daemon/raid"
	"tier0/daemon/store"
)

// observedArray is what an owner publishes about a running array.
type observedArray struct {
	Owner   string           `json:"owner"`
	Epoch   uint64           `json:"epoch"`
	Serving bool             `json:"serving"` // ANA optimized here at Epoch
	Status  raid.Status      `json:"status"`
	Failed  bool             `json:"failed,omitempty"` // more members lost than the parity; not served
	Reason  string           `json:"reason,omitempty"` // why it failed
	Scrub   *api.ScrubStatus `json:"scrub,omitempty"`
	Time    time.Time        `json:"time"`
	// Started and Fences name the registration of the owner's process that
	// wrote the record (store.NodeInfo): a coordinator restoring its
	// machine trusts a "serving" record of the registration alive now
	// however long the store held it back (restoreEvents).
	Started int64  `json:"started,omitempty"`
	Fences  uint64 `json:"fences,omitempty"`
}

// observedStaleAfter: an observed record older than this is never taken
// for the owner's present state; owners publish theirs every second.
const observedStaleAfter = 30 * time.Second

// observed is the array's record for the store (s.mu not needed).
func (s *served) observed(epoch uint64, serving bool, st raid.Status) observedArray {
	reason := s.failReason()
	if reason == "" && st.State != "optimal" {
		reason = st.Reason // the RAID engine's: which members, and why
	}
	return observedArray{Owner: s.n.me.Name, Epoch: epoch, Serving: serving, Status: st,
		Failed: s.arrayFailed(), Reason: reason, Scrub: s.scrub.Load(), Time: s.n.clk().Now(),
		Started: unixNano(s.n.started), Fences: s.n.fences.Load()}
}

// ownerReports reads every array's observed record (absent: none). A
// record older than staleAfter is left out: its owner stopped publishing.
func (n *Node) ownerReports(ctx context.Context) []api.OwnerReport {
	const staleAfter = observedStaleAfter
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	raw, err := n.st.List(ctx, store.Observed, "arrays")
	if err != nil {
		return nil
	}
	var out []api.OwnerReport
	for _, a := range n.managedArrays() {
		b, ok := raw[a.Name]
		if !ok {
			continue
		}
		var o observedArray
		if json.Unmarshal(b, &o) != nil || n.clk().Since(o.Time) > staleAfter || (!o.Failed && o.Status.State == "") {
			continue
		}
		state := o.Status.State
		if o.Failed {
			state = "failed"
		}
		out = append(out, api.OwnerReport{Array: a.Name, Owner: o.Owner, Epoch: o.Epoch, Serving: o.Serving, State: state,
			Failed: o.Failed, Reason: o.Reason, Scrub: o.Scrub, Time: o.Time})
	}
	return out
}

func (n *Node) startAPI(ctx context.Context) error {
	n.metrics = api.NewMetrics()
	srv, err := api.NewServer(api.ServerOptions{
		Backend: n,
		Token:   n.opts.Token,
		// Mutating calls need the token, or a client certificate (mTLS),
		// or — without either — an API reachable only on loopback.
		AllowUnauthenticated: (n.opts.Token == "" && isLoopback(n.me.ListenAddr(n.me.API))) ||
			(n.opts.TLS != nil && n.opts.TLS.ClientAuth == tls.RequireAndVerifyClientCert),
		TLS:     n.opts.TLS,
		Metrics: n.metrics,
		Logger:  n.log.With("layer", "api"),
	})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", n.me.ListenAddr(n.me.API))
	if err != nil {
		return fmt.Errorf("management API on %s: %w", n.me.ListenAddr(n.me.API), err)
	}
	n.api = srv
	go func() {
		if err := srv.Serve(ctx, l); err != nil {
			n.log.Warn("management API stopped", "err", err)
		}
	}()
	return nil
}

func isLoopback(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// apiTimeout bounds every store read an API call makes, so that a node cut
// off from the etcd quorum answers 503 instead of hanging.
const apiTimeout = 3 * time.Second

func (n *Node) view(ctx context.Context) (clusterView, error) {
	var v clusterView
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if n.st == nil {
		return v, fmt.Errorf("store not open yet: %w", api.ErrUnavailable)
	}
	if _, err := n.st.Get(ctx, store.Observed, "cluster", "view", &v); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return v, fmt.Errorf("no coordinator has published the cluster view yet: %w", api.ErrUnavailable)
		}
		return v, fmt.Errorf("%v: %w", err, api.ErrUnavailable)
	}
	return v, nil
}

func (n *Node) leaseState() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.live != nil && !n.fenced.Load() {
		return "held"
	}
	return "lost"
}

// Status implements api.Backend.
func (n *Node) Status(ctx context.Context) (api.Status, error) {
	v, err := n.view(ctx)
	if err != nil {
		return api.Status{}, err
	}
	return api.Status{Node: n.me.Name, Time: n.clk().Now(), Coordinator: v.Coordinator, Lease: n.leaseState(), Nodes: v.Nodes, Arrays: v.Arrays, Owners: n.ownerReports(ctx)}, nil
}

// Arrays implements api.Backend.
func (n *Node) Arrays(ctx context.Context) ([]api.Array, error) {
	v, err := n.view(ctx)
	return v.Arrays, err
}

// Array implements api.Backend.
func (n *Node) Array(ctx context.Context, name string) (api.Array, error) {
	v, err := n.view(ctx)
	if err != nil {
		return api.Array{}, err
	}
	for _, a := range v.Arrays {
		if a.Name == name {
			return a, nil
		}
	}
	return api.Array{}, fmt.Errorf("array %q: %w", name, api.ErrNotFound)
}

// Events implements api.Backend.
func (n *Node) Events(ctx context.Context, after int64, limit int) ([]api.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	evs, err := n.st.Events(ctx, after, limit)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, api.ErrUnavailable)
	}
	out := make([]api.Event, len(evs))
	for i, e := range evs {
		out[i] = api.Event(e)
	}
	return out, nil
}

// NodeHealth implements api.Backend: this node's storage role, as Slurm's
// hooks read it.
func (n *Node) NodeHealth(ctx context.Context) (api.NodeHealth, error) {
	h := api.NodeHealth{Node: n.me.Name, Daemon: "ok", Lease: n.leaseState(), DrivesMissing: []string{}, Redundant: true}
	h.Fenced = n.fenced.Load()
	for _, d := range n.me.Drives {
		if _, ok := n.drives[d.Name]; !ok {
			h.DrivesMissing = append(h.DrivesMissing, d.Name)
		}
	}
	v, err := n.view(ctx)
	if err != nil {
		h.Daemon = "starting"
		h.Redundant = false
		return h, nil
	}
	for _, a := range v.Arrays {
		ah := api.ArrayHealth{Name: a.Name, State: string(a.State), Owner: a.Owner}
		if s := n.served(a.Name); s != nil {
			// A path from this node: the owner's frontend is optimized.
			ah.PathUsable = a.Owner != "" && a.Phase == "active"
			if a.Owner == n.me.Name {
				s.mu.Lock()
				ah.PathUsable = s.array != nil && s.anaState() == nvme.ANAOptimized
				s.mu.Unlock()
			}
		}
		if a.State == cluster.StateRebuilding {
			h.RebuildActive = true
		}
		if a.State != cluster.StateOptimal {
			h.Redundant = false
		}
		h.Arrays = append(h.Arrays, ah)
	}
	if h.Fenced || len(h.DrivesMissing) > 0 {
		h.Daemon = "degraded"
	}
	return h, nil
}

func (n *Node) knownNode(node string) error {
	if _, ok := n.cfg.Node(node); !ok {
		return fmt.Errorf("node %q is not in the site config: %w", node, api.ErrNotFound)
	}
	return nil
}

// Drain implements api.Backend.
func (n *Node) Drain(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := n.knownNode(node); err != nil {
		return err
	}
	if _, err := n.st.Put(ctx, store.Desired, "drain", node, map[string]any{"since": n.clk().Now()}); err != nil {
		return fmt.Errorf("%v: %w", err, api.ErrUnavailable)
	}
	n.sendReport(report{Kind: "drain", Node: node})
	return nil
}

// Undrain implements api.Backend.
func (n *Node) Undrain(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := n.knownNode(node); err != nil {
		return err
	}
	if err := n.st.Delete(ctx, store.Desired, "drain", node); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%v: %w", err, api.ErrUnavailable)
	}
	n.sendReport(report{Kind: "undrain", Node: node})
	return nil
}

func (n *Node) arraysWith(drive string) ([]string, error) {
	if _, _, ok := n.cfg.Drive(drive); !ok {
		return nil, fmt.Errorf("drive %q is not in the site config: %w", drive, api.ErrNotFound)
	}
	var out []string
	for _, a := range n.managedArrays() {
		if slices.Contains(a.Members, drive) {
			out = append(out, a.Name)
		}
	}
	return out, nil
}

// FailDrive implements api.Backend.
func (n *Node) FailDrive(ctx context.Context, drive string) error {
	arrays, err := n.arraysWith(drive)
	if err != nil {
		return err
	}
	v, _ := n.view(ctx)
	for _, name := range arrays {
		// The owner fails the member in the running RAID at once; the
		// coordinator records it and waits for a replacement.
		for _, a := range v.Arrays {
			if a.Name == name && a.Owner != "" {
				if err := n.sendTask(ctx, failMember{Array: name, Node: a.Owner, Member: drive, Epoch: a.Epoch}); err != nil {
					return fmt.Errorf("%v: %w", err, api.ErrUnavailable)
				}
			}
		}
		n.sendReport(report{Kind: "member-failed", Array: name, Member: drive})
	}
	return nil
}

// failMember is the operator's "this drive failed" for the owner of an
// array; it is sent as a task like the state machine's actions.
type failMember struct {
	Array, Node, Member string
	Epoch               uint64 // the owner's epoch the request was made at
}

func (a failMember) Performer() string { return a.Node }
func (a failMember) String() string    { return "fail-member " + a.Array + " " + a.Member }

// ReplaceDrive implements api.Backend.
func (n *Node) ReplaceDrive(ctx context.Context, drive string) error {
	if _, err := n.arraysWith(drive); err != nil {
		return err
	}
	n.sendReport(report{Kind: "drive-replaced", Member: drive})
	return nil
}
