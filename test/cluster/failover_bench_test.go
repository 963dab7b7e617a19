package cluster

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/config"
	"tier0/daemon/host"
)

// ioRec is one completed I/O.
type ioRec struct{ start, end time.Time }

// recorder keeps every completion on one array and its error counts.
type recorder struct {
	mu   sync.Mutex
	ios  []ioRec
	errs atomic.Int64 // I/O errors (none expected: multipath holds I/O for 30 s)
	bad  atomic.Int64 // blocks that read back different from what was written
	last atomic.Value // last error, for the report
}

func (r *recorder) add(s, e time.Time) {
	r.mu.Lock()
	r.ios = append(r.ios, ioRec{s, e})
	r.mu.Unlock()
}

// firstIssuedAfter is the earliest completion of an I/O issued at or after
// t (ok false: none yet).
func (r *recorder) firstIssuedAfter(t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first time.Time
	for _, x := range r.ios {
		if !x.start.Before(t) && (first.IsZero() || x.end.Before(first)) {
			first = x.end
		}
	}
	return first, !first.IsZero()
}

// maxGap is the longest time in [from, to] with no completion: between
// consecutive completions, counting the last one before from and to itself.
func (r *recorder) maxGap(from, to time.Time) time.Duration {
	r.mu.Lock()
	var ends []time.Time
	prev := time.Time{}
	for _, x := range r.ios {
		switch {
		case x.end.Before(from):
			if x.end.After(prev) {
				prev = x.end
			}
		case !x.end.After(to):
			ends = append(ends, x.end)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	if prev.IsZero() {
		prev = from
	}
	var gap time.Duration
	for _, e := range append(ends, to) {
		if d := e.Sub(prev); d > gap {
			gap = d
		}
		prev = e
	}
	return gap
}

// load runs workers that each write a 4 KiB block at a random offset in
// their own 8 MiB region and read it back, until ctx ends.
func load(ctx context.Context, wg *sync.WaitGroup, mp *host.Multipath, rec *recorder, workers int) {
	const region, bs = 8 << 20, 4096
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			wbuf, rbuf := make([]byte, bs), make([]byte, bs)
			for seq := uint64(1); ctx.Err() == nil; seq++ {
				off := int64(w)*region + int64(rnd.IntN(region/bs))*bs
				for i := 0; i < bs; i += 8 {
					binary.LittleEndian.PutUint64(wbuf[i:], seq<<20^uint64(off+int64(i)))
				}
				s := time.Now()
				if _, err := mp.WriteAt(wbuf, off); err != nil {
					rec.errs.Add(1)
					rec.last.Store(fmt.Sprintf("write at %d: %v", off, err))
					continue
				}
				rec.add(s, time.Now())
				s = time.Now()
				if _, err := mp.ReadAt(rbuf, off); err != nil {
					rec.errs.Add(1)
					rec.last.Store(fmt.Sprintf("read at %d: %v", off, err))
					continue
				}
				rec.add(s, time.Now())
				if !bytes.Equal(wbuf, rbuf) {
					rec.bad.Add(1)
				}
			}
		}()
	}
}

// frontends opens array on every node's frontend through tier0's
// multipath host (options as `tier0 validate` uses them).
func frontends(tb testing.TB, cfg *config.Config, array string) *host.Multipath {
	tb.Helper()
	var paths []host.PathSpec
	for i := range cfg.Nodes {
		n := &cfg.Nodes[i]
		paths = append(paths, host.PathSpec{Addr: n.AdvertiseAddr(n.Frontend), Options: host.Options{
			SubNQN: cfg.SubsystemNQN(array), HostNQN: "nqn.2014-08.io.tier0:bench-failover",
			IOQueues: 2, QueueDepth: 64, KATO: 5 * time.Second, IOTimeout: 10 * time.Second,
			DialTimeout: 2 * time.Second, ReconnectDelay: 200 * time.Millisecond, CtrlLossTimeout: time.Second,
		}})
	}
	mp, err := host.NewMultipath(paths, host.MPOptions{HoldTimeout: 30 * time.Second})
	if err != nil {
		tb.Fatalf("array %s: %v", array, err)
	}
	if got := len(mp.Paths()); got != len(paths) {
		tb.Fatalf("array %s: %d of %d paths connected; every node should serve it", array, got, len(paths))
	}
	return mp
}

func quantile(s []time.Duration, q float64) time.Duration {
	s = slices.Clone(s)
	slices.Sort(s)
	i := int(q*float64(len(s)-1) + 0.5)
	return s[i]
}

