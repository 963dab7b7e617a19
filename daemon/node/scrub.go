package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/config"
	"tier0/daemon/raid"
)

// Scrub: the owner of an array reads every stripe and checks its parity
// (raid.Array.StartScrub), so that latent bad blocks are found while the
// array still has its redundancy. It starts on `tier0 array scrub NAME`
// (POST /v1/arrays/{name}/scrub: a scrubArray task to the owner, under the
// owner's epoch) and, with policies.scrub_interval, on a timer of the
// owner. Findings arrive as RAID events; the owner keeps the last run in
// a scrubRecord, publishes it with the array's observed state (tier0
// status, the API), sets the tier0_scrub_* metrics and writes scrub-done
// (or scrub-failed) to the event log.

// scrubArray is the scrub request for an array's owner, sent as a task.
type scrubArray struct {
	Array, Node string
	Epoch       uint64 // the owner's epoch the request was made at
	Repair      bool   // fix mismatches (RAID-5 rewrites parity; RAID-6 repairs a located bad chunk)
}

func (a scrubArray) Performer() string { return a.Node }
func (a scrubArray) String() string    { return "scrub " + a.Array }

// scrubRecord is the current or last scrub of an array on its owner.
type scrubRecord = api.ScrubStatus

// onScrubEvent folds a scrub event into the array's record (called from
// the RAID engine's goroutines: no locks, no blocking).
func (s *served) onScrubEvent(ev raid.Event) {
	old := s.scrub.Load()
	r := scrubRecord{}
	if old != nil {
		r = *old
	}
	switch ev.Kind {
	case raid.ScrubStarted:
		r = scrubRecord{Running: true, Repair: r.Repair, Started: ev.Time}
		if r.Started.IsZero() {
			r.Started = s.n.clk().Now()
		}
	case raid.ScrubMismatch:
		r.Mismatches++
		if ev.Repaired {
			r.Repaired++
		}
		if len(r.Stripes) < 16 {
			r.Stripes = append(r.Stripes, ev.Stripe)
		}
	case raid.ScrubDone:
		r.Running, r.Finished = false, ev.Time
		if r.Finished.IsZero() {
			r.Finished = s.n.clk().Now()
		}
		r.Mismatches = max(r.Mismatches, ev.Count)
	case raid.TaskFailed:
		r.Running, r.Finished, r.Error = false, s.n.clk().Now(), ev.Reason
	default:
		return
	}
	s.scrub.Store(&r)
	if ev.Kind == raid.ScrubDone || ev.Kind == raid.TaskFailed {
		n := s.n
		epoch := s.runEpoch.Load()
		n.goBG(func() {
			if n.metrics != nil {
				n.metrics.SetScrub(s.cfg.Name, r)
			}
			kind, msg := "scrub-done", fmt.Sprintf("scrub found %d parity mismatches (%d repaired)", r.Mismatches, r.Repaired)
			if r.Error != "" {
				kind, msg = "scrub-failed", "scrub stopped early: "+r.Error
			}
			n.log.Info(msg, "array", s.cfg.Name, "epoch", epoch)
			n.recordEvent(kind, s.cfg.Name, epoch, msg)
		})
	}
}

// startScrubLocked starts a scrub of the running array (s.mu held).
func (s *served) startScrubLocked(repair bool) error {
	if s.array == nil {
		return fmt.Errorf("array %s is not running on node %s", s.cfg.Name, s.n.me.Name)
	}
	if r := s.scrub.Load(); r != nil && r.Running {
		return fmt.Errorf("array %s: a scrub is already running (started %s)", s.cfg.Name, r.Started.Format(time.RFC3339))
	}
	prev := s.scrub.Load()
	next := scrubRecord{Running: true, Repair: repair, Started: s.n.clk().Now()}
	if err := s.array.StartScrub(repair); err != nil {
		return fmt.Errorf("array %s: scrub not started: %w", s.cfg.Name, err)
	}
	// Keep the record the engine's ScrubStarted may already have written.
	if cur := s.scrub.Load(); cur == prev {
		s.scrub.CompareAndSwap(prev, &next)
	}
	return nil
}

