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
//
// # Data path
//
// The shape is etcd-raft's. Step (machine.go) hands each event to the step
// function of its concern, as raft's Step hands a message to stepLeader or
// stepFollower; Tick checks the lease deadlines; both then reconcile, which
// moves every array one step toward its goal (served by one healthy owner,
// at home when possible, redundant) and emits the actions that takes;
// Ready hands them out in order. Each file does one thing:
//
//	machine.go    Machine, New, Step, Tick, Ready, Restore; the event router
//	liveness.go   stepLiveness: nodes join, renew or lose their lease,
//	              restart, fence themselves, suspect a partition
//	ownership.go  stepOwnership: takeovers (fence, assemble) and planned
//	              hand-offs (release), their failures and backoff
//	repair.go     stepRepair: drives fail and are replaced, members are
//	              resynced and rebuilt, an owner reports its array failed
//	operator.go   stepOperator: drain, undrain, failback requests
//	records.go    stepRecord: array definitions and the store's observed
//	              records (a machine rebuilt from the store)
//	reconcile.go  reconcile: per array and phase, what to do next
//	state.go      the machine's nodes, members and arrays, and the
//	              predicates on them (readable, redundant, recoverable)
//	view.go       read-only views (NodeView, ArrayView) for status and API
//	events.go     the events (inputs); actions.go the actions (outputs)
//	              and the kinds of recorded events; codec.go their JSON
//	config.go     Config and its defaults; types.go levels, states, errors
//
// The tests drive the machine through a simulated cluster (sim_test.go)
// with transcripts in its command language (simcmd_test.go; testdata/*.txt,
// regenerated with -rewrite) and random histories checked for the safety
// invariants (random_test.go).
package cluster
