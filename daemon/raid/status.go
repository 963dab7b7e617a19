package raid

import (
	"fmt"
	"strings"
	"time"
)

// goneText describes the failed and missing members and the level's
// tolerance, e.g. "members 1 (read: ...) and 3 (missing at assembly)
// failed, 2 of 4; raid5 tolerates 1". Caller holds a.mu.
func (a *Array) goneTextLocked() string {
	var parts []string
	for r := range a.members {
		m := a.member(r)
		switch {
		case m == nil:
			parts = append(parts, fmt.Sprintf("%d (missing)", r))
		case uint8(m.state.Load()) == roleFailed && m.missing:
			parts = append(parts, fmt.Sprintf("%d (unreachable: %s)", r, m.reason))
		case uint8(m.state.Load()) == roleFailed || uint8(m.state.Load()) == roleEmpty:
			parts = append(parts, fmt.Sprintf("%d (%s)", r, m.reason))
		}
	}
	noun := "member"
	if len(parts) != 1 {
		noun = "members"
	}
	list := strings.Join(parts, ", ")
	if k := strings.LastIndex(list, ", "); k >= 0 {
		list = list[:k] + " and " + list[k+2:]
	}
	return fmt.Sprintf("%s %s failed, %d of %d; %s tolerates %d failed member(s)", noun, list, len(parts), a.geo.Members,
		a.geo.Level, a.geo.Level.redundancy(a.geo.Members))
}

// MemberStatus describes one role.
type MemberStatus struct {
	Role int
	// State: active, rebuilding, failed (its device refused a request,
	// or the operator failed it: a full rebuild brings it back) or
	// missing (not reachable, or not there at assembly: its writes are
	// tracked for a resync).
	State    string
	Reason   string
	Recovery int64 // rebuilding: stripes done
	// WithArray: failed when or after the array failed, so no write was
	// acknowledged after it left: a re-Assemble takes it back as active.
	WithArray bool
}

// Status is a snapshot of the array.
type Status struct {
	UUID     string
	Geometry Geometry
	State    string // optimal, degraded, failed, fenced, stopped
	Events   uint64
	Epoch    uint64
	Members  []MemberStatus
	Dirty    int64 // bitmap regions marked dirty
	Task     string
	Progress Event
	// Reason says why State is not optimal: for failed, which members
	// failed and why, and what brings the array back.
	Reason string
	// Unavailable counts the stripes that lack data while the array as a
	// whole runs (I/O to them fails with ErrUnavailable), e.g. a member
	// under delta resync plus another failure on RAID-5.
	Unavailable int64
	// Scrub is the state and the findings of the current or last scrub.
	Scrub ScrubStatus
}

// ScrubStatus describes the current or last scrub (StartScrub).
type ScrubStatus struct {
	Running    bool
	Repair     bool      // the run repairs what it finds
	Started    time.Time // zero: no scrub ran since the array started
	Finished   time.Time // zero while running, or when it stopped early
	Stripes    int64     // stripes checked
	Mismatches int64     // stripes whose parity (or mirrors) did not match
	Repaired   int64     // of those, repaired
	Unreadable int64     // stripes that could not be read (a member failed)
	Err        string    // why the run stopped early; "" when it completed
}

// Status reports the array's state.
func (a *Array) Status() Status {
	a.mu.Lock()
	s := Status{UUID: fmtUUID(a.uuid), Geometry: a.geo, Events: a.sbt.Events, Epoch: a.sbt.Epoch}
	for r := range a.members {
		m := a.member(r)
		ms := MemberStatus{Role: r, State: "missing"}
		if m != nil {
			switch uint8(m.state.Load()) {
			case roleActive:
				ms.State = "active"
			case roleFailed:
				ms.State = "failed"
				if m.missing {
					ms.State = "missing"
				}
				ms.WithArray = m.withArray
			case roleRebuilding:
				ms.State = "rebuilding"
				ms.Recovery = m.recovery.Load()
			}
			ms.Reason = m.reason
		}
		s.Members = append(s.Members, ms)
	}
	var notes []string
	for _, ms := range s.Members {
		switch ms.State {
		case "failed", "missing":
			notes = append(notes, fmt.Sprintf("member %d %s (%s)", ms.Role, ms.State, ms.Reason))
		case "rebuilding":
			notes = append(notes, fmt.Sprintf("member %d rebuilding", ms.Role))
		}
	}
	a.mu.Unlock()
	switch {
	case a.fenced.Load():
		s.State = "fenced"
		s.Reason = "another node owns the array now (a member refused a request as fenced)"
	case a.stopped.Load():
		s.State = "stopped"
		s.Reason = "closed or aborted"
	case a.dead.Load():
		s.State = "failed"
		if p := a.deadWhy.Load(); p != nil {
			s.Reason = *p
		}
	case a.degraded():
		s.State = "degraded"
		s.Reason = strings.Join(notes, "; ")
	default:
		s.State = "optimal"
	}
	s.Dirty = a.bm.count()
	s.Task, s.Progress = a.bg.current()
	s.Unavailable = a.unavailableStripes()
	if s.Unavailable > 0 {
		s.Reason += fmt.Sprintf("; %d stripes lack data (their chunks are on failed members and on members not yet rebuilt there) until a member returns", s.Unavailable)
	}
	s.Scrub = a.bg.scrubStatus()
	return s
}
