// Package blockdevtest is the blockdev.Device contract as a test suite.
// Every Device of tier0 (Mem, Fault, Recorder, the local drive, an
// imported NVMe/TCP namespace, a RAID array, the frontend gate) runs it from
// its own package's tests, so that the layers stacked on each other agree
// on what a Device does: bytes round-trip, misaligned and out-of-range
// requests fail with the right sentinel and touch nothing, a device never
// keeps or writes the caller's buffer, zeroes read back as zeroes, many
// goroutines may call at once, and a closed device says so.
package blockdevtest
