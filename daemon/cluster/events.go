package cluster

import (
	"fmt"
	"strings"
)

// Event is an input to Step. The set is closed: only the types below
// implement it.
type Event interface{ isEvent() }

// NodeJoined: a node registered in the store for the first time (or the
// daemon replays registrations at start). Drives are the node's local
// drive IDs, unique cluster-wide.
type NodeJoined struct {
	Node   string
	Domain string // failure domain (rack); empty = its own domain
	Drives []string
}

// Heartbeat: the node's liveness lease was renewed.
type Heartbeat struct{ Node string }

// LeaseExpired: the store expired the node's liveness lease.
type LeaseExpired struct{ Node string }

// NodeReturned: a node's daemon (re)started and registered a fresh lease.
// If the machine had not yet seen it lost (it restarted within its lease),
// everything the old process owned is taken over again and its members are
// resynced. A Heartbeat from a lost node means the same as NodeReturned.
type NodeReturned struct{ Node string }

// SelfLeaseLost: the node itself could not renew its lease (keep-alive
// failed or its deadline passed); it must stop acting as owner now.
type SelfLeaseLost struct{ Node string }

// PartitionSuspected: the node suspects it is cut off (peers unreachable)
// while its lease still looks valid. It takes no new ownership and no
// failback until PartitionCleared.
type PartitionSuspected struct{ Node string }

// PartitionCleared: the node reaches its peers again.
type PartitionCleared struct{ Node string }

// ArrayDefined: an array from the desired state. The home node owns it
// when healthy.
type ArrayDefined struct {
	Name     string
	Level    Level
	Home     string
	Members  []MemberSpec
	Failback FailbackPolicy // empty = Config.Failback
}

// FenceDone: Node won the ownership CAS at Epoch and preempted the old
// owner's reservations on every reachable member.
type FenceDone struct {
	Array string
	Node  string
	Epoch uint64
}

// FenceFailed: the fence at Epoch failed (reservation preempt refused,
// members unreachable). The machine picks another node.
type FenceFailed struct {
	Array  string
	Node   string
	Epoch  uint64
	Reason string
}

// OwnershipAcquired: the store confirms Node holds the array at Epoch.
type OwnershipAcquired struct {
	Array string
	Node  string
	Epoch uint64
}

// OwnershipLost: Node's CAS at Epoch lost; the store says Winner holds the
// array at WinnerEpoch. The machine adopts the store's truth.
type OwnershipLost struct {
	Array       string
	Node        string
	Epoch       uint64
	Winner      string
	WinnerEpoch uint64
}

// ArrayAssembled: Node assembled the array at Epoch (degraded if members
// were missing) and repaired the stripes in flight.
type ArrayAssembled struct {
	Array string
	Node  string
	Epoch uint64
}

// AssembleFailed: Node could not assemble the array at Epoch.
type AssembleFailed struct {
	Array  string
	Node   string
	Epoch  uint64
	Reason string
}

// Released: the old owner stopped serving the array (ANA inaccessible,
// writes drained and flushed, RAID stopped) for a planned hand-off.
type Released struct {
	Array string
	Node  string
	Epoch uint64
}

// ResyncDone: the delta resync of Member finished. Epoch is the one of the
// Resync action; a report from an earlier epoch (the array moved since) is
// ignored. Zero skips the check (tests).
type ResyncDone struct {
	Array, Member string
	Epoch         uint64
}

// RebuildProgress: a rebuild or resync of Member reached Percent.
type RebuildProgress struct {
	Array, Member string
	Percent       int
	Epoch         uint64
}

// RebuildDone: the full rebuild of Member finished.
type RebuildDone struct {
	Array, Member string
	Epoch         uint64
}

// ArrayFailed: the owner Node's RAID engine lost more members than the
// level has parity at Epoch (it stopped serving the array). Reason says
// why, in the engine's words. The owner is the authority: the machine
// shows the array failed until enough members return.
type ArrayFailed struct {
	Array  string
	Node   string
	Epoch  uint64
	Reason string
}

// RepairFailed: the owner refused or failed the Resync/Rebuild of Member
// ordered at Epoch. Reason says why. The machine orders it again after a
// backoff.
type RepairFailed struct {
	Array, Member string
	Epoch         uint64
	Reason        string
}

// MemberFailed: the owner saw Member's drive fail (media error, removed).
type MemberFailed struct{ Array, Member string }

