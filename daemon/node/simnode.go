package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/nvme"
	"tier0/daemon/raid"
)

// SimNode is a node run by the in-process simulation (reliability/sim):
// the action executor of a real Node — Fence, Assemble, Release, SetANA,
// Resync/Rebuild, SelfFence, and self-fencing on a lost lease — over the
// Store and Fabric of its Options, with no listening socket: no backend
// or frontend target, no API, no task loop and no coordinator. The
// simulation is the coordinator (a cluster.Machine), the task queues and
// the lease keep-alive; it calls Perform for each task in order, and
// Registered/LeaseLost where livenessLoop would act. Each array's frontend
// namespace is its Device (the gate): the simulation's workload reads and
// writes through it as a host would through the frontend target.
type SimNode struct {
	n            *Node
	fencedBefore bool
}

// NewSimNode builds a simulated node; opts.Store and opts.Fabric are
// required, and every member drive needs a size in the site config.
func NewSimNode(opts Options) (*SimNode, error) {
	if opts.Store == nil || opts.Fabric == nil {
		return nil, fmt.Errorf("node: a simulated node needs Options.Store and Options.Fabric (got %T, %T)", opts.Store, opts.Fabric)
	}
	n, err := New(opts)
	if err != nil {
		return nil, err
	}
	n.st = opts.Store
	n.metrics = api.NewMetrics()
	n.started = n.clk().Now()
	for i := range n.cfg.Arrays {
		a := &n.cfg.Arrays[i]
		size, bs, err := n.plannedSize(a)
		if err != nil {
			return nil, err
		}
		// As startFrontend, without the target.
		s := &served{n: n, cfg: a, nqn: n.cfg.SubsystemNQN(a.Name), gate: &gate{size: size, bs: bs, held: n.leaseHeld}, ana: nvme.ANAInaccessible, pending: map[int]string{}}
		n.addServed(s)
	}
	return &SimNode{n: n}, nil
}

// Name is the node's name.
func (s *SimNode) Name() string { return s.n.me.Name }

// TaskKind is the task kind the coordinator sends an action under
// (sendTask).
func TaskKind(a cluster.Action) string {
	kind := strings.ToLower(fmt.Sprintf("%T", a))
	return kind[strings.LastIndex(kind, ".")+1:]
}

// Perform runs one action as the task loop would.
func (s *SimNode) Perform(ctx context.Context, a cluster.Action) {
	raw, err := json.Marshal(a)
	if err != nil {
		s.n.log.Warn("simulation: action not encoded", "action", a.String(), "err", err)
		return
	}
	s.n.perform(ctx, task{Kind: TaskKind(a), Action: raw})
}

// Registered is what livenessLoop does once a lease is registered: the
// node is not fenced any more, and a node back from fencing itself says it
// serves nothing ("returned").
func (s *SimNode) Registered(l Lease) {
	n := s.n
	n.mu.Lock()
	n.live = l
	n.mu.Unlock()
	n.lease.Store(l)
	n.leaseGen.Add(1)
	n.fenced.Store(false)
	if s.fencedBefore {
		n.sendReport(report{Kind: "returned"})
		s.fencedBefore = false
	}
}

// LeaseLost is what livenessLoop does when the lease can no longer be
// trusted: fence itself, stop renewing.
func (s *SimNode) LeaseLost(why string) {
	s.n.selfFence(why)
	if l := s.n.lease.Load(); l != nil {
		l.Abandon()
	}
	s.fencedBefore = true
}

// RetryFailed is the housekeeping's re-assembly of failed arrays.
func (s *SimNode) RetryFailed(ctx context.Context) { s.n.retryFailed(ctx) }

// RetryANA is the housekeeping's retry of optimized ANA orders that the
// store could not confirm when they came.
func (s *SimNode) RetryANA(ctx context.Context) { s.n.retryANA(ctx) }

// FlushReports is the housekeeping's delivery of reports the store did not
// take (outbox.go); it returns how many still wait.
func (s *SimNode) FlushReports() int {
	s.n.flushReports()
	return s.n.pendingReports()
}

