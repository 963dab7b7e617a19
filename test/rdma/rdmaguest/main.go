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
//	rdmaguest -mode targets -addr A,B -nqn N -ready FILE
//	                                    (two tier0 NVMe/RDMA targets of one subsystem; SIGUSR1 swaps ANA)
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"tier0/daemon/rdma"
)

func main() {
	mode := flag.String("mode", "host", "nodevice | host | loopback | portloss | targets")
	addr := flag.String("addr", "10.0.2.15:4420", "target IPv4 HOST:PORT")
	nqn := flag.String("nqn", "", "subsystem NQN (modes host, portloss)")
	remove := flag.String("remove", "", "shell command that removes the target's port (mode portloss)")
	readd := flag.String("readd", "", "shell command that re-adds it (mode portloss)")
	ready := flag.String("ready", "/tmp/targets.ready", "file written once the targets listen (mode targets)")
	flag.Parse()
	if !rdma.Built {
		fmt.Println("FAIL", rdma.ErrNotBuilt)
		os.Exit(2)
	}
	var err error
	switch *mode {
	case "nodevice":
		err = noDevice(*addr)
	case "host":
		err = host(*addr, *nqn)
	case "loopback":
		err = loopback(*addr)
	case "portloss":
		err = portLoss(*addr, *nqn, *remove, *readd)
	case "targets":
		err = targets(strings.Split(*addr, ","), *nqn, *ready)
	default:
		err = fmt.Errorf("unknown -mode %q (want nodevice, host, loopback, portloss or targets)", *mode)
	}
	if err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
	fmt.Println("PASS", *mode)
}
