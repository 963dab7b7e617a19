// Package local is the blockdev.Device over a local NVMe drive (or any
// block device) or a regular file, opened with O_DIRECT so that tier0's
// own caches and the RAID engine, not the page cache, decide what is
// durable and when.
//
// With O_DIRECT, reads and writes go through Linux native AIO: the
// caller's goroutine submits (io_submit) and waits for one reaper goroutine
// to deliver the completion, so a request costs no blocking system call
// and no OS thread of its own. Without AIO (Options.SyncIO, buffered
// fallback, or io_setup refused) requests run in the caller's goroutine as
// pread/pwrite. Either way at most Options.MaxInFlight requests are in
// flight at once, so that a burst cannot pin hundreds of OS threads. Buffers that are not page-aligned go through pooled aligned
// bounce buffers; pass blockdev.AlignedBuffer memory to avoid the copy.
package local
