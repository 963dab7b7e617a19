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
