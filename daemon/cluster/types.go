package cluster

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors returned by Step and New. Callers test them with
// errors.Is; the wrapped message names the value at fault.
var (
	// ErrUnknownNode: an event names a node that never joined.
	ErrUnknownNode = errors.New("unknown node")
	// ErrUnknownArray: an event names an array that was never defined.
	ErrUnknownArray = errors.New("unknown array")
	// ErrUnknownDrive: an array member or a drive event names a drive that
	// no joined node owns.
	ErrUnknownDrive = errors.New("unknown drive")
	// ErrBadConfig: a Config or an array definition breaks a rule (the
	// message says which and what to change).
	ErrBadConfig = errors.New("invalid cluster configuration")
)

// Level is an array's RAID level.
type Level int

const (
	RAID5 Level = 5
	RAID6 Level = 6
)

// Parity is the number of members the level may lose and stay readable.
func (l Level) Parity() int {
	if l == RAID6 {
		return 2
	}
	return 1
}

func (l Level) String() string { return fmt.Sprintf("raid%d", int(l)) }

// ParseLevel accepts "raid5" or "raid6".
func ParseLevel(s string) (Level, error) {
	switch strings.ToLower(s) {
	case "raid5", "5":
		return RAID5, nil
	case "raid6", "6":
		return RAID6, nil
	}
	return 0, fmt.Errorf("RAID level %q: want raid5 or raid6: %w", s, ErrBadConfig)
}

// ANAState is the asymmetric namespace access state a node reports for an
// array's namespace.
type ANAState string

const (
	ANAOptimized    ANAState = "optimized"
	ANAInaccessible ANAState = "inaccessible"
)

// ArrayState is the externally visible health of an array.
type ArrayState string

const (
	StateOptimal    ArrayState = "optimal"
	StateDegraded   ArrayState = "degraded"
	StateRebuilding ArrayState = "rebuilding"
	// StateFailed: more members are lost than the level has parity, or
	// the owner's RAID engine says so (ArrayFailed); the array is
	// unreadable until members return, then it is assembled again.
	StateFailed ArrayState = "failed"
	// StateOffline: the array is readable but no node serves it right now
	// (hand-off in progress, or no eligible node).
	StateOffline ArrayState = "offline"
)

// MemberState is the state of one array member.
type MemberState string

const (
	MemberOK          MemberState = "ok"
	MemberMissing     MemberState = "missing"    // its node is lost
	MemberStale       MemberState = "stale"      // node back, awaiting resync
	MemberResyncing   MemberState = "resyncing"  // delta resync running
	MemberDriveFailed MemberState = "failed"     // drive failed, awaiting replacement
	MemberReplaced    MemberState = "replaced"   // new drive in, awaiting rebuild
	MemberRebuilding  MemberState = "rebuilding" // full rebuild running
)

// NodeState is a node's liveness as the machine sees it.
type NodeState string

const (
	NodeUp NodeState = "up"
	// NodeFenced: the node failed to renew its lease and stopped acting as
	// owner; the store has not expired its lease yet.
	NodeFenced NodeState = "fenced"
	NodeDown   NodeState = "down"
)

// MemberSpec names one array member: a drive and the node that holds it.
type MemberSpec struct {
	Drive string
	Node  string
}
