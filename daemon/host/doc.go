// Package host is tier0's NVMe/TCP initiator: it connects to an NVMe/TCP
// controller (the Linux kernel's nvmet, or tier0's own target), runs an
// admin queue and several I/O queues with many commands in flight on each,
// and exposes namespaces as blockdev.Devices so that RAID stacks on them.
// Multipath combines the controllers of one subsystem on several nodes and
// follows their ANA states; see Multipath.
//
// # Concurrency and buffers
//
// All methods may be called from many goroutines. Each queue has one reader
// goroutine; there is no goroutine per I/O. Reads land straight in the
// caller's buffer (C2HData); writes go from the caller's buffer, in the
// command capsule when small, else on the controller's R2T. The caller's
// buffer is not kept after a call returns.
//
// # Errors
//
// I/O errors wrap blockdev sentinels: a reservation conflict is
// blockdev.ErrFenced (never retried on another path), a lost connection or a
// failed command is blockdev.ErrIO, a command that timed out is
// blockdev.ErrTimeout, and a multipath device with no usable path past its
// hold timeout returns blockdev.ErrNoPath. The NVMe status, when there is
// one, is also in the chain (errors.As with *StatusError).
package host
