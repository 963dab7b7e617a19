package raid

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/local"
)

// The RAID benchmarks measure the engine against a baseline taken in the
// same run on the same members and report the ratio as a metric (goal in
// parentheses):
//
//	SeqRead      1 MiB reads / aggregate member reads of the same bytes (≥0.95)
//	SeqWrite     full-stripe writes / (data fraction × aggregate member writes) (≥0.85)
//	RandWrite    4 KiB random write IOPS / (member IOPS ÷ 4 RAID-5, ÷ 6 RAID-6) (≥0.8)
//	Degraded     degraded / healthy: 1 MiB seq read (≥0.75), 4 KiB random read (≥0.8;
//	             its member-read bound, 4k-read-bound, is 0.67 for 3+1)
//	Encode       parity encode per core / reedsolomon called directly (≥0.9)
//	Rebuild      rebuild MB/s alone and under foreground load against one
//	             member's sequential write MB/s (≥0.5), and the
//	             foreground's retained fraction (≥0.7)
//
// SeqRead, SeqWrite (RAID-5) and RandWrite4K (with the log) run also as
// ".../timed", with the daemon's member deadlines (benchPolicies), against
// the same baseline and with the same goals.
//
// Members are in memory ("mem": engine overhead) or O_DIRECT files
// ("file", package local) in TIER0_BENCH_DIR (default /var/tmp).
// scripts/bench.d/raid.sh runs them.

const (
	benchQ      = 8 // concurrent requests
	benchChunk  = 64 << 10
	benchMemMiB = 128 // per member
)

// ramDev is a lock-free in-memory member for the engine-overhead
// benchmarks (blockdev.Mem tracks crash state and is too slow to be a
// baseline). Overlapping concurrent writes are undefined, as the
// contract allows.
type ramDev struct{ data []byte }

func (r *ramDev) ReadAt(p []byte, off int64) (int, error)  { return copy(p, r.data[off:]), nil }
func (r *ramDev) WriteAt(p []byte, off int64) (int, error) { return copy(r.data[off:], p), nil }
func (r *ramDev) Flush() error                             { return nil }
func (r *ramDev) WriteZeroes(off, n int64) error           { clear(r.data[off : off+n]); return nil }
func (r *ramDev) Discard(off, n int64) error               { return r.WriteZeroes(off, n) }
func (r *ramDev) Size() int64                              { return int64(len(r.data)) }
func (r *ramDev) BlockSize() int                           { return 4096 }
func (r *ramDev) Close() error                             { return nil }

var (
	benchFilesMu sync.Mutex
	benchFiles   = map[int][]string{}
)

// benchMembers returns n members of the kind and their per-member size.
func benchMembers(b *testing.B, kind string, n int) []blockdev.Device {
	size := int64(benchMemMiB) << 20
	ds := make([]blockdev.Device, n)
	switch kind {
	case "mem":
		for i := range ds {
			// Touched page by page, so that no request pays a page
			// fault (a read of an untouched page maps the zero page,
			// a write of it faults again), as local.Memory does.
			r := &ramDev{data: make([]byte, size)}
			for off := 0; off < len(r.data); off += 4096 {
				r.data[off] = 1
			}
			ds[i] = r
		}
	case "file":
		dir := os.Getenv("TIER0_BENCH_DIR")
		if dir == "" {
			dir = "/var/tmp"
		}
		benchFilesMu.Lock()
		paths := benchFiles[n]
		if paths == nil {
			for i := 0; i < n; i++ {
				paths = append(paths, filepath.Join(dir, fmt.Sprintf("tier0-raid-bench-%d-%d-%d.img", os.Getpid(), n, i)))
			}
			benchFiles[n] = paths
		}
		benchFilesMu.Unlock()
		for i := range ds {
			d, err := local.Open(paths[i], local.Options{Size: size, Create: true})
			if err != nil {
				b.Skipf("O_DIRECT member files in %s: %v (set TIER0_BENCH_DIR)", dir, err)
			}
			ds[i] = d
		}
		// Fill once so reads hit allocated extents.
		buf := blockdev.AlignedBuffer(4 << 20)
		rand.New(rand.NewSource(1)).Read(buf)
		var wg sync.WaitGroup
		for _, d := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for off := int64(0); off < size; off += int64(len(buf)) {
					d.WriteAt(buf, off)
				}
				d.Flush()
			}()
		}
		wg.Wait()
		b.Cleanup(func() {
			for _, d := range ds {
				d.Close()
			}
		})
	}
	return ds
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, ps := range benchFiles {
		for _, p := range ps {
			os.Remove(p)
		}
	}
	os.Exit(code)
}