// doScrub performs a scrub request on the owner, under the epoch it was
// made at.
func (n *Node) doScrub(ctx context.Context, a scrubArray) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	refuse := func(reason string) {
		n.log.Warn("scrub refused", "array", a.Array, "epoch", a.Epoch, "reason", reason)
		n.recordEvent("scrub-failed", a.Array, a.Epoch, "scrub refused: "+reason)
	}
	if s.array == nil || s.epoch != a.Epoch {
		refuse(fmt.Sprintf("asked at epoch %d; the array runs here under epoch %d", a.Epoch, s.epoch))
		return
	}
	if _, err := n.ownsAt(ctx, a.Array, a.Epoch); err != nil {
		refuse(err.Error())
		return
	}
	if err := s.startScrubLocked(a.Repair); err != nil {
		refuse(err.Error())
		return
	}
	n.log.Info("scrub started", "array", a.Array, "epoch", a.Epoch, "repair", a.Repair)
	n.recordEvent("scrub-started", a.Array, a.Epoch, map[bool]string{false: "check only", true: "repairing mismatches"}[a.Repair])
}

// scrubDue starts the periodic scrub (policies.scrub_interval) of every
// array this node runs whose last scrub started longer ago than the
// interval. It skips arrays that are busy, degraded or failed.
func (n *Node) scrubDue(now time.Time) {
	every := n.cfg.Policies.ScrubInterval.D()
	if every <= 0 {
		return
	}
	for _, s := range n.servedAll() {
		if s.arrayFailed() || n.isFenced() || !s.mu.TryLock() {
			continue
		}
		func() {
			defer s.mu.Unlock()
			if s.array == nil {
				return
			}
			if s.lastScrub.IsZero() {
				// The interval counts from when this node started running
				// the array, so that a restart does not scrub everything.
				s.lastScrub = now
				return
			}
			if r := s.scrub.Load(); r != nil && !r.Started.IsZero() && r.Started.After(s.lastScrub) {
				s.lastScrub = r.Started
			}
			if now.Sub(s.lastScrub) < every {
				return
			}
			s.lastScrub = now
			if err := s.startScrubLocked(false); err != nil {
				if !errors.Is(err, raid.ErrDegraded) {
					n.log.Warn("periodic scrub not started", "array", s.cfg.Name, "err", err)
				}
				return
			}
			n.log.Info("periodic scrub started", "array", s.cfg.Name, "interval", every)
			n.recordEvent("scrub-started", s.cfg.Name, s.epoch, "periodic scrub (policies.scrub_interval "+every.String()+")")
		}()
	}
}

// ScrubArray implements api.Scrubber: it asks the array's owner to scrub it.
func (n *Node) ScrubArray(ctx context.Context, name string, repair bool) error {
	managed := n.managedArrays()
	if !slices.ContainsFunc(managed, func(a config.Array) bool { return a.Name == name }) {
		var names []string
		for _, a := range managed {
			names = append(names, a.Name)
		}
		return fmt.Errorf("array %q is not in the site config nor created online; expected one of %s: %w", name, strings.Join(names, ", "), api.ErrNotFound)
	}
	a, err := n.Array(ctx, name)
	if err != nil {
		return err
	}
	if a.Owner == "" || a.Phase != "active" {
		return fmt.Errorf("array %s has no active owner now (phase %q); scrub it once `tier0 array show %s` shows it active: %w", name, a.Phase, name, api.ErrConflict)
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := n.sendTask(ctx, scrubArray{Array: name, Node: a.Owner, Epoch: a.Epoch, Repair: repair}); err != nil {
		return fmt.Errorf("%v: %w", err, api.ErrUnavailable)
	}
	return nil
}
