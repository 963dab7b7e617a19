package cluster

import (
	"testing"
)

// benchLoss measures how long the machine takes to decide a failover in a
// 64-node, 64-array RAID-6 cluster in 8 racks: the tick on which the lost
// nodes' leases expire, including performing the takeovers in the
// simulator (fence, assemble, ANA) to quiescence.
func benchLoss(b *testing.B, kill func(s *sim)) {
	for b.Loop() {
		b.StopTimer()
		s, err := newSim(Config{LeaseTicks: 10, SelfFenceTicks: 6})
		if err != nil {
			b.Fatal(err)
		}
		s.quiet = true
		if err := s.genCluster(64, 8, 6, 6, RAID6, "distinct"); err != nil {
			b.Fatal(err)
		}
		kill(s)
		s.tick(9)
		b.StartTimer()
		s.tick(1) // the lease expires: every decision happens here
		b.StopTimer()
		if s.counts["fence"] == 0 || len(s.violations) > 0 {
			b.Fatalf("no takeover or violations: %v %v", s.counts, s.violations)
		}
		for _, a := range s.m.Arrays() {
			if a.State == StateFailed || a.State == StateOffline {
				b.Fatalf("array %s %s after the loss", a.Name, a.State)
			}
		}
		b.StartTimer()
	}
}

func BenchmarkNodeLoss64(b *testing.B) { benchLoss(b, func(s *sim) { s.kill("n17") }) }

func BenchmarkRackLoss64(b *testing.B) {
	benchLoss(b, func(s *sim) {
		for _, id := range s.m.nodeOrder {
			if s.rack[id] == "r3" {
				s.kill(id)
			}
		}
	})
}

// BenchmarkTick64 is the steady-state cost of one tick (64 heartbeats and a
// reconcile) in a healthy 64-node cluster.
func BenchmarkTick64(b *testing.B) {
	s, err := newSim(Config{LeaseTicks: 10, SelfFenceTicks: 6})
	if err != nil {
		b.Fatal(err)
	}
	s.quiet = true
	if err := s.genCluster(64, 8, 6, 6, RAID6, "distinct"); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s.tick(1)
	}
}