// drive runs ops operations from benchQ workers; op gets the worker and
// the operation index. It returns the elapsed time and mean latency.
func drive(ops int, op func(w, i int) error) (time.Duration, time.Duration, error) {
	var next atomic.Int64
	var lat atomic.Int64
	var firstErr atomic.Value
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < benchQ; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= ops {
					return
				}
				t0 := time.Now()
				if err := op(w, i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				lat.Add(int64(time.Since(t0)))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if e, ok := firstErr.Load().(error); ok {
		return el, 0, e
	}
	return el, time.Duration(lat.Load() / int64(ops)), nil
}

// bestOf runs the baseline and the engine alternately rounds times and
// keeps each one's fastest run (the machine may be shared and noisy).
func bestOf(rounds int, base, eng func() (time.Duration, time.Duration, error)) (bd, ed, elat time.Duration, err error) {
	for r := 0; r < rounds; r++ {
		d, _, e := base()
		if e != nil {
			return 0, 0, 0, e
		}
		if bd == 0 || d < bd {
			bd = d
		}
		d, l, e := eng()
		if e != nil {
			return 0, 0, 0, e
		}
		if ed == 0 || d < ed {
			ed, elat = d, l
		}
	}
	return
}

const benchRounds = 3

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e6 }

func benchArray(b *testing.B, ds []blockdev.Device, level Level) *Array {
	return benchArrayPol(b, ds, level, quietPolicy(nil))
}

// benchPolicies: each engine benchmark of SeqRead, SeqWrite and
// RandWrite4K runs with no member deadline and, as "/timed", with the
// daemon's (daemon/node raidPolicy with the daemon/config defaults:
// member_io_timeout 5 s, member_slow_read 20 ms), under which every member
// request runs as a timed request (memberio.go).
var benchPolicies = []struct {
	suffix string
	pol    func() Policy
}{
	{"", func() Policy { return quietPolicy(nil) }},
	{"/timed", daemonPolicy},
}

func daemonPolicy() Policy {
	p := quietPolicy(nil)
	p.Retries = 1
	p.IOTimeout = 5 * time.Second
	p.SlowRead = 20 * time.Millisecond
	return p
}

func benchArrayPol(b *testing.B, ds []blockdev.Device, level Level, pol Policy) *Array {
	a, err := Create(ds, Config{Level: level, ChunkSize: benchChunk, AssumeClean: true, Policy: pol})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Abort() })
	return a
}

