// Command rdmaguest is test/rdma's in-guest driver: built with -tags rdma,
// copied into the Linux test guest and run there against the kernel's
// nvmet-rdma over soft-RoCE (rdma_rxe). Each mode prints one "PASS ..." or
// "FAIL ..." line per check and exits non-zero on the first failure.
//
//	rdmaguest -mode nodevice            (before any RDMA link exists)
//	rdmaguest -mode host -addr A -nqn N (tier0's NVMe/RDMA host vs nvmet-rdma)
//	rdmaguest -mode loopback -addr A    (tier0's Listener/Accept, RDMA READ/WRITE)
//	rdmaguest -mode portloss -addr A -nqn N -remove CMD -readd CMD
//	                                    (the target's port removed under I/O, then re-added)
//	rdmaguest -mode reconnect -addr A -nqn N -remove CMD -readd CMD
//	                                    (daemon/host over rdma.Transport: keep-alive; reconnects by itself after the port returns)
//	rdmaguest -mode auth -addr A -nqn N (DH-HMAC-CHAP over RDMA: daemon/host vs tier0's target)
//	rdmaguest -mode targets -addr A,B -nqn N -ready FILE
//	                                    (two tier0 NVMe/RDMA targets of one subsystem; SIGUSR1 swaps ANA)
//	rdmaguest -mode cluster -site S -tier0d BIN -tier0 BIN
//	                                    (the site's cluster over NVMe/RDMA, kill-the-owner under fio verify)
package main
