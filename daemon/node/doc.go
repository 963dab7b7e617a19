// Package node is tier0d: it wires the layers of one node together per the
// site configuration.
//
//	local drives ──► backend target (exports them to the other nodes)
//	backend host ──► imports the members of the arrays this node owns
//	RAID engine  ──► one array per owned array
//	frontend target: every array's namespace on every node, ANA optimized
//	                 only where the array is owned
//
// Cluster state lives in etcd (package store). One node at a time, the
// coordinator (an etcd election), runs the failover state machine (package
// cluster) and hands each action to the node that must perform it through
// a task key; the node performs it and reports the outcome through a
// report key, which the coordinator feeds back to the machine. Self-fencing
// does not wait for the coordinator: a node that cannot renew its lease
// turns every ANA state inaccessible and stops its arrays on its own.
// docs/CONTROL-PLANE.md describes the protocol and the order of actions.
package node
