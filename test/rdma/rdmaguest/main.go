package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"tier0/daemon/rdma"
)

func main() {
	mode := flag.String("mode", "host", "nodevice | host | loopback | portloss | reconnect | auth | targets | cluster")
	addr := flag.String("addr", "10.0.2.15:4420", "target IPv4 HOST:PORT")
	nqn := flag.String("nqn", "", "subsystem NQN (modes host, portloss)")
	remove := flag.String("remove", "", "shell command that removes the target's port (modes portloss, reconnect)")
	readd := flag.String("readd", "", "shell command that re-adds it (modes portloss, reconnect)")
	ready := flag.String("ready", "/tmp/targets.ready", "file written once the targets listen (mode targets)")
	site := flag.String("site", "/harness/guest3.yaml", "site file (mode cluster)")
	tier0d := flag.String("tier0d", "/harness/tier0d", "tier0d built with -tags rdma (mode cluster)")
	tier0 := flag.String("tier0", "/harness/tier0", "tier0 CLI built with -tags rdma (mode cluster)")
	work := flag.String("work", "/tmp/t0work", "the cluster's work directory (mode cluster)")
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
	case "reconnect":
		err = reconnect(*addr, *nqn, *remove, *readd)
	case "auth":
		err = authCheck(*addr, *nqn)
	case "targets":
		err = targets(strings.Split(*addr, ","), *nqn, *ready)
	case "cluster":
		err = clusterFailover(*site, *tier0d, *tier0, *work)
	default:
		err = fmt.Errorf("unknown -mode %q (want nodevice, host, loopback, portloss, reconnect, auth, targets or cluster)", *mode)
	}
	if err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
	fmt.Println("PASS", *mode)
}
