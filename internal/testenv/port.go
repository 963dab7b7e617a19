package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// Ports handed out by FreePort lie above Linux's default ephemeral range
// (32768–60999, net.ipv4.ip_local_port_range) and above every port the
// project's site files use (at most about 33 300 with their shifts).
const (
	portLo = 61000
	portHi = 65535
)

var ports struct {
	sync.Mutex
	given map[int]bool
	rng   *rand.Rand
}

// FreePort returns a loopback TCP port that is free now, for a test that
// must hand a port number to something that binds it later (an embedded
// etcd, a site file).
//
// The usual idiom, listening on 127.0.0.1:0 and closing, returns a port
// from the ephemeral range, which the kernel hands out again to the next
// outgoing connection of any process: with go test running packages in
// parallel, an etcd client's connection took such a port before the test
// bound it ("address already in use"). FreePort draws from outside that
// range, never returns the same port twice in one process, and starts at
// a random point so that parallel test processes rarely meet.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func freePort() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = map[int]bool{}
		ports.rng = rand.New(rand.NewPCG(uint64(os.Getpid()), rand.Uint64()))
	}
	n := portHi - portLo + 1
	start := ports.rng.IntN(n)
	for i := range n {
		p := portLo + (start+i)%n
		if ports.given[p] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		ports.given[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free loopback TCP port in %d–%d: every one is bound or was handed out by this test process; stop other local clusters or tests", portLo, portHi)
}
