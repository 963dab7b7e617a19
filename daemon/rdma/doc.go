// Package rdma is tier0's NVMe over RDMA transport: a small cgo layer over
// rdma-core (libibverbs and librdmacm; no home-made verbs) and, above it, an
// NVMe/RDMA host (tier0 as initiator) exposed as a blockdev.Device.
//
// # Build tag
//
// The verbs layer (verbs.go) is built only with the build tag rdma, on Linux
// with cgo: a default build (`go build ./...`, make test) must not need
// rdma-core's headers or libraries, which most build and CI machines lack.
// Without the tag, stub.go provides the same API and every entry point
// returns ErrNotBuilt. A dlopen-based build was rejected: it would need
// hand-written prototypes and struct layouts of ibv_* and rdma_* (the verbs
// fast path is inline functions in verbs.h, not symbols), which is exactly
// the home-made verbs the design forbids. See docs/RDMA.md.
//
// # Wire format
//
// Each NVMe queue is one reliable-connected queue pair with one completion
// queue, connected with rdma_cm; the NVMe/RDMA private data
// (PrivateData: RECFMT, QID, HRQSIZE, HSQSIZE) travels in the connect
// request, AcceptData in the reply, RejectData in a reject. Command capsules
// (64-byte SQEs) and response capsules (16-byte CQEs) are SEND/RECV
// messages. Data moves by RDMA READ/WRITE done by the target against the
// host's buffer, which the host describes with a keyed SGL data block
// descriptor (address, length, rkey). Memory is registered once per queue:
// one region holds the receive buffers, the send buffers and the data
// slots (Config), so no I/O registers memory. Completions are handled by one
// goroutine per queue, never one per I/O.
package rdma
