package raid

import (
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

func BenchmarkRebuild(b *testing.B) {
	for _, kind := range kinds() {
		b.Run(kind+"/raid5-3+1", func(b *testing.B) {
			ds := benchMembers(b, kind, 4)
			for it := 0; it < b.N; it++ {
				ev := &events{}
				pol := quietPolicy(ev)
				pol.Adaptive = true
				a, err := Create(ds, Config{Level: RAID5, ChunkSize: benchChunk, AssumeClean: true, Policy: pol})
				if err != nil {
					b.Fatal(err)
				}
				bufs := workerBufs(1 << 20)
				// Foreground: 1 MiB random reads for a fixed time.
				fg := func(d time.Duration) (int64, time.Duration) {
					var n atomic.Int64
					stop := time.Now().Add(d)
					var wg sync.WaitGroup
					for w := 0; w < benchQ/2; w++ {
						wg.Add(1)
						go func() {
							defer wg.Done()
							rng := rand.New(rand.NewSource(int64(w)))
							for time.Now().Before(stop) {
								off := rng.Int63n(a.Size()/(1<<20)) << 20
								if _, err := a.ReadAt(bufs[w], off); err != nil {
									return
								}
								n.Add(1 << 20)
							}
						}()
					}
					wg.Wait()
					return n.Load(), d
				}
				fgAlone, fgD := fg(time.Second)
				memberBytes := a.Geometry().Stripes * a.Geometry().ChunkSize
				rebuild := func(load bool) (float64, float64) {
					a.FailMember(3, "bench")
					t0 := time.Now()
					if err := a.Replace(3, ds[3]); err != nil {
						b.Fatal(err)
					}
					var got int64
					var d time.Duration
					if load {
						done := make(chan struct{})
						go func() { a.WaitIdle(); close(done) }()
						var n atomic.Int64
						var wg sync.WaitGroup
						start := time.Now()
						for w := 0; w < benchQ/2; w++ {
							wg.Add(1)
							go func() {
								defer wg.Done()
								rng := rand.New(rand.NewSource(int64(w)))
								for {
									select {
									case <-done:
										return
									default:
									}
									off := rng.Int63n(a.Size()/(1<<20)) << 20
									if _, err := a.ReadAt(bufs[w], off); err != nil {
										return
									}
									n.Add(1 << 20)
								}
							}()
						}
						wg.Wait()
						got, d = n.Load(), time.Since(start)
					} else {
						a.WaitIdle()
					}
					el := time.Since(t0)
					rate := mbps(memberBytes, el)
					retained := 0.0
					if load {
						retained = (float64(got) / d.Seconds()) / (float64(fgAlone) / fgD.Seconds())
					}
					return rate, retained
				}
				// Baseline: one member's sequential write bandwidth in
				// 1 MiB requests over the same bytes a rebuild writes.
				memberWrite := func() float64 {
					buf := bufs[0]
					t0 := time.Now()
					for off := a.Geometry().DataOffset; off+int64(len(buf)) <= a.Geometry().DataOffset+memberBytes; off += int64(len(buf)) {
						if _, err := ds[3].WriteAt(buf, off); err != nil {
							b.Fatal(err)
						}
					}
					return mbps(memberBytes, time.Since(t0))
				}
				// The better of two: the first pass over a memory member
				// pays its page faults, which the rebuild does not.
				mw := max(memberWrite(), memberWrite())
				alone, _ := rebuild(false)
				loaded, retained := rebuild(true)
				a.Abort()
				b.ReportMetric(mw, "member-write-MB/s")
				b.ReportMetric(alone/mw, "rebuild-ratio")
				b.ReportMetric(loaded/mw, "rebuild-loaded-ratio")
				b.ReportMetric(alone, "rebuild-MB/s")
				b.ReportMetric(loaded, "rebuild-loaded-MB/s")
				b.ReportMetric(retained, "fg-retained")
				b.ReportMetric(mbps(fgAlone, fgD), "fg-MB/s")
			}
		})
	}
}

// slowDev delays every data-area read by delay while slow is set (a
// member that stops answering in time but does not fail).
type slowDev struct {
	blockdev.Device
	slow  atomic.Bool
	delay time.Duration
}

func (d *slowDev) ReadAt(p []byte, off int64) (int, error) {
	if d.slow.Load() {
		time.Sleep(d.delay)
	}
	return d.Device.ReadAt(p, off)
}

// BenchmarkSlowMember: the longest 4 KiB random read while one member of
// a RAID-5 3+1 takes 500 ms per read, with Policy.SlowRead = 5 ms,
// against the longest read of the same run with the member healthy
// (goal: stall ≤ 100 ms).
func BenchmarkSlowMember(b *testing.B) {
	ds := benchMembers(b, "mem", 4)
	sd := &slowDev{Device: ds[0], delay: 500 * time.Millisecond}
	ds[0] = sd
	pol := quietPolicy(nil)
	pol.SlowRead = 5 * time.Millisecond
	a, err := Create(ds, Config{Level: RAID5, ChunkSize: benchChunk, AssumeClean: true, Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Abort()
	bufs := workerBufs(4096)
	longest := func() time.Duration {
		var worst atomic.Int64
		rng := make([]*rand.Rand, benchQ)
		for w := range rng {
			rng[w] = rand.New(rand.NewSource(int64(w)))
		}
		_, _, err := drive(2000, func(w, i int) error {
			t0 := time.Now()
			_, err := a.ReadAt(bufs[w], rng[w].Int63n(a.Size()/4096)*4096)
			if d := int64(time.Since(t0)); d > worst.Load() {
				worst.Store(d)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(worst.Load())
	}
	for it := 0; it < b.N; it++ {
		healthy := longest()
		sd.slow.Store(true)
		slow := longest()
		sd.slow.Store(false)
		b.ReportMetric(float64(healthy.Microseconds())/1000, "healthy-longest-ms")
		b.ReportMetric(float64(slow.Microseconds())/1000, "slow-member-longest-ms")
		b.ReportMetric(float64(sd.delay.Milliseconds()), "member-delay-ms")
	}
}
