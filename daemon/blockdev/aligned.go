package blockdev

import "unsafe"

// Alignment is the buffer alignment AlignedBuffer guarantees: 4096 bytes,
// the page size on every platform tier0 runs on and the strictest
// O_DIRECT alignment a Linux block device asks for.
const Alignment = 4096

// AlignedBuffer returns a zeroed slice of length and capacity n whose first
// byte sits on an Alignment boundary, so that devices opened with O_DIRECT
// can use it without a bounce copy.
//
// It over-allocates n+Alignment bytes from the Go heap and slices at the
// first aligned address (rather than using an anonymous mmap), so the buffer
// is ordinary garbage-collected memory: there is nothing to free, and the
// backing array stays alive as long as the returned slice does. The capacity
// is clipped to n so that appending cannot silently reach the padding.
func AlignedBuffer(n int) []byte {
	if n < 0 {
		panic("blockdev.AlignedBuffer: negative size")
	}
	if n == 0 {
		return []byte{}
	}
	raw := make([]byte, n+Alignment)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&raw[0])) & (Alignment - 1)); r != 0 {
		skip = Alignment - r
	}
	return raw[skip : skip+n : skip+n]
}

// IsAligned reports whether p starts on an Alignment boundary. An empty
// slice counts as aligned.
func IsAligned(p []byte) bool {
	if len(p) == 0 {
		return true
	}
	return uintptr(unsafe.Pointer(&p[0]))&(Alignment-1) == 0
}
