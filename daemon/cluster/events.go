package cluster

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

// NodeReturned: a node's daemon (re)started and registered a fresh lease,
// or it says it serves nothing any more. If the machine had not yet seen it
// lost (it restarted within its lease), everything the old process owned
// is taken over again and its members are resynced. A Heartbeat from a
// lost node means the same as NodeReturned.
//
// Started and Fences name the registration the event reports (the daemon's
// start, Unix nanoseconds, and how many times that process fenced itself:
// store.NodeInfo). The same registration reported twice (the store's watch
// and the node's own "returned" report) is one return: for a node the
// machine has up with that identity, the second is a heartbeat. Another
// Started (a restart) or more Fences (it fenced itself and stopped
// serving) takes its arrays over again. Without an identity (Started 0)
// every return of a node that is not down does.
type NodeReturned struct {
	Node    string
	Started int64  `json:",omitempty"`
	Fences  uint64 `json:",omitempty"`
}

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

// ArrayRemoved: an array deleted from the desired state (tier0 array
// delete). The machine forgets it: nothing more is decided for it, and
// later reports about it are refused as for an unknown array. The nodes
// stop serving it on their own (they watch the desired state).
type ArrayRemoved struct{ Name string }

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

// MemberFailed: the owner saw Member's drive fail (media error, write
// fault, removed), or the operator failed it. Epoch is the owner's (0:
// the operator's word, not checked); a superseded owner's is dropped.
type MemberFailed struct {
	Array, Member string
	Epoch         uint64
}

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
//
// Claimed says the owner of record claimed Epoch under the registration
// alive now (the store's claim is newer than the owner's lease): its
// takeover may still be under way — the coordinator that ordered it may
// have been replaced mid-move. Such an array is not assigned again: the
// machine resumes the takeover at Epoch (the owner's fence and assembly
// at an epoch it already holds are idempotent), and only a takeover that
// then reports nothing within the release timeout goes to a new epoch.
type ArrayObserved struct {
	Array   string
	Owner   string
	Epoch   uint64
	Serving bool
	Claimed bool
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
func (ArrayRemoved) isEvent()       {}
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
