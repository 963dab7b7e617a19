package raid

import (
	"math/rand"
	"testing"
	"time"
)

// The cost of durable writes while the array has no redundancy left
// (exposed.go): 4 KiB random and 1 MiB sequential writes on a RAID-5 3+1,
// healthy and then with member 1 failed, in the same run; the ratios are
// degraded over healthy throughput (the same benchmark on a build without
// the rule gives the baseline ratio).
func BenchmarkDegradedWrite(b *testing.B) {
	for _, kind := range kinds() {
		b.Run(kind+"/raid5-3+1", func(b *testing.B) {
			ds := benchMembers(b, kind, 4)
			for it := 0; it < b.N; it++ {
				a := benchArray(b, ds, RAID5)
				const req = 1 << 20
				ops := int(a.Size() / req)
				bufs := workerBufs(req)
				seq := func(w, i int) error {
					_, err := a.WriteAt(bufs[w], int64(i)*req)
					return err
				}
				wops := 20000
				rng := make([]*rand.Rand, benchQ)
				rnd := func(w, i int) error {
					if rng[w] == nil {
						rng[w] = rand.New(rand.NewSource(int64(w)))
					}
					_, err := a.WriteAt(bufs[w][:4096], rng[w].Int63n(a.Size()/4096)*4096)
					return err
				}
				hs, hr, _, err := bestOf(benchRounds, func() (time.Duration, time.Duration, error) { return drive(ops, seq) },
					func() (time.Duration, time.Duration, error) { return drive(wops, rnd) })
				if err != nil {
					b.Fatal(err)
				}
				a.FailMember(1, "bench")
				ds2, dr, _, err := bestOf(benchRounds, func() (time.Duration, time.Duration, error) { return drive(ops, seq) },
					func() (time.Duration, time.Duration, error) { return drive(wops, rnd) })
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(mbps(int64(ops)*req, ds2), "degraded-seq-MB/s")
				b.ReportMetric(hs.Seconds()/ds2.Seconds(), "seq-ratio")
				b.ReportMetric(float64(wops)/dr.Seconds(), "degraded-4k-IOPS")
				b.ReportMetric(hr.Seconds()/dr.Seconds(), "4k-ratio")
			}
		})
	}
}
