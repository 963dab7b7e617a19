package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/cluster"
	"tier0/daemon/nvme"
	"tier0/daemon/store"
)

// The owner's side of a takeover, in the order the state machine asks for
// it: Fence (claim the epoch in the store, import the members, register
// the epoch as reservation key and preempt-and-abort the old owner on
// every member), Assemble (start the RAID; replay the partial parity log),
// SetANA optimized. A planned hand-off starts with Release on the old
// owner. Every step checks the store's ownership record first.

func (s *served) role(drive string) int { return slices.Index(s.cfg.Members, drive) }

// arrayUUID is the RAID UUID of a configured array: derived from its name,
// so that any node can assemble it and no other array's member is taken.
func (n *Node) arrayUUID(name string) [16]byte { return derive16("raid", n.cfg.Cluster, name) }

// stopLocked stops serving the array. abort stops it without writing
// (ownership lost); otherwise it flushes and records a clean stop.
func (s *served) stopLocked(abort bool) {
	_ = s.setANA(nvme.ANAInaccessible)
	s.gate.set(nil)
	if s.epoch != 0 {
		// Tell a coordinator rebuilding its machine that this array is not
		// served here any more (best effort: the record also ages out).
		epoch := s.epoch
		s.n.goBG(func() { s.n.publishStopped(s.cfg.Name, epoch) })
	}
	if s.array != nil {
		if abort {
			s.array.Abort()
		} else if err := s.array.Close(); err != nil {
			s.n.log.Warn("array close", "array", s.cfg.Name, "err", err)
		}
		s.array = nil
	}
	for i := range s.members {
		s.dropMember(i)
	}
	s.members, s.ctrls = nil, nil
	s.epoch = 0
	s.runEpoch.Store(0)
	s.anaPending = 0
	s.pending = map[int]string{}
	// Not run here any more: its failure is no longer this node's to
	// report, and the gate answers "not served" (unless the node is
	// fenced, which the gate keeps saying).
	s.clearFailed()
	if !s.n.isFenced() {
		s.gate.unblock()
	}
}

func (s *served) stop(abort bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(abort)
}

// owns reports whether the store names this node owner of the array at
// epoch.
func (n *Node) owns(ctx context.Context, array string, epoch uint64) (store.Ownership, bool) {
	own, err := n.ownsAt(ctx, array, epoch)
	return own, err == nil
}

// ownsAt is owns with the reason when not: the store cannot be read, or it
// names another owner or epoch.
func (n *Node) ownsAt(ctx context.Context, array string, epoch uint64) (store.Ownership, error) {
	if epoch == 0 {
		return store.Ownership{}, fmt.Errorf("the action carries no ownership epoch; it is refused (an owner-side action is always tied to the epoch that ordered it)")
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	own, err := n.st.Ownership(ctx, array)
	if err != nil {
		return own, fmt.Errorf("cannot confirm ownership of array %s at epoch %d: %w", array, epoch, err)
	}
	if own.Owner != n.me.Name || own.Epoch != epoch {
		return own, fmt.Errorf("the store names %s owner of array %s at epoch %d, not this node (%s) at epoch %d", orNobody(own.Owner), array, own.Epoch, n.me.Name, epoch)
	}
	return own, nil
}

func orNobody(s string) string {
	if s == "" {
		return "nobody"
	}
	return s
}

// newerOwner reports whether own names another owner (or epoch) newer than
// epoch: this node has been superseded for the array.
func (n *Node) newerOwner(own store.Ownership, epoch uint64) bool {
	return own.Epoch > epoch || (own.Epoch == epoch && own.Owner != "" && own.Owner != n.me.Name)
}

func (n *Node) served(name string) *served {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.arrays[name]
}

func (n *Node) isFenced() bool { return n.fenced.Load() }

// fenceErr is what the frontend answers while the node is fenced.
func (n *Node) fenceErr() error {
	why := "lease lost"
	if p := n.fenceWhy.Load(); p != nil {
		why = *p
	}
	return fmt.Errorf("node %s has fenced itself (%s) and serves no array until it holds a lease again: %w", n.me.Name, why, blockdev.ErrNoPath)
}

func (n *Node) doFence(ctx context.Context, a cluster.Fence) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	fail := func(reason string) {
		n.sendReport(report{Kind: "fence-failed", Array: a.Array, Epoch: a.NewEpoch, Reason: reason})
	}
	if n.isFenced() {
		fail("this node has lost its lease")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := n.st.ClaimOwnership(ctx, a.Array, n.me.Name, a.NewEpoch); err != nil {
		var ce *store.ConflictError
		if errors.As(err, &ce) {
			n.sendReport(report{Kind: "ownership-lost", Array: a.Array, Epoch: a.NewEpoch, Winner: ce.Current.Owner, WinnerEpoch: ce.Current.Epoch})
			return
		}
		fail(err.Error())
		return
	}
	// The re-assembly of an array that failed here (the coordinator's
	// fence of a failed array by its owner, or a retry of one).
	wasFailed := s.arrayFailed()
	if s.array != nil && s.epoch < a.NewEpoch {
		s.stopLocked(true) // re-taking under a new epoch: start afresh
	}
	got, se := s.importAll(ctx, a.NewEpoch, nil)
	if se != nil {
		s.supersededLocked(a.NewEpoch, se)
		fail(se.Error())
		return
	}
	need := len(s.cfg.Members) - s.cfg.Parity()
	if got < need {
		reason := fmt.Sprintf("fenced %d of %d members; at least %d are needed", got, len(s.cfg.Members), need)
		if wasFailed {
			// The array stays failed here, under the epoch just claimed:
			// the owner's retry (retryFailed) re-assembles it once enough
			// members answer and reports it assembled at that epoch, which
			// the coordinator accepts for a failed array. Members cut off
			// from this node alone bring no NodeReturned, and the
			// coordinator's next fence may be a whole backoff away
			// (docs/RELIABILITY.md known problem 9).
			s.epoch = a.NewEpoch
			s.markFailed(reason)
		}
		fail(reason)
		return
	}
	s.epoch = a.NewEpoch
	n.log.Info("fenced", "array", a.Array, "epoch", a.NewEpoch, "members", got)
	n.sendReport(report{Kind: "fence-done", Array: a.Array, Epoch: a.NewEpoch})
}

func (n *Node) doSetANA(ctx context.Context, a cluster.SetANA) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.State == cluster.ANAOptimized {
		if a.Epoch != 0 && a.Epoch != s.epoch {
			n.log.Warn("refusing optimized ANA state for another epoch", "array", a.Array, "asked", a.Epoch, "running", s.epoch)
			return
		}
		if s.array == nil || n.isFenced() {
			n.log.Warn("refusing optimized ANA state: the array is not running here", "array", a.Array)
			if s.array == nil && !n.isFenced() {
				n.notServing(a.Array, "optimized ANA state")
			}
			return
		}
		n.optimizeLocked(ctx, s, s.epoch, false)
		return
	}
	s.anaPending = 0
	_ = s.setANA(nvme.ANAInaccessible)
}