// BenchmarkFailover kills the owner of array B (node B, SIGKILL) in each of
// TIER0_FAILOVER_TRIALS trials (default 10) while tier0's multipath host
// runs 4 KiB write+read-back I/O on array B and on array D (whose owner
// stays up; it runs degraded while B is gone, since B holds one of its
// members), then restarts B and waits until every array is optimal at home
// again (B fails back). It reports the distribution of kill → first
// completed I/O on B (an I/O issued after the kill, so it went through the
// new owner), the longest stall of D's I/O around each kill, and the
// longest stall of B's I/O during the failback. Goal: kill → I/O ≤ 5 s in
// the worst trial. Figures, not assertions (docs/FAILOVER.md).
func BenchmarkFailover(b *testing.B) {
	trials := 10
	if v, err := strconv.Atoi(os.Getenv("TIER0_FAILOVER_TRIALS")); err == nil && v > 0 {
		trials = v
	}
	const moved, steady, victim = "B", "D", "B"
	c, _ := startCluster(b)
	cfg := c.Config()
	mpMoved, mpSteady := frontends(b, cfg, moved), frontends(b, cfg, steady)
	defer mpMoved.Close()
	defer mpSteady.Close()
	recMoved, recSteady := &recorder{}, &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	load(ctx, &wg, mpMoved, recMoved, 2)
	load(ctx, &wg, mpSteady, recSteady, 2)
	defer func() { cancel(); wg.Wait() }()

	var killToIO, steadyStall, movedStall, failback []time.Duration
	fmt.Printf("failover: %d trials, kill -9 of %s (owner of array %s), I/O on %s and %s\n", trials, victim, moved, moved, steady)
	fmt.Printf("%-6s %-10s %-14s %-16s %-18s %-16s\n", "trial", "new-owner", "kill->io", moved+"-longest-stall", steady+"-longest-stall", "failback-stall")
	for i := range trials {
		if err := c.WaitOptimal(ctx, 2*time.Minute); err != nil {
			b.Fatalf("trial %d: %v", i+1, err)
		}
		time.Sleep(2 * time.Second)
		killed, err := c.Kill(victim)
		if err != nil {
			b.Fatal(err)
		}
		var first time.Time
		for deadline := time.Now().Add(time.Minute); ; {
			var ok bool
			if first, ok = recMoved.firstIssuedAfter(killed); ok {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("trial %d: no I/O on array %s completed within a minute of killing %s (errors %d, last %v)",
					i+1, moved, victim, recMoved.errs.Load(), recMoved.last.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(time.Second)
		end := time.Now()
		owner, _, _ := ownerOf(ctx, c, moved)
		d := first.Sub(killed)
		ms := recMoved.maxGap(killed.Add(-time.Second), end)
		ss := recSteady.maxGap(killed.Add(-time.Second), end)

		restarted := time.Now()
		if err := c.Start(victim); err != nil {
			b.Fatal(err)
		}
		if err := c.WaitOptimal(ctx, 2*time.Minute); err != nil {
			b.Fatalf("trial %d, after restarting %s: %v", i+1, victim, err)
		}
		time.Sleep(time.Second)
		fb := recMoved.maxGap(restarted, time.Now())
		killToIO, movedStall, steadyStall, failback = append(killToIO, d), append(movedStall, ms), append(steadyStall, ss), append(failback, fb)
		fmt.Printf("%-6d %-10s %-14s %-16s %-18s %-16s\n", i+1, owner, d.Round(time.Millisecond), ms.Round(time.Millisecond),
			ss.Round(time.Millisecond), fb.Round(time.Millisecond))
	}
	cancel()
	wg.Wait()
	sec := func(d time.Duration) float64 { return d.Seconds() }
	worst := slices.Max(killToIO)
	verdict := "met"
	if worst > 5*time.Second {
		verdict = "NOT met"
	}
	fmt.Printf("kill -> first I/O on %s: min %v median %v p90 %v max %v (goal: max <= 5s, %s)\n", moved,
		slices.Min(killToIO).Round(time.Millisecond), quantile(killToIO, 0.5).Round(time.Millisecond),
		quantile(killToIO, 0.9).Round(time.Millisecond), worst.Round(time.Millisecond), verdict)
	fmt.Printf("array %s longest stall around a kill: median %v max %v\n", moved,
		quantile(movedStall, 0.5).Round(time.Millisecond), slices.Max(movedStall).Round(time.Millisecond))
	fmt.Printf("array %s (owner not killed) longest stall around a kill: median %v max %v\n", steady,
		quantile(steadyStall, 0.5).Round(time.Millisecond), slices.Max(steadyStall).Round(time.Millisecond))
	fmt.Printf("array %s longest stall during failback: median %v max %v\n", moved,
		quantile(failback, 0.5).Round(time.Millisecond), slices.Max(failback).Round(time.Millisecond))
	fmt.Printf("I/O errors: %s %d, %s %d; read-back mismatches: %s %d, %s %d\n", moved, recMoved.errs.Load(), steady,
		recSteady.errs.Load(), moved, recMoved.bad.Load(), steady, recSteady.bad.Load())
	b.ReportMetric(sec(slices.Min(killToIO)), "kill-io-min-s")
	b.ReportMetric(sec(quantile(killToIO, 0.5)), "kill-io-median-s")
	b.ReportMetric(sec(quantile(killToIO, 0.9)), "kill-io-p90-s")
	b.ReportMetric(sec(worst), "kill-io-max-s")
	b.ReportMetric(sec(slices.Max(movedStall)), "moved-max-stall-s")
	b.ReportMetric(sec(slices.Max(steadyStall)), "steady-max-stall-s")
	b.ReportMetric(sec(slices.Max(failback)), "failback-max-stall-s")
	b.ReportMetric(float64(recMoved.errs.Load()+recSteady.errs.Load()), "io-errors")
	b.ReportMetric(float64(recMoved.bad.Load()+recSteady.bad.Load()), "mismatches")
}
