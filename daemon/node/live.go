package node

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
	"tier0/daemon/nvme"
	"tier0/daemon/raid"
	"tier0/daemon/slurm"
	"tier0/daemon/slurm/drain"
	"tier0/daemon/store"
)

// leaseMargin is subtracted from the lease's local deadline: the node
// fences itself that long before the store can expire its lease at the
// earliest. It covers clock-rate drift between the node and the store and
// the time self-fencing takes (which is bounded: see selfFence).
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 5 }

// leaseHeld is the frontend gate's per-request lease check: nil while the
// lease is sure to be held (or no lease is tracked yet: nothing is served
// before the first registration), else the error to answer with.
func (n *Node) leaseHeld() error {
	l := n.lease.Load()
	if l == nil || l.Held() {
		return nil
	}
	return fmt.Errorf("node %s can no longer be sure it holds its lease (deadline %s passed): %w", n.me.Name, l.Deadline().Format(time.RFC3339Nano), blockdev.ErrNoPath)
}

// lease is what the liveness loop needs of a store.Liveness.
type lease interface {
	Lost() <-chan struct{}
	Err() error
	Deadline() time.Time
}

// awaitLeaseLoss returns why the lease can no longer be trusted: the store
// said so (Lost), or — on the node's own timer, whatever the etcd client
// is doing — its local deadline minus margin passed without a renewal. It
// returns "" when ctx ends first.
func awaitLeaseLoss(ctx context.Context, clk clock.Clock, l lease, margin time.Duration) string {
	for {
		wait := l.Deadline().Add(-margin).Sub(clk.Now())
		if wait <= 0 {
			return fmt.Sprintf("lease not renewed by its local deadline %s minus margin %s (local watchdog)", l.Deadline().Format(time.RFC3339Nano), margin)
		}
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ""
		case <-l.Lost():
			t.Stop()
			return "lease lost: " + errString(l.Err())
		case <-t.C():
			// Re-read the deadline: a renewal may have moved it on.
		}
	}
}

// livenessLoop holds this node's lease. When the lease is lost the node
// fences itself at once — before the store can expire the lease and the
// coordinator hand its arrays on — then registers again.
func (n *Node) livenessLoop(ctx context.Context) error {
	ttl := n.cfg.Policies.LeaseTTL.D()
	margin := leaseMargin(ttl)
	var drives []string
	for _, d := range n.me.Drives {
		drives = append(drives, d.Name)
	}
	info := store.NodeInfo{Node: n.me.Name, Domain: n.me.Domain, Drives: drives, API: n.me.AdvertiseAddr(n.me.API), Started: n.started}
	fencedBefore := false
	for ctx.Err() == nil {
		// Started and Fences name this registration: the coordinator hears
		// it from the store's watch and from the "returned" report below,
		// and takes the two for one return (cluster.NodeReturned).
		live, err := n.register(ctx, info, ttl, margin)
		if err != nil {
			n.log.Warn("lease registration failed; retrying", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-n.clk().After(time.Second):
			}
			continue
		}
		n.mu.Lock()
		n.live = live
		n.mu.Unlock()
		n.lease.Store(live)
		n.leaseGen.Add(1)
		n.fenced.Store(false)
		n.metrics.LeaseHeld.Set(1)
		n.metrics.Fenced.Set(0)
		if fencedBefore {
			// Back after fencing itself: it serves nothing now. Say so, in
			// case the coordinator saw the new lease before it rebuilt its
			// machine from a record that still said "serving".
			n.sendReport(report{Kind: "returned", Started: unixNano(info.Started), Fences: info.Fences})
			fencedBefore = false
		}
		why := awaitLeaseLoss(ctx, n.clk(), live, margin)
		if why == "" {
			return nil
		}
		n.metrics.LeaseHeld.Set(0)
		n.selfFence(why)
		// Abandon waits for the store's renewal loop, which a hung etcd
		// client may hold: only after the node has fenced itself.
		live.Abandon()
		fencedBefore = true
		info.Fences++
		n.fences.Store(info.Fences)
	}
	return nil
}

