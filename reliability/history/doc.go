// Package history records what a block workload did — every read and every
// write, with invoke and complete times from a monotonic clock, the value
// (the checker's unit generation) and the outcome — and checks the record
// for linearizability with porcupine, per 4 KiB unit: each unit is a
// register.
//
// # The model
//
// A unit holds a generation, 0 before its first write. A write of
// generation g sets it to g; a read returns it. A write that returned an
// error (outcome Unknown) may or may not have taken effect; if it did, it
// took effect after it was invoked and before the next write to that unit
// was invoked after it returned (the caller's next attempt; a write that
// lands later than that is the late write of a dead connection, which the
// data-safety rules forbid). A write with no later write stays possible
// until the end. Reads that failed tell nothing and are not recorded.
//
// A history breaks the model when a read returns
//
//   - zeroes after a write to the unit was acknowledged (lost),
//   - an older generation than one acknowledged before the read was
//     invoked (stale: a lost write, or a fenced owner's late write),
//   - an older generation than one an earlier read already returned
//     (resurrected: old data came back),
//   - a torn or foreign block (bad CRC, another unit's block, or a
//     generation never written to the unit: corrupt),
//
// or any other order no sequential execution explains (nonlinearizable);
// Check names each anomaly's kind, unit, operations around it and times.
package history
