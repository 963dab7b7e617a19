package host

import (
	"context"
	"fmt"

	"tier0/daemon/nvme"
)

// ANAState is re-exported for callers that only import host.
type ANAState = nvme.ANAState

// RefreshANA re-reads the controller's ANA log page and updates the group
// states that Namespace.ANAState and Multipath use. Subscribers
// (SubscribeANA) are notified.
func (c *Controller) RefreshANA(ctx context.Context) error {
	a, err := c.current(ctx)
	if err != nil {
		return err
	}
	n := nvme.ANALogHeaderLen + int(max(a.id.NANAGRPID, a.id.ANAGRPMAX, 1))*nvme.ANAGroupDescLen + 4*1024
	if n > 64<<10 {
		n = 64 << 10
	}
	n = (n + 3) &^ 3
	buf := make([]byte, n)
	if err := c.GetLogPage(ctx, nvme.LogANA, 0, 0xFFFFFFFF, 0, buf); err != nil {
		return fmt.Errorf("reading the ANA log of %s: %w", c.addr, err)
	}
	l, err := nvme.ParseANALog(buf)
	if err != nil {
		return fmt.Errorf("ANA log of %s: %w", c.addr, err)
	}
	c.anaMu.Lock()
	m := make(map[uint32]ANAState, len(l.Groups))
	for _, g := range l.Groups {
		m[g.GroupID] = g.State
	}
	c.ana = m
	c.anaGen++
	c.anaMu.Unlock()
	c.log.Debug("ANA log read", "groups", len(l.Groups), "chgcnt", l.ChangeCount)
	c.notifyANA()
	return nil
}

// refreshANAAsync re-reads the ANA log in the background: one read at a time
// per controller (many failing I/Os ask at once), and one more after it when
// asked again meanwhile, so that no change is missed.
func (c *Controller) refreshANAAsync() {
	c.anaAgain.Store(true)
	if !c.anaBusy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			c.anaAgain.Store(false)
			if err := c.RefreshANA(context.Background()); err != nil {
				c.log.Debug("re-reading the ANA log failed", "err", err)
			}
			c.anaBusy.Store(false)
			if !c.anaAgain.Load() || !c.anaBusy.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// GroupState returns the ANA state of group grp as last read from this
// controller (false when unknown).
func (c *Controller) GroupState(grp uint32) (ANAState, bool) {
	c.anaMu.Lock()
	defer c.anaMu.Unlock()
	s, ok := c.ana[grp]
	return s, ok
}

// SubscribeANA returns a channel that receives (without blocking the
// sender; capacity 1) whenever the ANA states or the connection state of
// the controller change.
func (c *Controller) SubscribeANA() <-chan struct{} {
	ch := make(chan struct{}, 1)
	c.anaMu.Lock()
	c.anaSub = append(c.anaSub, ch)
	c.anaMu.Unlock()
	return ch
}

func (c *Controller) notifyANA() {
	c.anaMu.Lock()
	defer c.anaMu.Unlock()
	for _, ch := range c.anaSub {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