// DriveReplaced: a failed drive was replaced in the same slot (same ID).
type DriveReplaced struct{ Drive string }

// DrainRequested: move every array off Node and give it no new ones.
type DrainRequested struct{ Node string }

// UndrainRequested: Node may own arrays again; its home arrays fail back
// under the auto policy.
type UndrainRequested struct{ Node string }

// FailbackRequested: an operator asks for the array to return home now
// (manual policy, or to retry).
type FailbackRequested struct{ Array string }

// ArrayObserved seeds the machine with what the store records about an
// array, for a machine (re)built from the store (a new coordinator, a
// restarted daemon): its ownership record and whether that owner reports
// serving it (its observed key says ANA optimized at Epoch). An owner that
// does not report serving it is treated as not serving, and the array is
// assigned again under a higher epoch. Members lists the recorded member
// states (absent drives keep theirs). A record older than the machine's
// epoch is ignored.
type ArrayObserved struct {
	Array   string
	Owner   string
	Epoch   uint64
	Serving bool
	Members map[string]MemberState
}

func (NodeJoined) isEvent()         {}
func (Heartbeat) isEvent()          {}
func (LeaseExpired) isEvent()       {}
func (NodeReturned) isEvent()       {}
func (SelfLeaseLost) isEvent()      {}
func (PartitionSuspected) isEvent() {}
func (PartitionCleared) isEvent()   {}
func (ArrayDefined) isEvent()       {}
func (FenceDone) isEvent()          {}
func (FenceFailed) isEvent()        {}
func (OwnershipAcquired) isEvent()  {}
func (OwnershipLost) isEvent()      {}
func (ArrayAssembled) isEvent()     {}
func (AssembleFailed) isEvent()     {}
func (Released) isEvent()           {}
func (ResyncDone) isEvent()         {}
func (RebuildProgress) isEvent()    {}
func (RebuildDone) isEvent()        {}
func (ArrayFailed) isEvent()        {}
func (RepairFailed) isEvent()       {}
func (MemberFailed) isEvent()       {}
func (DriveReplaced) isEvent()      {}
func (DrainRequested) isEvent()     {}
func (UndrainRequested) isEvent()   {}
func (FailbackRequested) isEvent()  {}
func (ArrayObserved) isEvent()      {}

// Action is an output of Ready. Performer names the node whose daemon must
// carry it out; "" means the cluster coordinator (the node holding the
// store's coordinator election). A daemon performs, in order, the actions
// addressed to itself (and, when coordinator, those addressed to "") and
// ignores the rest.
type Action interface {
	Performer() string
	String() string
}

// Fence: Node becomes owner of Array at NewEpoch. Order: (1) CAS the
// ownership key in the store from OldEpoch to NewEpoch (on failure report
// OwnershipLost); (2) register/preempt-and-abort the NVMe reservation on
// every reachable member with key NewEpoch, which cuts OldOwner off; (3)
// report FenceDone or FenceFailed.
type Fence struct {
	Array    string
	Node     string
	OldOwner string
	OldEpoch uint64
	NewEpoch uint64
	Members  []string
}

// Assemble: Node imports the members and assembles Array at Epoch,
// treating Degraded as absent and Stale as present but out of date in the
// regions the write-intent bitmap marks (a Resync follows), repairs
// in-flight stripes from the write intent log, then reports
// ArrayAssembled. It does not open the frontend; SetANA does.
type Assemble struct {
	Array    string
	Node     string
	Epoch    uint64
	Degraded []string
	Stale    []string
}

// Release: the current owner stops serving Array for a planned move: ANA
// state inaccessible, drain and flush in-flight writes, stop the RAID,
// then report Released.
type Release struct {
	Array string
	Node  string
	Epoch uint64
	To    string
}

// SetANA: Node sets its frontend ANA state for Array and raises the ANA
// change asynchronous event so hosts re-read it. Before turning optimized
// the performer checks that the store still records it as owner at Epoch;
// if not, the intent is stale (for example queued for an earlier
// incarnation of the node) and must be dropped.
type SetANA struct {
	Array string
	Node  string
	State ANAState
	Epoch uint64
}

// Export: Node (re-)exports its local drives on the backend fabric.
type Export struct {
	Node   string
	Drives []string
}

