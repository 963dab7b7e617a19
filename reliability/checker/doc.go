// Package checker is tier0's acknowledged-write checker: a workload that
// writes self-describing blocks to one or more devices, remembers which
// writes were acknowledged and which were in flight (their outcome unknown)
// when something failed, and afterwards verifies every block it wrote.
//
// It follows the idea of Jepsen's register checker, per 4 KiB unit: each
// unit is a register, every write puts a new generation into it, and a read
// after any sequence of faults must return
//
//   - the newest generation whose write was acknowledged, or
//   - a newer generation whose write was issued but not acknowledged (in
//     flight when a fault hit: it may or may not have landed),
//
// never an older generation (stale: an acknowledged write was lost or a
// fenced owner's late write landed), never zeroes once a write was
// acknowledged (lost), and never a torn or foreign block (corrupt).
//
// Blocks use the bench package's verify unit format (bench.FillUnit): a
// 32-byte header with magic, CRC32C, device id, LBA and generation, then a
// pattern derived from them, so that a torn unit fails its CRC and a unit
// written to the wrong place names where it belonged.
//
// # Concurrency
//
// Each target's units are split into contiguous slices, one per worker, and
// a unit is only ever written by the worker that owns its slice, one write
// at a time. Writes to one unit are therefore totally ordered by issue, and
// generations increase along that order, which is what makes "older" well
// defined. Many workers (and targets) run at once. With Options.ReadAny a
// worker's reads may cover any units of its target, concurrently with
// their owners' writes.
//
// # Reads and the history
//
// Every read is checked when it returns: no read may return data older
// than the newest write acknowledged before the read was issued (stale),
// nor zeroes once a write was acknowledged (lost), nor a torn or foreign
// block (corrupt). Every read and write, the final verification's reads
// included, is also recorded with its invoke and complete times in a
// history (package reliability/history); CheckHistory checks that record
// for linearizability, per unit, which also catches what no single read
// can show (old data coming back after a newer read, a failed write that
// landed after its successor).
package checker
