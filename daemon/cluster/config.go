package cluster

import "fmt"

// FailbackPolicy says whether an array that runs away from its home node
// returns there on its own once it is redundant and the home is healthy.
type FailbackPolicy string

const (
	FailbackAuto   FailbackPolicy = "auto"
	FailbackManual FailbackPolicy = "manual"
)

// Config holds the timing and policy of the machine. All durations are in
// ticks.
type Config struct {
	// LeaseTicks is the liveness lease TTL: a node whose last heartbeat is
	// LeaseTicks old is treated as lost (as if LeaseExpired had arrived).
	// Zero disables this check; the daemon then relies on LeaseExpired
	// events from the store.
	LeaseTicks int64
	// SelfFenceTicks is how long a node goes without renewing its own
	// lease before it stops acting as owner (SelfFence). It must be
	// smaller than LeaseTicks by at least SafetyTicks so that the node is
	// fenced before the store can expire its lease and hand its arrays on.
	// Zero disables tick-driven self-fencing (SelfLeaseLost still works).
	SelfFenceTicks int64
	// SafetyTicks is the minimum margin LeaseTicks-SelfFenceTicks; it
	// covers clock-rate drift between the node and the store and the time
	// the node needs to turn its ANA state and stop writing. Default 1.
	SafetyTicks int64
	// ReleaseTimeoutTicks bounds each step of a move. A planned hand-off
	// (drain, failback) whose old owner has not reported Released by then
	// is abandoned (the array stays where it is) and retried after as many
	// ticks again; a takeover whose new owner has not reported FenceDone or
	// ArrayAssembled by then goes to another node under a higher epoch.
	// Default 5.
	ReleaseTimeoutTicks int64
	// BackoffMaxTicks caps the wait before a failed or refused action is
	// tried again: a takeover whose fence or assembly failed (or timed
	// out), the re-assembly of an array its owner reported failed, a
	// repair the owner refused. The first failed takeover goes to the next
	// candidate at once; after that the wait doubles with every
	// consecutive failure (1, 2, 4, ... ticks) up to this cap, so a
	// cluster whose nodes cannot act (a frozen store voter) sees a few
	// attempts, not one epoch per report. A node that returns cuts the
	// current wait short. Default DefaultBackoffMaxTicks.
	BackoffMaxTicks int64
	// Failback is the default failback policy (auto when empty).
	Failback FailbackPolicy
	// Self, when set, restricts tick-driven self-fencing to this node: a
	// daemon feeds only its own lease renewals as Heartbeats. Empty means
	// the machine models every node (simulation and tests).
	Self string
}

// DefaultBackoffMaxTicks is the default Config.BackoffMaxTicks.
const DefaultBackoffMaxTicks = 32

// homeAttempts is how many consecutive takeovers may fail at an eligible
// home node before the array is placed elsewhere: a home that fenced
// itself for a moment and came back with a lease takes its array back
// (after one backoff tick) instead of losing it to another node.
const homeAttempts = 2

func (c *Config) validate() error {
	if c.SafetyTicks == 0 {
		c.SafetyTicks = 1
	}
	if c.ReleaseTimeoutTicks == 0 {
		c.ReleaseTimeoutTicks = 5
	}
	if c.BackoffMaxTicks == 0 {
		c.BackoffMaxTicks = DefaultBackoffMaxTicks
	}
	if c.Failback == "" {
		c.Failback = FailbackAuto
	}
	if c.Failback != FailbackAuto && c.Failback != FailbackManual {
		return fmt.Errorf("failback policy %q: want auto or manual: %w", c.Failback, ErrBadConfig)
	}
	if c.LeaseTicks < 0 || c.SelfFenceTicks < 0 || c.SafetyTicks < 0 || c.ReleaseTimeoutTicks < 0 || c.BackoffMaxTicks < 0 {
		return fmt.Errorf("negative tick count in %+v: %w", *c, ErrBadConfig)
	}
	if c.SelfFenceTicks == 1 {
		return fmt.Errorf("self-fence after 1 tick fences a node between any two renewals (renewals come at most once a tick); use 2 or more: %w", ErrBadConfig)
	}
	if c.LeaseTicks > 0 && c.SelfFenceTicks > 0 && c.SelfFenceTicks+c.SafetyTicks > c.LeaseTicks {
		return fmt.Errorf("self-fence after %d ticks + safety %d exceeds lease TTL %d: a partitioned owner could still act when its arrays are handed on; lower SelfFenceTicks or raise LeaseTicks: %w",
			c.SelfFenceTicks, c.SafetyTicks, c.LeaseTicks, ErrBadConfig)
	}
	return nil
}