// Device is the frontend namespace of array (nil when not configured).
func (s *SimNode) Device(array string) blockdev.Device {
	if sv := s.n.served(array); sv != nil {
		return sv.gate
	}
	return nil
}

// Serving reports the epoch the array runs under here (0: not running)
// and whether its frontend path is ANA optimized.
func (s *SimNode) Serving(array string) (epoch uint64, optimized bool) {
	sv := s.n.served(array)
	if sv == nil {
		return 0, false
	}
	return sv.runEpoch.Load(), sv.anaState() == nvme.ANAOptimized
}

// Fenced reports whether the node has fenced itself.
func (s *SimNode) Fenced() bool { return s.n.isFenced() }

// Wait waits for the node's background reports and records.
func (s *SimNode) Wait() { s.n.bg.Wait() }

// Quiesce waits, up to timeout of real time, until no array of the node
// has a background task (resync, rebuild, scrub) queued or running, or
// waits for a repair's end to be reported, then for the reports: the RAID
// engine's tasks run in goroutines of their own, and a simulation that
// waits for them at each step replays more often, and does not run its
// next step beside them. It reports whether every task ended in time.
//
// The engine's WaitIdle is the test: the running task's name (Status's
// Task) is empty while a task is queued and until its progress starts, so
// a resync that an assembly had just queued ran on after a Quiesce that
// looked only at it, and its end's report (goBG) raced with the
// simulation's next Wait.
//
// It waits on the wall clock, not the node's: under the simulation's fake
// clock nothing advances while it waits for goroutines to finish.
func (s *SimNode) Quiesce(timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	state := func(sv *served) (*raid.Array, int) {
		sv.mu.Lock()
		defer sv.mu.Unlock()
		return sv.array, len(sv.pending)
	}
	for {
		settled := true
		for _, sv := range s.n.servedAll() {
			arr, pending := state(sv)
			if arr == nil {
				continue
			}
			idle := make(chan struct{})
			// Returns once the array is idle or stopped (Abort, Close):
			// after a timeout it ends with the task or the simulation's
			// Stop, never later.
			go func() { arr.WaitIdle(); close(idle) }()
			select {
			case <-idle:
			case <-deadline.C:
				return false
			}
			if pending > 0 {
				settled = false // cleared by the goroutine that reports the task's end
			}
		}
		// The reports of the tasks' ends (and any other background
		// report): each task's goBG happened before its WaitIdle returned.
		s.n.bg.Wait()
		if settled {
			return true
		}
		select {
		case <-deadline.C:
			return false
		case <-time.After(100 * time.Microsecond):
		}
	}
}

// Stop aborts every array without writing (after a kill: the simulation
// has already cut the node off) and waits for the background work.
func (s *SimNode) Stop() {
	for _, sv := range s.n.servedAll() {
		sv.stop(true)
	}
	s.n.bg.Wait()
}

// HostID is a node's NVMe host ID (reservations are keyed by it).
func HostID(cfg *config.Config, node string) [16]byte { return hostID(cfg, node) }

// DecodeReport turns the value of a report key (reports/<seq>) into the
// state machine's event, with the node that sent it.
func DecodeReport(value []byte) (cluster.Event, string, error) {
	var r report
	if err := json.Unmarshal(value, &r); err != nil {
		return nil, "", fmt.Errorf("report %q: %w", value, err)
	}
	ev, err := r.event()
	return ev, r.Node, err
}

// legacyStaleRepair reintroduces, for the simulation's proof only, the
// rule of the parent of commit bd91d05 (issue 12, hole 1): a repair runs
// under the array's own epoch without checking that this node still owns
// it, and fenceNS preempts any holder whose key differs, newer ones too.
var legacyStaleRepair atomic.Bool

// SetLegacyStaleRepair turns the old, unsafe rule on or off for every
// node of the process. Only the simulation's regression proof calls it.
func SetLegacyStaleRepair(on bool) { legacyStaleRepair.Store(on) }
