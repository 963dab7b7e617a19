// Package cluster is tier0's failover logic as a pure state machine: events
// (Step) and ticks (Tick) go in, an ordered list of actions (Ready) comes out.
// The machine does no I/O and reads no clock; the daemon feeds it what the
// cluster store and the local drivers observe, performs the actions in the
// documented order and reports their outcome back as events. The same
// machine, fed the same events, makes the same decisions on every node, and
// the store's compare-and-swap on ownership epochs makes sure only one node
// acts on a decision. See docs/CONTROL-PLANE.md for the state diagram and
// the order of actions.
//
// Time is counted in ticks. The daemon ticks at a fixed interval (one tick
// per second by default), so every duration in Config is a number of ticks.
package cluster
