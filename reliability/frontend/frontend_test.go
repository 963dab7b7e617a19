package frontend

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"
)

var (
	first = flag.Uint64("frontend.first", 1, "first seed of TestFrontendSeeds")
	seeds = flag.Int("frontend.seeds", 16, "seeds TestFrontendSeeds runs")
)

// TestFrontendSeeds runs seeds -frontend.first.. of the frontend nemesis:
// slow device periods and connection resets under a checked workload. A
// failing seed replays with -frontend.first=SEED -frontend.seeds=1.
func TestFrontendSeeds(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the frontend nemesis takes about 5 s per seed")
	}
	for s := *first; s < *first+uint64(*seeds); s++ {
		t.Run(fmt.Sprint(s), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, err := Run(ctx, Options{Seed: s})
			if err != nil {
				t.Fatalf("seed %d could not run: %v\n%s", s, err, r.Schedule)
			}
			if r.Progress.Acked == 0 {
				t.Fatalf("seed %d: no write was acknowledged (%+v): the workload did not run\n%s", s, r.Progress, r.Schedule)
			}
			if !r.OK() {
				t.Fatalf("seed %d: ANOMALY (replay: go test ./reliability/frontend/ -run TestFrontendSeeds -frontend.first=%d -frontend.seeds=1)\n%s", s, s, r.Report)
			}
			t.Logf("%s%d ops checked, %d writes acked, %d failed", r.Schedule, r.History.Ops, r.Progress.Acked, r.Progress.Failed)
		})
	}
}

// TestGenerateReplays: a seed draws the same schedule every time, and
// different seeds draw different ones.
func TestGenerateReplays(t *testing.T) {
	a, b := Generate(7, 3*time.Second), Generate(7, 3*time.Second)
	if a.String() != b.String() {
		t.Fatalf("seed 7 drew two schedules:\n%s\n%s", a, b)
	}
	if c := Generate(8, 3*time.Second); c.String() == a.String() {
		t.Fatalf("seeds 7 and 8 drew the same schedule:\n%s", a)
	}
	for s := uint64(1); s < 200; s++ {
		for _, f := range Generate(s, 3*time.Second).Faults {
			if f.Start < 0 || f.Start+f.Dur > 3*time.Second {
				t.Fatalf("seed %d: %s is outside the 3 s window", s, f)
			}
		}
	}
}
