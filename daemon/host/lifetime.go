package host

import (
	"context"
	"fmt"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// supervise waits for the association to end, then reconnects with backoff
// until Close. It also enforces IOTimeout.
func (c *Controller) supervise(a *assoc) {
	defer c.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-a.dead:
		case <-c.closeCh:
			a.fail(errClosed)
			return
		case now := <-tick.C:
			for _, q := range append([]transport.Queue{a.admin}, a.io...) {
				if d := q.Oldest(now); d > c.opts.IOTimeout {
					c.log.Warn("command timed out; resetting the association", "qid", q.QID(), "waited", d)
					a.fail(fmt.Errorf("a command on queue %d waited %v, past the %v I/O timeout: %w", q.QID(), d.Round(time.Millisecond), c.opts.IOTimeout, blockdev.ErrTimeout))
				}
			}
			continue
		}
		break
	}
	c.mu.Lock()
	if c.cur == a {
		c.cur = nil
		c.ready = make(chan struct{})
		c.lost = c.opts.Clock.Now()
	}
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return
	}
	c.log.Warn("association lost; reconnecting", "err", a.err)
	c.notifyANA()
	delay := c.opts.ReconnectDelay
	quiesced := false // a's quiesce time has passed
	backoff := c.opts.Clock.NewTimer(delay)
	defer backoff.Stop()
	for {
		select {
		case <-c.closeCh:
			return
		case <-backoff.C():
		}
		if !quiesced && c.abandonedWrites(a) {
			if c.waitQuiesced(a, nil) != nil {
				return
			}
			quiesced = true
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*c.opts.DialTimeout)
		na, err := c.connect(ctx)
		cancel()
		if err == nil {
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				na.fail(errClosed)
				return
			}
			if a.abandoned && !quiesced {
				// a write was abandoned while this one connected
				c.mu.Unlock()
				na.fail(errClosed)
				delay = 0
				backoff.Reset(delay)
				continue
			}
			if c.sameIncarnation(a, na) != nil {
				c.mu.Unlock()
				return
			}
			a.replaced = true
			c.mu.Unlock()
			c.stats.reconnects.Add(1)
			c.install(na)
			return
		}
		delay = min(delay*2, maxReconnectDelay)
		c.log.Warn("reconnect failed", "err", err, "retry_in", delay)
		backoff.Reset(delay)
	}
}

// sameIncarnation (c.mu held) refuses, under Options.OneIncarnation, the
// new association na when the target's node restarted since a was made:
// a known incarnation that changed, or that the target no longer reports
// (another target answers: in doubt, refuse). It ends na, records why the
// controller stopped reconnecting and wakes the I/O waiting for it.
func (c *Controller) sameIncarnation(a, na *assoc) error {
	was, now := a.id.Incarnation, na.id.Incarnation
	if !c.opts.OneIncarnation || was == 0 || was == now {
		return nil
	}
	c.restarted = fmt.Errorf("controller %s: the target's node restarted (boot incarnation %#x, this connection was made to %#x), so writes completed before may be lost with its volatile cache: this connection ends; import the namespace again (a RAID owner re-adds the member and catches it up): %w: %w",
		c.addr, now, was, errCtrlDown, blockdev.ErrIO)
	c.log.Warn("the target's node restarted: not reconnecting to its new incarnation", "incarnation", now, "was", was)
	na.fail(c.restarted)
	close(c.ready)
	return c.restarted
}

// keepAlive sends Keep Alive every KATO/2 on the admin queue.
func (c *Controller) keepAlive(a *assoc) {
	defer c.wg.Done()
	if c.opts.KATO <= 0 {
		return
	}
	t := c.opts.Clock.NewTicker(c.opts.KATO / 2)
	defer t.Stop()
	for {
		select {
		case <-a.dead:
			return
		case <-t.C():
			cqe, err := c.adminRaw(a.admin, nvme.SQE{Opcode: nvme.AdminKeepAlive}, nil, nil)
			if err == nil && !cqe.Status.OK() {
				err = &StatusError{Op: "keep alive", Status: cqe.Status}
			}
			if err != nil {
				c.log.Warn("keep alive failed", "err", err)
				a.fail(fmt.Errorf("keep alive: %w", err))
				return
			}
		}
	}
}