// optimizeLocked carries out an order to make the array's paths here
// optimized at epoch (s.mu held), once the store confirms this node owns
// the array at that epoch. When the store cannot be read (a cut, an
// election) or the hosts' reservations cannot be loaded, the order is
// kept (s.anaPending) and carried out by retryANA once the store
// answers: dropped, it left the array inaccessible on the owner of
// record after the cut, and nobody ordered it again, since the
// coordinator had seen it assembled (docs/RELIABILITY.md known problem
// 10). A store that names another owner or epoch ends the order, as do a
// stop, a newer epoch, a self-fence and a failure of the array here.
func (n *Node) optimizeLocked(ctx context.Context, s *served, epoch uint64, retry bool) {
	kept := s.anaPending == epoch // logged already
	keep := func(why string, err error) {
		if !kept {
			n.log.Warn("optimized ANA state deferred: "+why+"; retrying until the store answers", "array", s.cfg.Name, "epoch", epoch, "err", err)
		}
		s.anaPending = epoch
	}
	s.anaPending = 0
	if s.array == nil || s.epoch != epoch || n.isFenced() || s.arrayFailed() {
		return
	}
	own, err := n.readOwnership(ctx, s.cfg.Name)
	if err != nil {
		keep("the store cannot confirm ownership now", err)
		return
	}
	if own.Owner != n.me.Name || own.Epoch != epoch {
		n.log.Warn("refusing optimized ANA state: the store names another owner", "array", s.cfg.Name, "owner", orNobody(own.Owner), "owner_epoch", own.Epoch, "epoch", epoch)
		return
	}
	if err := s.setANA(nvme.ANAOptimized); err != nil {
		if n.isFenced() || s.arrayFailed() {
			n.log.Warn("ANA change failed", "array", s.cfg.Name, "err", err)
			return
		}
		keep("the ANA change failed", err)
		return
	}
	if retry {
		n.log.Info("optimized ANA state set after the store answered again", "array", s.cfg.Name, "epoch", epoch)
	}
}

// readOwnership reads the array's ownership record, bounded by apiTimeout.
func (n *Node) readOwnership(ctx context.Context, array string) (store.Ownership, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	return n.st.Ownership(ctx, array)
}

// retryANA carries out the optimized ANA orders kept by optimizeLocked
// (housekeeping, every tick). It skips an array whose task lock is busy.
func (n *Node) retryANA(ctx context.Context) {
	for _, s := range n.servedAll() {
		if !s.mu.TryLock() {
			continue
		}
		if epoch := s.anaPending; epoch != 0 {
			n.optimizeLocked(ctx, s, epoch, true)
		}
		s.mu.Unlock()
	}
}

