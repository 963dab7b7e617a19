// Package store keeps tier0's cluster state in etcd: an embedded etcd
// member run by tier0d on the voting peers (3 or 5), or an existing etcd
// cluster given by endpoints. It provides node liveness by leases, array
// ownership and fencing epochs by compare-and-swap transactions, desired and
// observed state as JSON keys, an append-only event log, and watches.
//
// Key layout (under Options.Prefix, default "/tier0/"):
//
//	nodes/<node>              liveness; attached to the node's lease
//	owners/<array>            Ownership JSON; changed only by CAS
//	desired/<kind>/<name>     desired state JSON (arrays, policies)
//	observed/<kind>/<name>    observed state JSON (members, health, rebuild)
//	events/<unixnano>-<id>    Event JSON; created once, never changed
//
// First start of an embedded member bootstraps the cluster from the peer
// list; later starts find the data directory and rejoin. See
// docs/CONTROL-PLANE.md for replacing a dead voting member.
package store
