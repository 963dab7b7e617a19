package target

import (
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// An RDMA queue whose Connect is handled before its serve goroutine runs
// (the completion goroutine takes the capsule first: seen under
// emulation) keeps working after ConnectTimeout: the Connect deadline is
// set before the queue takes capsules, so the Connect clears it, and
// serve sets none of its own.
func TestRDMAConnectBeforeServeKeepsQueue(t *testing.T) {
	connected := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(connected) }) }
	old := rdmaServeStarted
	rdmaServeStarted = func() { <-connected }
	t.Cleanup(func() { release(); rdmaServeStarted = old })
	_, acc := newRDMATarget(t, Config{ConnectTimeout: time.Second}, blockdev.NewMem(testSize, testBS))
	q := dialRawRDMA(t, acc, 0, 4)
	if cqe := q.connect(testSubNQN, nvme.CntlIDDynamic, 4, false); !cqe.Status.OK() {
		t.Fatalf("admin connect: %v", cqe.Status)
	}
	release() // serve runs now, after the Connect
	// three connect timeouts later the queue still answers
	time.Sleep(3 * time.Second)
	if cqe := q.exec(nvme.PropertyCmd{Offset: nvme.PropCAP}.SQE(2, false), nil, 0, nil); !cqe.Status.OK() {
		t.Fatalf("property get 3 s after the Connect: %v", cqe.Status)
	}
}