// doRelease stops serving the array for a planned move. It is tied to the
// epoch that ordered it: a release of an older epoch than the one the
// array runs under here is stale and refused; the stop is clean (flushed,
// superblocks recorded) only while the store still names this node owner at
// that epoch, otherwise it aborts without writing.
func (n *Node) doRelease(ctx context.Context, a cluster.Release) {
	s := n.served(a.Array)
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.array != nil && s.epoch != a.Epoch {
		running := s.epoch
		s.mu.Unlock()
		n.log.Warn("release refused: ordered for another epoch than the array runs under here", "array", a.Array, "asked", a.Epoch, "running", running)
		return
	}
	abort := false
	if s.array != nil {
		if _, err := n.ownsAt(ctx, a.Array, a.Epoch); err != nil {
			n.log.Warn("release: this node is not the owner at the release's epoch; stopping without writing", "array", a.Array, "epoch", a.Epoch, "err", err)
			abort = true
		}
	}
	s.stopLocked(abort)
	s.mu.Unlock()
	n.log.Info("released", "array", a.Array, "epoch", a.Epoch, "to", a.To)
	n.sendReport(report{Kind: "released", Array: a.Array, Epoch: a.Epoch})
}

// selfFence stops acting as owner of anything. Its first part takes no
// lock that an action (s.mu, held across dials and assembly) or a request
// in flight can hold, so it is bounded by itself: set the node's fenced
// flag, close every array's gate (an atomic checked by every request
// before and after the RAID call: from here on no read or write of this
// node completes successfully), and turn every ANA state inaccessible
// (anaMu, held only around the target's state change). selfFence returns
// when that is done. Stopping the arrays — aborting the RAID without
// writing, closing the member connections — follows in the background,
// each under its array's task lock, for arrays opened under the lost
// lease (an array assembled under a later lease is left alone).
// docs/CONTROL-PLANE.md states the bound.
func (n *Node) selfFence(reason string) {
	n.fenceWhy.Store(&reason)
	n.fenced.Store(true)
	gen := n.leaseGen.Load()
	err := n.fenceErr()
	for _, s := range n.servedAll() {
		s.gate.block(err)
	}
	for _, s := range n.servedAll() {
		if aerr := s.setANA(nvme.ANAInaccessible); aerr != nil {
			n.log.Warn("self-fence: ANA change failed (the gate refuses I/O regardless)", "array", s.cfg.Name, "err", aerr)
		}
	}
	n.log.Warn("self-fenced: every array's frontend refuses I/O and is ANA inaccessible; stopping the arrays", "reason", reason)
	if n.metrics != nil {
		n.metrics.Fenced.Set(1)
	}
	for _, s := range n.servedAll() {
		n.goBG(func() { s.stopFenced(gen) })
	}
}

// stopFenced stops the array if it was opened under lease generation gen
// or earlier (the lease whose loss fenced the node).
func (s *served) stopFenced(gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.array != nil && s.openLease > gen {
		return
	}
	s.stopLocked(true)
}

// notServing tells the coordinator that this node was asked to act on an
// array it does not run (it stopped it when it fenced itself, say): the
// machine then treats the node as returned and takes its arrays over again
// under new epochs, rather than waiting on a stopped array.
func (n *Node) notServing(array, what string) {
	n.log.Warn("asked to act on an array that is not running here; reporting this node as returned", "array", array, "task", what)
	n.sendReport(report{Kind: "returned", Array: array})
}

// publishStopped records that array no longer runs here.
func (n *Node) publishStopped(array string, epoch uint64) {
	if n.st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, _ = n.st.Put(ctx, store.Observed, "arrays", array, observedArray{Owner: n.me.Name, Epoch: epoch, Serving: false, Time: n.clk().Now()})
}

// recordEvent appends an entry to the cluster's event log (best effort:
// the log is for people; the coordinator has the report).
func (n *Node) recordEvent(kind, array string, epoch uint64, msg string) {
	if n.st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := n.st.AppendEvent(ctx, store.Event{Kind: kind, Array: array, Node: n.me.Name, Epoch: epoch, Message: msg}); err != nil {
		n.log.Debug("event not recorded", "kind", kind, "array", array, "err", err)
	}
}

// goBG runs f in the background, tracked, so that shutdown (and a test)
// can wait for it before closing the store it writes to.
func (n *Node) goBG(f func()) {
	n.bg.add()
	go func() {
		defer n.bg.done()
		f()
	}()
}

// bgGroup counts the goroutines of goBG. Unlike a sync.WaitGroup it
// allows a start beside a wait: a RAID task's event (a report of its
// end, say) starts one whenever the task gets there, which may be while
// the simulation waits for the node (SimNode.Quiesce past its bound,
// SimNode.Wait). wait returns once the count is zero: every goroutine
// started before it has ended; one started beside it may be waited for
// or not, and the next wait covers it.
type bgGroup struct {
	mu   sync.Mutex
	cond sync.Cond
	n    int
}

func (g *bgGroup) add() {
	g.mu.Lock()
	g.n++
	g.mu.Unlock()
}

func (g *bgGroup) done() {
	g.mu.Lock()
	if g.n--; g.n == 0 && g.cond.L != nil {
		g.cond.Broadcast()
	}
	g.mu.Unlock()
}

// Wait waits until no goroutine of goBG runs.
func (g *bgGroup) Wait() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cond.L == nil {
		g.cond.L = &g.mu
	}
	for g.n > 0 {
		g.cond.Wait()
	}
}