// unixNano is t in Unix nanoseconds, 0 for the zero time (no identity:
// cluster.NodeReturned).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func errString(err error) string {
	if err == nil {
		return "unknown"
	}
	return err.Error()
}

// housekeeping runs the periodic duties of an owner: clearing the
// write-intent bits of quiet regions, publishing observed state and
// metrics, every policies.housekeeping_interval (default 1 s).
func (n *Node) housekeeping(ctx context.Context) {
	t := n.clk().NewTicker(cmp.Or(n.cfg.Policies.HousekeepingInterval.D(), time.Second))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		n.mu.Lock()
		arrays := make([]*served, 0, len(n.arrays))
		for _, s := range n.arrays {
			arrays = append(arrays, s)
		}
		n.mu.Unlock()
		n.flushReports()
		n.retryANA(ctx)
		if i%5 == 0 {
			n.retryFailed(ctx)
		}
		n.scrubDue(n.clk().Now())
		for _, s := range arrays {
			s.mu.Lock()
			arr, epoch, serving := s.array, s.epoch, s.anaState() == nvme.ANAOptimized
			s.mu.Unlock()
			owned := 0.0
			n.metrics.SetArrayFailed(s.cfg.Name, s.arrayFailed())
			if arr == nil && s.arrayFailed() && epoch != 0 {
				// Failed and not re-assembled yet: still say so.
				_, _ = n.st.Put(ctx, store.Observed, "arrays", s.cfg.Name, s.observed(epoch, false, raid.Status{State: "failed"}))
			}
			if arr != nil {
				owned = 1
				if i%3 == 0 {
					if err := arr.Sweep(); err != nil {
						n.log.Debug("bitmap sweep", "array", s.cfg.Name, "err", err)
					}
				}
				st := arr.Status()
				_, _ = n.st.Put(ctx, store.Observed, "arrays", s.cfg.Name, s.observed(epoch, serving, st))
				n.metrics.Epoch.WithLabelValues(s.cfg.Name).Set(float64(epoch))
				if st.Progress.Total > 0 && st.Task != "" {
					n.metrics.RebuildRate.WithLabelValues(s.cfg.Name).Set(st.Progress.Rate)
				}
			}
			n.metrics.Owned.WithLabelValues(s.cfg.Name).Set(owned)
		}
		if alive, err := n.st.Nodes(ctx); err == nil {
			n.metrics.NodesUp.Set(float64(len(alive)))
		}
		if v, err := n.view(ctx); err == nil {
			n.metrics.SetArrays(n.me.Name, v.Arrays)
		}
	}
}

// startSlurm starts the Slurm drainer when the site enables Slurm.
func (n *Node) startSlurm() {
	if !n.cfg.Slurm.Enabled {
		return
	}
	n.drainer = drain.New(drain.Config{
		Slurm:     slurm.New(slurm.Options{Path: n.cfg.Slurm.Scontrol, Conf: n.cfg.Slurm.Conf, Logger: n.log.With("layer", "slurm")}),
		SlurmName: n.cfg.SlurmName,
		Redundant: n.nodeRedundant,
		Logger:    n.log.With("layer", "slurm"),
	})
}

func (n *Node) slurmDrain(node, reason string) {
	if n.drainer != nil {
		n.drainer.DrainFailedNode(node, reason)
	}
}

func (n *Node) slurmResume(node, _ string) {
	if n.drainer != nil {
		n.drainer.ResumeWhenRedundant(node)
	}
}

// nodeRedundant: node is up and every member on it is in sync.
func (n *Node) nodeRedundant(ctx context.Context, node string) (bool, error) {
	var v clusterView
	if _, err := n.st.Get(ctx, store.Observed, "cluster", "view", &v); err != nil {
		return false, err
	}
	for _, nv := range v.Nodes {
		if nv.Name == node && nv.State != "up" {
			return false, nil
		}
	}
	for _, a := range v.Arrays {
		for _, m := range a.Members {
			if m.Node == node && m.State != "ok" {
				return false, nil
			}
		}
	}
	return true, nil
}
