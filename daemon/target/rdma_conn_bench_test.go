package target

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/daemon/rdma"
)

// cpuNow is this process's user+system CPU time.
func cpuNow(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTransportCPU is the CPU cost of the NVMe/RDMA data path beside
// NVMe/TCP's, in one process (tier0's host and tier0's target on one
// memory namespace, both sides counted), for the same I/O at queue depth
// 16: NVMe/RDMA over rdma.MemPair (the target's and host's RDMA code,
// capsules, keyed SGLs, completions; the memory pair copies the RDMA
// READ/WRITE data with the CPU, which a NIC does without it), both with
// rdma.Connect's host ("rdma") and daemon/host over rdma.Transport
// ("rdma-host"), and NVMe/TCP over loopback (the kernel's TCP stack included). Metrics: cpu-us/io and
// cpu-ms/GiB (user+system CPU of the process per I/O and per GiB moved).
// No speed figure is meant: emulated RDMA is no speed reference; the CPU
// per operation of tier0's own code is.
func BenchmarkTransportCPU(b *testing.B) {
	for _, w := range []struct {
		name  string
		write bool
		size  int
	}{{"read-4k", false, 4096}, {"write-4k", true, 4096}, {"read-1m", false, 1 << 20}, {"write-1m", true, 1 << 20}} {
		for _, tr := range []string{"rdma", "rdma-host", "tcp"} {
			b.Run(tr+"/"+w.name, func(b *testing.B) {
				dev := blockdev.NewMem(64<<20, 4096)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				var rw func(p []byte, off int64) (int, error)
				switch tr {
				case "rdma":
					_, acc := newRDMATarget(b, Config{}, dev)
					c, err := rdma.Connect(ctx, "10.9.8.7:4420", rdma.Options{SubNQN: testSubNQN, HostNQN: testHostNQN, IOQueues: 1, QueueDepth: 32, Dial: acc.dial})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { c.Close() })
					ns, err := c.Namespace(1)
					if err != nil {
						b.Fatal(err)
					}
					rw = ns.ReadAt
					if w.write {
						rw = ns.WriteAt
					}
				case "rdma-host":
					_, acc := newRDMATarget(b, Config{}, dev)
					c, err := host.Dial(ctx, "10.9.8.7:4420", host.Options{SubNQN: testSubNQN, HostNQN: testHostNQN, IOQueues: 1, QueueDepth: 32, Transport: &rdma.Transport{Dial: acc.dial}})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { c.Close() })
					ns, err := c.Namespace(1)
					if err != nil {
						b.Fatal(err)
					}
					rw = ns.ReadAt
					if w.write {
						rw = ns.WriteAt
					}
				case "tcp":
					_, addr := newTarget(b, Config{}, dev)
					c, err := host.Dial(ctx, addr, host.Options{SubNQN: testSubNQN, HostNQN: testHostNQN, IOQueues: 1, QueueDepth: 32})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { c.Close() })
					ns, err := c.Namespace(1)
					if err != nil {
						b.Fatal(err)
					}
					rw = ns.ReadAt
					if w.write {
						rw = ns.WriteAt
					}
				}
				const depth = 16
				span := int64(32<<20) / int64(w.size)
				var wg sync.WaitGroup
				var next sync.Mutex
				i := 0
				errs := make(chan error, depth)
				b.SetBytes(int64(w.size))
				b.ResetTimer()
				cpu0 := cpuNow(b)
				for g := 0; g < depth; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						buf := make([]byte, w.size)
						for {
							next.Lock()
							k := i
							i++
							next.Unlock()
							if k >= b.N {
								return
							}
							if _, err := rw(buf, int64(k)%span*int64(w.size)); err != nil {
								errs <- fmt.Errorf("%s %s #%d: %w", tr, w.name, k, err)
								return
							}
						}
					}()
				}
				wg.Wait()
				cpu := cpuNow(b) - cpu0
				b.StopTimer()
				select {
				case err := <-errs:
					b.Fatal(err)
				default:
				}
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/io")
				b.ReportMetric(float64(cpu.Milliseconds())/(float64(b.N)*float64(w.size)/(1<<30)), "cpu-ms/GiB")
			})
		}
	}
}
