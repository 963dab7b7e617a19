// Package target is tier0's NVMe/TCP target: it serves NVM subsystems whose
// namespaces are blockdev.Devices, and the discovery subsystem, to the Linux
// kernel host (nvme-cli, native multipath) and to tier0's own initiator.
//
// One Target listens on one TCP address (and optionally a second one, such
// as the well-known discovery port 8009); every port answers both discovery
// and I/O. The control plane changes what is served at run time:
// AddSubsystem, RemoveSubsystem, AddNamespace, RemoveNamespace, SetANAState,
// AllowHost, DisallowHost.
//
// Multipath: every node serves the same subsystem NQN and the same
// namespace NGUID/UUID (from configuration), with controller IDs from a
// range that is disjoint per node (Config.CntlIDBase). Each node sets the
// ANA state of each group; I/O to a namespace whose group is not optimized
// or non-optimized fails with the matching path status (ANA inaccessible,
// persistent loss, transition) so that the host retries on another path,
// and every ANA change is announced with an asynchronous event.
//
// Reservations (Register, Acquire, Release, Report) are keyed by the host
// identifier of Connect and persisted per namespace under Config.StateDir,
// so that a restarted target still fences a stale owner. Preempt-and-abort
// completes only after every command that passed the reservation check
// before it has finished on the device.
package target
