// Package drain is the daemon side of tier0's Slurm integration: a Drainer
// that tier0d calls when a node's storage role fails or recovers, and that
// drains or resumes the node in Slurm in the background.
//
// Every call returns at once; a goroutine per node applies the latest wish
// with scontrol (timeouts and retries in slurm.Client, and a later retry
// when Slurm stays unreachable). Tier0 only ever undoes its own drains: a
// node drained or downed with a reason that does not start with
// slurm.ReasonPrefix belongs to an administrator and is left alone.
//
// There is a window between reading a node's reason and resuming it in
// which an administrator's new drain could be resumed: scontrol offers no
// compare-and-swap. The window is one scontrol round trip.
package drain
