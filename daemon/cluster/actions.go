package cluster

import (
	"fmt"
	"strings"
)

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
	Kind    string // one of the kinds below (eventKind)
	Array   string
	Node    string
	From    string
	To      string
	Epoch   uint64
	Ticks   int64 // duration of the move, for the kinds of a move
	Message string
}

// eventKind is the Kind of a RecordEvent. RecordEvent.Kind stays a plain
// string, as the store's event log and the metrics read it; the machine
// records only these kinds.
type eventKind string

const (
	// A move of ownership completed (Ticks is its duration). array.kind
	// says which kind the move under way is.
	kindAssign   eventKind = "assign"   // the array got its first owner
	kindFailover eventKind = "failover" // its owner was lost, restarted or fenced itself
	kindHandoff  eventKind = "handoff"  // a planned move: drain, failback

	kindRecovered      eventKind = "recovered"       // a failed array was assembled again
	kindTakeoverFailed eventKind = "takeover-failed" // a fence or assembly failed or timed out
	kindHandoffAborted eventKind = "handoff-aborted" // the old owner did not release in time
	kindState          eventKind = "state"           // the array's state changed: "old -> new"
	kindArrayFailed    eventKind = "array-failed"
	kindMemberFailed   eventKind = "member-failed"
	kindRepairFailed   eventKind = "repair-failed"

	kindNodeLost           eventKind = "node-lost"
	kindNodeReturned       eventKind = "node-returned"
	kindNodeRestarted      eventKind = "node-restarted"
	kindSelfFence          eventKind = "self-fence"
	kindLeaseRegained      eventKind = "lease-regained"
	kindPartitionSuspected eventKind = "partition-suspected"
	kindPartitionCleared   eventKind = "partition-cleared"
	kindDrain              eventKind = "drain"
	kindUndrain            eventKind = "undrain"
)

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
	if k := eventKind(a.Kind); k == kindFailover || k == kindHandoff {
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