// current returns the live association, waiting for a reconnect up to
// CtrlLossTimeout from the loss (or until ctx ends).
func (c *Controller) current(ctx context.Context) (*assoc, error) {
	for {
		c.mu.Lock()
		a, ready, closed, lost, restarted := c.cur, c.ready, c.closed, c.lost, c.restarted
		c.mu.Unlock()
		if closed {
			return nil, errClosed
		}
		if restarted != nil {
			return nil, restarted
		}
		if a != nil {
			return a, nil
		}
		limit := c.opts.CtrlLossTimeout
		wait := lost.Add(limit).Sub(c.opts.Clock.Now())
		if limit < 0 || wait <= 0 {
			return nil, fmt.Errorf("controller %s: %w for %v (reconnecting in the background): %w", c.addr, errCtrlDown, c.opts.Clock.Since(lost).Round(time.Millisecond), blockdev.ErrIO)
		}
		t := c.opts.Clock.NewTimer(wait)
		select {
		case <-ready:
			t.Stop()
		case <-t.C():
		case <-c.closeCh:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// quiesceTime is how long after the loss of an association the
// controller may still execute its commands (the command lifetime rule,
// docs/FABRIC.md; NVMe TP4129): the controller notices the loss within
// KATO (the keep-alive timeout it enforces for us) and then needs at most
// its Command Quiesce Time (Identify Controller CQT) to finish what it is
// executing. A controller that reports no CQT gets KATO alone, as Linux
// does. With keep-alive off the controller may never notice, and the I/O
// timeout stands in for KATO.
func quiesceTime(o *Options, cqt uint16) time.Duration {
	kato := o.KATO
	if kato <= 0 {
		kato = o.IOTimeout
	}
	return kato + time.Duration(cqt)*time.Millisecond
}

// waitQuiesced waits until the lost association a can no longer execute
// anything on the controller: quiesce after its loss. It returns errClosed
// when the controller (or cancel) closes first.
func (c *Controller) waitQuiesced(a *assoc, cancel <-chan struct{}) error {
	left := a.lostAt.Add(a.quiesce).Sub(c.opts.Clock.Now())
	if left <= 0 {
		return nil
	}
	c.log.Info("holding the writes of a lost association until the controller has quiesced it (KATO + CQT)",
		"cntlid", a.cntlid, "wait", left, "quiesce", a.quiesce, "cqt_ms", a.id.CQT)
	select {
	case <-c.opts.Clock.After(left):
		return nil
	case <-c.closeCh:
		return errClosed
	case <-cancel:
		return errClosed
	}
}

// abandon records that a write sent on the lost association a fails
// without waiting for a's quiesce (Options.FailFast). It reports false
// when a's successor is already being installed: the caller must then
// wait for the quiesce itself, since a command of the new association
// could otherwise run before the abandoned write.
func (c *Controller) abandon(a *assoc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.replaced {
		return false
	}
	a.abandoned = true
	return true
}

func (c *Controller) abandonedWrites(a *assoc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return a.abandoned
}

// lostWrite is the error of a write sent on a that was then lost, for a
// caller that does not resubmit it (ioFailFast): under ioAbandon it fails
// at once when a's successor is not installed yet (abandon), otherwise
// after a's quiesce; plain ioFailFast (Multipath) leaves the wait to the
// caller (lostError.wait).
func (c *Controller) lostWrite(a *assoc, flags int, err error) error {
	if flags&ioAbandon != 0 && !c.abandon(a) {
		if werr := c.waitQuiesced(a, nil); werr != nil {
			return fmt.Errorf("%w (while waiting for the lost association to quiesce: %w)", err, werr)
		}
	}
	return &lostError{err: err, c: c, a: a}
}
