package host

import (
	"context"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// writeCounter counts the socket writes of a connection.
type writeCounter struct {
	net.Conn
	n *atomic.Int64
}

func (w writeCounter) Write(p []byte) (int, error) { w.n.Add(1); return w.Conn.Write(p) }

// TestCommandSendsCoalesce: commands submitted together by many goroutines
// leave in few socket writes, not one write each, even when the senders run
// one after another on one P (the "flush when no other sender is pending"
// rule wrote once per command there: 70% of tier0 fabric perf's CPU at
// 4 KiB, docs/PERFORMANCE.md).
func TestCommandSendsCoalesce(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f := newFakeTarget(t, testNQN, 1<<20)
	var writes atomic.Int64
	o := testOpts()
	o.IOQueues, o.QueueDepth = 1, 64
	d := &net.Dialer{}
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{c, &writes}, nil
	}
	_, ns := dialNS(t, f, o)
	const n = 32
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, 512)
	}
	for round := 0; round < 3; round++ {
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, err := ns.ReadAt(bufs[i], int64(i)*512); err != nil {
					errs <- err
				}
			}()
		}
		before := writes.Load()
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if w := writes.Load() - before; w > n/4 {
			t.Fatalf("round %d: %d reads submitted together took %d socket writes; want at most %d (the sends coalesce)", round, n, w, n/4)
		}
	}
}
