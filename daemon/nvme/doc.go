// Package nvme is the NVMe and NVMe/TCP wire codec used by tier0's target
// (package target) and host initiator (package host). It does no I/O: it
// encodes and decodes PDUs, submission and completion queue entries, the
// fabrics commands, the Identify data structures, log pages and reservation
// data structures, byte for byte as the NVMe base, NVMe over Fabrics and
// NVMe/TCP transport specifications (and the Linux kernel) lay them out.
//
// Conventions: every multi-byte field is little endian. Encoders are
// append-style (AppendXxx or (X).Append(b) returning the extended slice) so
// that callers can reuse buffers; decoders (ParseXxx) read from a caller
// buffer, never keep it, and do not allocate unless the result holds
// variable-length data (strings, lists). Decoders never panic on short or
// malformed input; they return an error wrapping ErrShort or ErrMalformed.
package nvme
