package raid

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
)

// Level is a RAID level.
type Level int

// Supported levels.
const (
	RAID0 Level = 0
	RAID1 Level = 1
	RAID5 Level = 5
	RAID6 Level = 6
)

func (l Level) String() string { return fmt.Sprintf("raid%d", int(l)) }

// ParseLevel accepts "raid5", "5", "RAID-6"...
func ParseLevel(s string) (Level, error) {
	for _, l := range []Level{RAID0, RAID1, RAID5, RAID6} {
		for _, n := range []string{l.String(), fmt.Sprint(int(l)), fmt.Sprintf("RAID%d", int(l)), fmt.Sprintf("RAID-%d", int(l)), fmt.Sprintf("raid-%d", int(l))} {
			if s == n {
				return l, nil
			}
		}
	}
	return 0, fmt.Errorf("RAID level %q: want one of raid0, raid1, raid5, raid6: %w", s, ErrInvalidConfig)
}

// redundancy is how many members the level can lose.
func (l Level) redundancy(members int) int {
	switch l {
	case RAID1:
		return members - 1
	case RAID5:
		return 1
	case RAID6:
		return 2
	}
	return 0
}

// Sentinel errors of the engine. Errors returned by the Array wrap them
// (or blockdev sentinels) so that callers can use errors.Is.
var (
	// ErrInvalidConfig: Create or Assemble was given impossible values.
	ErrInvalidConfig = errors.New("invalid RAID configuration")
	// ErrTooManyFailed: more members are missing or failed than the level
	// tolerates; the array refuses all I/O rather than return wrong data.
	ErrTooManyFailed = errors.New("too many failed members: array data unavailable")
	// ErrDegraded: an operation needs full redundancy (for example Check on
	// a region that cannot be verified, or a scrub repair) and a member is
	// missing. Reads and writes never fail with it: they run degraded.
	ErrDegraded = errors.New("array degraded")
	// ErrMismatch: a member's superblock belongs to another array or has
	// another geometry.
	ErrMismatch = errors.New("member does not belong to this array")
	// ErrStale: a member's superblock is older than the array's (it missed
	// writes); it can only come back through ReAdd or Replace.
	ErrStale = errors.New("member is stale")
	// ErrNoSuperblock: a member carries no valid tier0 RAID superblock.
	ErrNoSuperblock = errors.New("no RAID superblock")
	// ErrStaleEpoch: the array was last assembled under a newer ownership
	// epoch than the caller holds; another node owns it.
	ErrStaleEpoch = errors.New("array owned under a newer epoch")
	// ErrInconsistent: Check found a stripe whose parity does not match.
	ErrInconsistent = errors.New("parity inconsistent")
	// ErrStopped: the array was closed or aborted. It wraps
	// blockdev.ErrClosed, as the Device contract asks, so that the frontend
	// answers Namespace Not Ready (the host retries on another path) and
	// not a media error.
	ErrStopped = fmt.Errorf("array stopped: %w", blockdev.ErrClosed)
	// ErrUnavailable: a stripe lacks data — more of its chunks are on
	// failed members or on members not yet rebuilt there than the level
	// reconstructs — while the array as a whole has not failed (a member
	// under delta resync plus another failure on RAID-5). Errors of I/O
	// to such a stripe wrap it and blockdev.ErrIO, and name the stripe
	// and the members. The stripe comes back when a member returns.
	ErrUnavailable = errors.New("stripe data unavailable")
	// ErrBusy: a background operation of that kind is already running.
	ErrBusy = errors.New("background operation already running")
	// ErrInFlight: a re-add found requests to the member's previous
	// device abandoned at a deadline (IOTimeout, SlowWrite) still
	// running; one landing after the resync would put old data under
	// newer writes. Re-add the member once they have ended.
	ErrInFlight = errors.New("member requests abandoned at a deadline still in flight")
)

// Config describes a new array (Create) and its run-time policy.
type Config struct {
	Level Level
	// ChunkSize in bytes: a power of two, a multiple of the members' block
	// size and at least 4 KiB. Default 64 KiB.
	ChunkSize int
	// UUID of the array; zero means a random one.
	UUID [16]byte
	// Epoch is the control plane's ownership epoch, stored in the
	// superblock. Assemble refuses a caller with a lower epoch.
	Epoch uint64
	// AssumeClean skips the initial parity sync (members known to be zero).
	AssumeClean bool
	// BitmapRegion is the data-area bytes per member that one write-intent
	// bit covers. Default 4 MiB (rounded to whole chunks).
	BitmapRegion int64
	// LogSlots is the number of partial parity log slots per member.
	// Default 64.
	LogSlots int
	// DisableLog turns the partial parity log off (tests only: shows the
	// write hole).
	DisableLog bool
	// Policy is the run-time behaviour; it is not stored on the members.
	Policy
}

