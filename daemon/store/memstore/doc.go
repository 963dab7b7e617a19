// Package memstore is an in-memory control plane for the in-process
// simulation (reliability/sim): the store a node uses (node.Store), with
// the semantics daemon/node relies on and with time from an injected
// clock, so that a whole cluster's leases expire when the simulation
// advances its fake clock.
//
// What it keeps of etcd and package store: one revision counter over every
// key; leases with a TTL, counted on the clock, whose keys vanish when
// they expire or are revoked; ClaimOwnership's compare-and-swap (epochs
// only increase, the claimant's liveness key must exist); the append-only
// event log; Get/Put/Delete and prefix watches on the raw client
// (Client), for the task and report keys. What it leaves out: raft (the
// store is one linearizable map, never split), compaction, and
// transactions through the raw client.
//
// Each node reaches the store through its own View. Partition(node) cuts
// that node off: its calls fail at once with an error wrapping
// ErrUnreachable and context.DeadlineExceeded (what a call to an
// unreachable etcd ends with), its lease is not renewed, and its watches
// end.
package memstore