// memberSpread does, per op, one request of size n split evenly over all
// members at a per-op sequential offset (the "aggregate of the members
// read directly" baseline): in parallel, or, for memory members when the
// benchQ workers already outnumber the CPUs, one after another on the
// worker, which is then faster (a goroutine per member and op cost the
// parallel way 10–14 % on 2 CPUs), as the engine does (inline).
func memberSpread(ds []blockdev.Device, n int, write bool, bufs [][]byte) func(w, i int) error {
	part := int64(n/len(ds)) / 4096 * 4096
	if _, mem := ds[0].(*ramDev); mem && benchQ >= runtime.GOMAXPROCS(0) {
		return func(w, i int) error {
			off := (int64(i) * part) % (ds[0].Size() - part) / 4096 * 4096
			for m, d := range ds {
				p := bufs[w][int64(m)*part : int64(m+1)*part]
				var err error
				if write {
					_, err = d.WriteAt(p, off)
				} else {
					_, err = d.ReadAt(p, off)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}
	}
	return func(w, i int) error {
		off := (int64(i) * part) % (ds[0].Size() - part) / 4096 * 4096
		var wg sync.WaitGroup
		errs := make([]error, len(ds))
		for m, d := range ds {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := bufs[w][int64(m)*part : int64(m+1)*part]
				if write {
					_, errs[m] = d.WriteAt(p, off)
				} else {
					_, errs[m] = d.ReadAt(p, off)
				}
			}()
		}
		wg.Wait()
		for _, e := range errs {
			if e != nil {
				return e
			}
		}
		return nil
	}
}

func workerBufs(n int) [][]byte {
	bs := make([][]byte, benchQ)
	for i := range bs {
		bs[i] = blockdev.AlignedBuffer(n)
		rand.New(rand.NewSource(int64(i))).Read(bs[i])
	}
	return bs
}

func kinds() []string { return []string{"mem", "file"} }

func BenchmarkSeqRead(b *testing.B) {
	for _, kind := range kinds() {
		for _, bp := range benchPolicies {
			b.Run(kind+"/raid5-3+1"+bp.suffix, func(b *testing.B) {
				ds := benchMembers(b, kind, 4)
				a := benchArrayPol(b, ds, RAID5, bp.pol())
				const req = 1 << 20
				ops := int(a.Size() / req)
				bufs := workerBufs(req)
				for it := 0; it < b.N; it++ {
					base, eng, _, err := bestOf(benchRounds, func() (time.Duration, time.Duration, error) {
						return drive(ops, memberSpread(ds, req, false, bufs))
					}, func() (time.Duration, time.Duration, error) {
						return drive(ops, func(w, i int) error {
							_, err := a.ReadAt(bufs[w], int64(i)*req)
							return err
						})
					})
					if err != nil {
						b.Fatal(err)
					}
					total := int64(ops) * req
					b.ReportMetric(mbps(total, eng), "MB/s")
					b.ReportMetric(mbps(total, base), "member-MB/s")
					b.ReportMetric(base.Seconds()/eng.Seconds(), "ratio")
				}
			})
		}
	}
}

func BenchmarkSeqWrite(b *testing.B) {
	for _, kind := range kinds() {
		for _, tc := range []struct {
			level Level
			n     int
		}{{RAID5, 4}, {RAID6, 6}} {
			for _, bp := range benchPolicies {
				if bp.suffix != "" && tc.level != RAID5 {
					continue
				}
				b.Run(fmt.Sprintf("%s/%s-%d%s", kind, tc.level, tc.n, bp.suffix), func(b *testing.B) {
					ds := benchMembers(b, kind, tc.n)
					a := benchArrayPol(b, ds, tc.level, bp.pol())
					g := a.Geometry()
					req := int(g.StripeSize) * max(1, int((1<<20)/g.StripeSize)) // ~1 MiB of whole stripes
					ops := int(a.Size()/int64(req)) * 3 / 4
					// Baseline: the same number of bytes per member per op
					// as the engine writes (data + parity).
					perOp := req / g.DataDisks * g.Members
					bufs := workerBufs(max(req, perOp))
					for it := 0; it < b.N; it++ {
						base, eng, _, err := bestOf(benchRounds, func() (time.Duration, time.Duration, error) {
							return drive(ops, memberSpread(ds, perOp, true, bufs))
						}, func() (time.Duration, time.Duration, error) {
							return drive(ops, func(w, i int) error {
								_, err := a.WriteAt(bufs[w][:req], int64(i)*int64(req))
								return err
							})
						})
						if err != nil {
							b.Fatal(err)
						}
						data := int64(ops) * int64(req)
						memberRate := mbps(int64(ops)*int64(perOp), base)
						frac := float64(g.DataDisks) / float64(g.Members)
						b.ReportMetric(mbps(data, eng), "MB/s")
						b.ReportMetric(memberRate, "member-MB/s")
						b.ReportMetric(mbps(data, eng)/(frac*memberRate), "ratio")
					}
				})
			}
		}
	}
}

func BenchmarkRandWrite4K(b *testing.B) {
	for _, kind := range kinds() {
		for _, tc := range []struct {
			level Level
			n     int
			ios   float64 // member I/Os per write under read-modify-write
		}{{RAID5, 4, 4}, {RAID6, 6, 6}} {
			for _, logOn := range []bool{true, false} {
				for _, bp := range benchPolicies {
					if bp.suffix != "" && !logOn {
						continue
					}
					name := fmt.Sprintf("%s/%s-%d", kind, tc.level, tc.n)
					if !logOn {
						name += "/nolog"
					}
					name += bp.suffix
					b.Run(name, func(b *testing.B) {
						ds := benchMembers(b, kind, tc.n)
						a, err := Create(ds, Config{Level: tc.level, ChunkSize: benchChunk, AssumeClean: true, DisableLog: !logOn, Policy: bp.pol()})
						if err != nil {
							b.Fatal(err)
						}
						defer a.Abort()
						ops := 20000
						if kind == "file" {
							ops = 8000
						}
						bufs := workerBufs(4096)
						for it := 0; it < b.N; it++ {
							// Member IOPS: 4 KiB random, half reads half writes,
							// spread over all members.
							rng := make([]*rand.Rand, benchQ)
							for w := range rng {
								rng[w] = rand.New(rand.NewSource(int64(w)))
							}
							mops := ops * 2
							base, eng, lat, err := bestOf(benchRounds, func() (time.Duration, time.Duration, error) {
								return drive(mops, func(w, i int) error {
									d := ds[i%len(ds)]
									off := rng[w].Int63n(d.Size()/4096-1) * 4096
									if i%2 == 0 {
										_, err := d.ReadAt(bufs[w], off)
										return err
									}
									_, err := d.WriteAt(bufs[w], off)
									return err
								})
							}, func() (time.Duration, time.Duration, error) {
								return drive(ops, func(w, i int) error {
									off := rng[w].Int63n(a.Size()/4096) * 4096
									_, err := a.WriteAt(bufs[w], off)
									return err
								})
							})
							if err != nil {
								b.Fatal(err)
							}
							memberIOPS := float64(mops) / base.Seconds()
							iops := float64(ops) / eng.Seconds()
							b.ReportMetric(iops, "IOPS")
							b.ReportMetric(memberIOPS, "member-IOPS")
							b.ReportMetric(float64(lat.Microseconds()), "lat-µs")
							b.ReportMetric(iops/(memberIOPS/tc.ios), "ratio")
						}
					})
				}
			}
		}
	}
}

func BenchmarkDegraded(b *testing.B) {
	for _, kind := range kinds() {
		b.Run(kind+"/raid5-3+1", func(b *testing.B) {
			ds := benchMembers(b, kind, 4)
			for it := 0; it < b.N; it++ {
				a := benchArray(b, ds, RAID5)
				const req = 1 << 20
				ops := int(a.Size() / req)
				bufs := workerBufs(req)
				seq := func(w, i int) error {
					_, err := a.ReadAt(bufs[w], int64(i)*req)
					return err
				}
				rops := 20000
				rng := make([]*rand.Rand, benchQ)
				rnd := func(w, i int) error {
					if rng[w] == nil {
						rng[w] = rand.New(rand.NewSource(int64(w)))
					}
					_, err := a.ReadAt(bufs[w][:4096], rng[w].Int63n(a.Size()/4096)*4096)
					return err
				}
				hs, hr, hlat, err := bestOf(benchRounds, func() (time.Duration, time.Duration, error) { return drive(ops, seq) },
					func() (time.Duration, time.Duration, error) { return drive(rops, rnd) })
				if err != nil {
					b.Fatal(err)
				}
				a.FailMember(1, "bench")
				ds2, dr, dlat, err := bestOf(benchRounds, func() (time.Duration, time.Duration, error) { return drive(ops, seq) },
					func() (time.Duration, time.Duration, error) { return drive(rops, rnd) })
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(mbps(int64(ops)*req, ds2), "degraded-seq-MB/s")
				b.ReportMetric(hs.Seconds()/ds2.Seconds(), "seq-ratio")
				b.ReportMetric(float64(rops)/dr.Seconds(), "degraded-4k-IOPS")
				b.ReportMetric(hr.Seconds()/dr.Seconds(), "4k-ratio")
				// The member-read bound of that ratio: 1/n of the data is
				// on the failed member and a 4 KiB piece of it costs n-1
				// reads (the other data chunks and P), the rest one read,
				// so (1 + (n-2)/n) member reads per request against 1
				// (0.67 for 3+1).
				n := float64(len(ds))
				bound := 1 / (1 + (n-2)/n)
				b.ReportMetric(bound, "4k-read-bound")
				b.ReportMetric(hr.Seconds()/dr.Seconds()/bound, "4k-of-bound")
				b.ReportMetric(float64(dlat-hlat)/float64(time.Microsecond), "4k-lat-change-µs")
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, tc := range []struct {
		level  Level
		nd, np int
	}{{RAID5, 3, 1}, {RAID6, 4, 2}} {
		b.Run(fmt.Sprintf("%s-%d+%d", tc.level, tc.nd, tc.np), func(b *testing.B) {
			c, _ := newCoder(tc.level, tc.nd)
			var rs reedsolomon.Encoder
			if tc.level == RAID5 {
				rs, _ = reedsolomon.New(tc.nd, 1, reedsolomon.WithFastOneParityMatrix(), reedsolomon.WithMaxGoroutines(1))
			} else {
				m := [][]byte{{1, 1, 1, 1}, {1, 2, 4, 8}}
				rs, _ = reedsolomon.New(tc.nd, 2, reedsolomon.WithCustomMatrix(m), reedsolomon.WithMaxGoroutines(1))
			}
			shards := make([][]byte, tc.nd+tc.np)
			for i := range shards {
				shards[i] = blockdev.AlignedBuffer(benchChunk)
				rand.New(rand.NewSource(int64(i))).Read(shards[i])
			}
			const rounds = 4000
			data := int64(rounds * tc.nd * benchChunk)
			for it := 0; it < b.N; it++ {
				direct, eng, _, _ := bestOf(benchRounds, func() (time.Duration, time.Duration, error) {
					t0 := time.Now()
					for r := 0; r < rounds; r++ {
						rs.Encode(shards)
					}
					return time.Since(t0), 0, nil
				}, func() (time.Duration, time.Duration, error) {
					t0 := time.Now()
					for r := 0; r < rounds; r++ {
						c.encode(shards[:tc.nd], shards[tc.nd:])
					}
					return time.Since(t0), 0, nil
				})
				b.ReportMetric(float64(data)/eng.Seconds()/1e9, "GB/s")
				b.ReportMetric(float64(data)/direct.Seconds()/1e9, "rs-GB/s")
				b.ReportMetric(direct.Seconds()/eng.Seconds(), "ratio")
			}
		})
	}
}

// BenchmarkSeqWrite4K: sequential 4 KiB writes (queue depth benchQ, each
// write next to the one before), the pattern that rewrites a healthy
// stripe within one flush interval: the log entry of a write whose
// partial parity covers bytes written since the last flush costs a flush
// first (unflushed.go), here once per chunk of each stripe.
func BenchmarkSeqWrite4K(b *testing.B) {
	for _, tc := range []struct {
		level Level
		n     int
	}{{RAID5, 4}, {RAID6, 6}} {
		b.Run(fmt.Sprintf("mem/%s-%d", tc.level, tc.n), func(b *testing.B) {
			ds := benchMembers(b, "mem", tc.n)
			a := benchArray(b, ds, tc.level)
			ops := int(a.Size()/4096) / 2
			bufs := workerBufs(4096)
			for it := 0; it < b.N; it++ {
				d, _, err := drive(ops, func(w, i int) error {
					_, err := a.WriteAt(bufs[w], int64(i)*4096)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(ops)/d.Seconds(), "IOPS")
			}
		})
	}
}