// Policy is the run-time behaviour of an array.
type Policy struct {
	// Retries is how many times a failed member request is retried before
	// the member is marked failed. Timeouts are not retried.
	Retries int
	// IOTimeout bounds one member request; 0 leaves it to the device.
	IOTimeout time.Duration
	// SlowRead, when set, routes reads around a slow member: a RAID-5/6
	// read of one chunk piece that its member has not answered after
	// max(SlowRead, 4 × the other members' mean request time) is served
	// by reconstruction from the other members of the stripe; the slow
	// request finishes on a buffer of its own. The member is not failed
	// for it (IOTimeout does that). 0 = off. Well below IOTimeout, e.g.
	// 20 ms.
	SlowRead time.Duration
	// SlowWrite, when set, writes around a member that stops answering
	// (RAID-5/6): a member write or flush not completed after
	// max(SlowWrite, 4 × the other members' mean request time) is
	// abandoned as at IOTimeout (the request keeps its buffer until it
	// ends) and the member is made missing, so that the write completes
	// degraded; likewise a read a partial write needs. Only while the
	// array keeps its redundancy promise without the member (RAID-5: every
	// other member active; RAID-6: all but one); otherwise the request
	// waits up to IOTimeout. 0 = off. Well below IOTimeout, above a
	// member write's latency, e.g. 50 ms.
	SlowWrite time.Duration
	// RebuildRate limits rebuild, resync and scrub, in MiB/s; 0 = no limit.
	RebuildRate float64
	// Adaptive makes background work yield while foreground I/O runs.
	Adaptive bool
	// Unreachable tells a member error that means the member could not be
	// reached (its node or path is down, the request timed out) from one
	// the device itself returned (a media error). An unreachable member is
	// missing, not failed: every write it misses is in the write-intent
	// bitmap, and Assemble (or ReAdd) takes it back through a resync. nil
	// means: errors wrapping blockdev.ErrTimeout, ErrClosed or ErrNoPath.
	// The daemon adds the NVMe/TCP host's connection errors.
	Unreachable func(error) bool
	// ProgressEvery is the minimum interval between progress events.
	// Default 1 s.
	ProgressEvery time.Duration
	// Logger, Clock and Listener are injected; nil means slog.Default(),
	// clock.Real and no listener. The Clock times events, progress,
	// pacing and scrubs; the member I/O timeouts, hedges and latency
	// figures of the data path bound real I/O and stay on the wall clock
	// (no interface call or allocation per request).
	Logger   *slog.Logger
	Clock    clock.Clock
	Listener EventListener

	// replay: test-only scheduling knobs (background.go); nil here.
	replay *replayKnobs
}

// AssembleOptions are Assemble's parameters.
type AssembleOptions struct {
	// UUID, when non-zero, is the array to assemble; members of other
	// arrays are refused. Zero takes the UUID of the newest superblock.
	UUID [16]byte
	// Epoch is the caller's ownership epoch; it is stored. Assemble fails
	// with ErrStaleEpoch when the superblocks carry a newer one.
	Epoch uint64
	Policy
}

// Geometry is the shape of an array.
type Geometry struct {
	Level       Level
	Members     int
	DataDisks   int   // members' worth of data per stripe
	ParityDisks int   // parity (or mirror) members per stripe
	ChunkSize   int64 // bytes per member per stripe
	StripeSize  int64 // data bytes per stripe: DataDisks × ChunkSize
	Stripes     int64 // stripes (chunks per member data area)
	Capacity    int64 // array size in bytes
	BlockSize   int
	DataOffset  int64 // start of the data area on every member
}

// EventKind names an operational event.
type EventKind int

// Event kinds.
const (
	MemberFailed EventKind = iota + 1
	Degraded
	ArrayFailed
	Fenced
	RebuildStarted
	RebuildProgress
	RebuildDone
	ResyncStarted
	ResyncProgress
	ResyncDone
	ScrubStarted
	ScrubProgress
	ScrubMismatch
	ScrubDone
	LogReplayed
	MemberRejected
	Optimal
	// StripesUnavailable: a member failure left Count stripes without
	// enough in-sync chunks while the array as a whole still runs
	// (reads and writes of those stripes fail with ErrUnavailable).
	StripesUnavailable
	// TaskFailed: a background task (rebuild, resync, scrub) ended with
	// an error (Reason); Member is the rebuilt role or -1.
	TaskFailed
)

var eventNames = map[EventKind]string{
	MemberFailed: "member-failed", Degraded: "degraded", ArrayFailed: "array-failed", Fenced: "fenced",
	RebuildStarted: "rebuild-started", RebuildProgress: "rebuild-progress", RebuildDone: "rebuild-done",
	ResyncStarted: "resync-started", ResyncProgress: "resync-progress", ResyncDone: "resync-done",
	ScrubStarted: "scrub-started", ScrubProgress: "scrub-progress", ScrubMismatch: "scrub-mismatch", ScrubDone: "scrub-done",
	LogReplayed: "log-replayed", MemberRejected: "member-rejected", Optimal: "optimal",
	StripesUnavailable: "stripes-unavailable", TaskFailed: "task-failed",
}

func (k EventKind) String() string {
	if n, ok := eventNames[k]; ok {
		return n
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// Event is a typed operational event. Fields that do not apply are zero.
type Event struct {
	Kind   EventKind
	Array  [16]byte
	Time   time.Time
	Member int    // role index, -1 when not about one member
	Reason string // why (failure, rejection, mismatch details)
	// Missing (MemberFailed): the member could not be reached (a
	// timeout, a lost path), not refused by its device; it is taken
	// back under a resync once it answers. A member failed by its
	// device or by FailMember is to be replaced.
	Missing bool
	// WithArray (MemberFailed): the member left as the array failed
	// (more members gone than its parity): nothing was acknowledged
	// after it left, so its data is as current as the survivors'.
	WithArray bool
	// Progress of background work, in bytes of member data area.
	Done, Total int64
	Rate        float64 // bytes per second
	ETA         time.Duration
	Stripe      int64 // scrub mismatch: the stripe
	Repaired    bool  // scrub mismatch: repaired
	Count       int64 // LogReplayed: entries; ScrubDone: mismatches
}

// EventListener receives events. It is called synchronously from the
// engine's goroutines and must not block or call back into the Array.
type EventListener func(Event)
