// Package blockdev defines the block device interface that every layer of
// tier0 stacks on: local drives, NVMe/TCP namespaces imported from other
// nodes, RAID arrays, and the in-memory, fault-injecting and recording devices
// used by tests.
//
// # Contract
//
// Addressing is in bytes. Every offset and every length passed to ReadAt,
// WriteAt, WriteZeroes and Discard must be a multiple of BlockSize();
// otherwise the call fails with an error wrapping ErrMisaligned and touches
// nothing. A range that does not lie entirely inside [0, Size()) fails with
// ErrOutOfRange and touches nothing. A zero-length request succeeds.
//
// Buffers belong to the caller. A device never keeps p after the call
// returns, and never writes into p on WriteAt. Devices opened with O_DIRECT
// (package local) may copy through an aligned bounce buffer when p is not
// page-aligned; callers on the hot path should pass buffers from
// AlignedBuffer to avoid the copy.
//
// Concurrency: all methods may be called from many goroutines at once.
// Concurrent writes to overlapping ranges have no defined order; callers that
// need an order (the RAID stripe lock does) must serialize them.
//
// Durability: a completed WriteAt may sit in a volatile cache. Flush returns
// once every write that completed before Flush was called is on stable
// storage. A device that implements FUAWriter can make a single write durable
// without a full flush.
//
// Errors: ReadAt and WriteAt return n < len(p) only together with a non-nil
// error. Errors wrap one of the sentinels below so that callers can test
// them with errors.Is; anything else is an unclassified failure of the
// medium or transport and should be treated like ErrIO.
package blockdev
