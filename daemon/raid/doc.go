// Package raid is tier0's RAID engine: RAID-0, RAID-1, RAID-5 and RAID-6
// over any blockdev.Device members (local drives, NVMe/TCP namespaces,
// in-memory devices in tests). An Array is itself a blockdev.Device, so the
// NVMe/TCP target can serve it.
//
// On-member layout (every member):
//
//	[0, 8 KiB)            two superblock slots, written alternately
//	[8 KiB, +bitmap)      write-intent bitmap, one bit per region
//	[logOffset, +log)     partial parity log: LogSlots slots
//	[DataOffset, ...)     data area: chunk s of the member is stripe s
//
// RAID-5 and RAID-6 use md's default left-symmetric layout; RAID-6 P and Q
// are bit-compatible with Linux md (P = xor, Q = sum g^i D_i in GF(2^8)
// with polynomial 0x11d). See docs/RAID.md for the write-hole design.
//
// Concurrency: all Device methods may be called from many goroutines.
// Overlapping writes serialize on per-stripe locks; writes to different
// stripes run in parallel.
package raid
