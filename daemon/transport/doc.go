// Package transport is the contract between tier0's NVMe-oF host
// (daemon/host) and the transports that carry its queues: NVMe/TCP
// (daemon/host itself) and NVMe/RDMA (daemon/rdma). A transport connects
// one queue up to the point where the Fabrics Connect command is sent (TCP:
// the ICReq/ICResp exchange; RDMA: the rdma_cm connect with the NVMe/RDMA
// private data) and then carries commands; everything above, the Fabrics
// Connect, DH-HMAC-CHAP, Identify, keep-alive, asynchronous events, the
// I/O timeout, reconnect and the incarnation check, is the host's and the
// same over either transport.
//
// The package is a leaf (it imports only daemon/nvme), so that daemon/rdma
// implements it without importing daemon/host.
package transport