// Resync: the owner Node copies to Member only the regions its write
// intent bitmap marks as written while Member was away. Reports carry Epoch.
type Resync struct {
	Array, Node, Member string
	Epoch               uint64
}

// Rebuild: the owner Node reconstructs Member completely. Reports carry
// Epoch.
type Rebuild struct {
	Array, Node, Member string
	Epoch               uint64
}

// SelfFence: Node lost its lease: set ANA inaccessible on every array,
// stop submitting backend writes, stop every RAID it runs.
type SelfFence struct{ Node string }

// SlurmDrain / SlurmResume: the coordinator drains the compute node in
// Slurm because its storage role failed, or resumes it once healthy.
type SlurmDrain struct{ Node, Reason string }
type SlurmResume struct{ Node, Reason string }

// RecordEvent: the coordinator appends a typed event to the store's event
// log (and metrics count it).
type RecordEvent struct {
	Kind    string // failover, degraded, failed, recovered, handoff-aborted, ...
	Array   string
	Node    string
	From    string
	To      string
	Epoch   uint64
	Ticks   int64 // failover duration, for Kind failover
	Message string
}

func (a Fence) Performer() string       { return a.Node }
func (a Assemble) Performer() string    { return a.Node }
func (a Release) Performer() string     { return a.Node }
func (a SetANA) Performer() string      { return a.Node }
func (a Export) Performer() string      { return a.Node }
func (a Resync) Performer() string      { return a.Node }
func (a Rebuild) Performer() string     { return a.Node }
func (a SelfFence) Performer() string   { return a.Node }
func (a SlurmDrain) Performer() string  { return "" }
func (a SlurmResume) Performer() string { return "" }
func (a RecordEvent) Performer() string { return "" }

func (a Fence) String() string {
	old := a.OldOwner
	if old == "" {
		old = "-"
	}
	return fmt.Sprintf("fence %s by=%s old=%s epoch=%d->%d members=%s", a.Array, a.Node, old, a.OldEpoch, a.NewEpoch, strings.Join(a.Members, ","))
}
func (a Assemble) String() string {
	d := "-"
	if len(a.Degraded) > 0 {
		d = strings.Join(a.Degraded, ",")
	}
	s := fmt.Sprintf("assemble %s on=%s epoch=%d missing=%s", a.Array, a.Node, a.Epoch, d)
	if len(a.Stale) > 0 {
		s += " stale=" + strings.Join(a.Stale, ",")
	}
	return s
}
func (a Release) String() string {
	return fmt.Sprintf("release %s on=%s epoch=%d to=%s", a.Array, a.Node, a.Epoch, a.To)
}
func (a SetANA) String() string {
	return fmt.Sprintf("ana %s on=%s %s epoch=%d", a.Array, a.Node, a.State, a.Epoch)
}
func (a Export) String() string {
	return fmt.Sprintf("export %s drives=%s", a.Node, strings.Join(a.Drives, ","))
}
func (a Resync) String() string {
	return fmt.Sprintf("resync %s on=%s member=%s", a.Array, a.Node, a.Member)
}
func (a Rebuild) String() string {
	return fmt.Sprintf("rebuild %s on=%s member=%s", a.Array, a.Node, a.Member)
}
func (a SelfFence) String() string { return fmt.Sprintf("self-fence %s", a.Node) }
func (a SlurmDrain) String() string {
	return fmt.Sprintf("slurm-drain %s reason=%q", a.Node, a.Reason)
}
func (a SlurmResume) String() string {
	return fmt.Sprintf("slurm-resume %s reason=%q", a.Node, a.Reason)
}
func (a RecordEvent) String() string {
	var b strings.Builder
	b.WriteString("event ")
	b.WriteString(a.Kind)
	if a.Array != "" {
		b.WriteString(" array=" + a.Array)
	}
	if a.Node != "" {
		b.WriteString(" node=" + a.Node)
	}
	if a.From != "" || a.To != "" {
		fmt.Fprintf(&b, " from=%s to=%s", dash(a.From), dash(a.To))
	}
	if a.Epoch != 0 {
		fmt.Fprintf(&b, " epoch=%d", a.Epoch)
	}
	if a.Kind == "failover" || a.Kind == "handoff" {
		fmt.Fprintf(&b, " ticks=%d", a.Ticks)
	}
	if a.Message != "" {
		b.WriteString(": " + a.Message)
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
