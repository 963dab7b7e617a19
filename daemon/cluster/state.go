package cluster

// phase is where an array is in the ownership cycle (docs/CONTROL-PLANE.md
// has the diagram): idle -> fencing -> assembling -> active, and from
// active through releasing (a planned move) or failed (the owner's RAID
// failed) back to fencing under a higher epoch.
type phase int

const (
	phaseIdle       phase = iota // no node serves it; reconcile assigns one
	phaseReleasing               // planned move: old owner is releasing
	phaseFencing                 // new owner: CAS + reservation preempt
	phaseAssembling              // new owner: assemble + repair
	phaseActive                  // owner serves it, ANA optimized
	phaseFailed                  // owner holds it but its RAID failed; it re-assembles it when members return
)

var phaseNames = [...]string{"idle", "releasing", "fencing", "assembling", "active", "failed"}

func (p phase) String() string { return phaseNames[p] }

// node is the machine's record of one node.
type node struct {
	id, domain   string
	drives       []string
	state        NodeState
	lastBeat     int64 // tick of the last lease renewal
	suspect      bool  // it suspects a partition: no new ownership, no failback
	draining     bool  // an operator drains it: its arrays move off
	slurmDrained bool  // the machine drained it in Slurm and has not resumed it
	// The registration its last NodeReturned named (NodeReturned.Started,
	// Fences); started 0: none known.
	started int64
	fences  uint64
}

// member is one drive of an array, as the machine sees it.
type member struct {
	drive, node string
	state       MemberState
	progress    int
	fails       int   // consecutive refused/failed repairs
	retryAt     int64 // no repair ordered before this tick
}

// array is the machine's record of one array: its definition, who owns
// it at which epoch and phase, the move under way, and its failures.
type array struct {
	name     string
	level    Level
	home     string
	policy   FailbackPolicy
	members  []*member
	owner    string
	epoch    uint64
	phase    phase
	target   string          // planned destination while releasing
	from     string          // owner before the current move
	kind     eventKind       // the move under way: kindAssign, kindFailover or kindHandoff
	since    int64           // tick the current outage or move began
	phaseAt  int64           // tick the current phase began
	retryAt  int64           // no planned move before this tick
	avoid    map[string]bool // nodes a failed takeover rules out until they come back
	asked    bool            // failback requested by an operator
	lastSeen ArrayState      // the state last recorded (kindState)

	fails     int    // consecutive failed takeovers (and re-assemblies of a failed array)
	homeFails int    // consecutive failed takeovers at the home node
	nextTry   int64  // no takeover before this tick (backoff)
	lastErr   string // the last refused or failed action, and why
	errMember string // the member lastErr is about; "" for a takeover
	failed    string // the array failed (ArrayFailed, or more members lost than parity): why
	failedBy  string // the owner that reported it; "" when the machine saw it
	waitBack  bool   // the engine failed with these members: wait for one to return
	resume    bool   // restored mid-takeover: send the owner's Fence again at its epoch
}

// resetForAssemble puts members whose repair was interrupted back in the
// queue and returns the members the new owner must treat as absent and
// those it attaches as stale (resynced from the write-intent bitmap next).
func (a *array) resetForAssemble() (absent, stale []string) {
	for _, mb := range a.members {
		switch mb.state {
		case MemberResyncing:
			mb.state, mb.progress = MemberStale, 0
		case MemberRebuilding:
			mb.state, mb.progress = MemberReplaced, 0
		}
		switch mb.state {
		case MemberOK:
		case MemberStale:
			stale = append(stale, mb.drive)
		default:
			absent = append(absent, mb.drive)
		}
	}
	return absent, stale
}

// absent counts members whose content cannot serve reads at all. A stale
// member (its node was away) still holds everything outside the regions
// its owner's write-intent bitmap marks dirty, so it counts as present.
func (a *array) absent() int {
	k := 0
	for _, mb := range a.members {
		if absentState(mb.state) {
			k++
		}
	}
	return k
}

func absentState(st MemberState) bool {
	switch st {
	case MemberOK, MemberStale, MemberResyncing:
		return false
	}
	return true
}

// redundant: every member is fully in sync.
func (a *array) redundant() bool {
	for _, mb := range a.members {
		if mb.state != MemberOK {
			return false
		}
	}
	return true
}

func (a *array) readable() bool { return a.absent() <= a.level.Parity() }

// canRetake: a takeover (or the re-assembly of a failed array) may start
// now.
func (a *array) canRetake(now int64) bool {
	return a.readable() && now >= a.nextTry && (a.failed == "" || !a.waitBack || a.recoverable())
}

// recoverable: an array its owner reported failed may be assembled again.
// Either every member is back (the engine assembles from the newest
// consistent set), or the members not fully in sync — absent, stale — are
// within parity. A stale member with another member still away is not
// enough: its dirty regions have nothing to be rebuilt from.
func (a *array) recoverable() bool {
	out := 0
	for _, mb := range a.members {
		if mb.state != MemberOK {
			out++
		}
	}
	return a.absent() == 0 || out <= a.level.Parity()
}

func (m *Machine) state(a *array) ArrayState {
	switch {
	case !a.readable() || a.failed != "":
		return StateFailed
	case a.phase != phaseActive || m.nodes[a.owner].state != NodeUp:
		return StateOffline
	}
	st := StateOptimal
	for _, mb := range a.members {
		switch mb.state {
		case MemberResyncing, MemberRebuilding:
			return StateRebuilding
		case MemberOK:
		default:
			st = StateDegraded
		}
	}
	return st
}
