package reports

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"tier0/bench"
	"tier0/daemon/blockdev"
)

// TestEndToEndOnMem drives the library the way tier0 validate does, on
// in-memory devices: fill, standard scenarios healthy and degraded, a
// failover simulated by stalling one device behind a fault rule, then the
// report.
func TestEndToEndOnMem(t *testing.T) {
	ctx := context.Background()
	a := blockdev.NewMem(8<<20, 4096)
	b := blockdev.NewFault(blockdev.NewMem(8<<20, 4096))
	targets := []bench.Target{{ID: "frontend:array-a", Dev: a}, {ID: "frontend:array-b", Dev: b}}
	start := time.Now()
	res := bench.NewResults("e2e", "mem-2", start, bench.CollectEnvironment("", "mem-2"))
	if _, err := bench.Fill(ctx, 1, 2, targets); err != nil {
		t.Fatal(err)
	}
	o := bench.Options{SeqQueueDepth: 2, RandQueueDepth: 4, Duration: 40 * time.Millisecond, Interval: 10 * time.Millisecond, Verify: true, Generation: 1, MinGeneration: 1}
	for _, st := range []bench.State{bench.Healthy, bench.Degraded} {
		for _, sc := range bench.Standard(o) {
			m, ts, r, err := sc.Run(ctx, bench.LayerFrontend, st, targets)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.VerifyErr(); err != nil {
				t.Fatalf("%s %s: %v", sc.Name, st, err)
			}
			res.Add(m)
			res.AddSeries(ts)
		}
	}

	cfg := bench.RandRead4K(o).Config
	cfg.Duration, cfg.Interval, cfg.TolerateErrors = 500*time.Millisecond, 20*time.Millisecond, true
	h, err := bench.Start(ctx, cfg, targets)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	b.AddRule(blockdev.Rule{Action: blockdev.Delay, Delay: 10 * time.Second}) // array b's owner is gone
	if _, err := h.Mark("node B killed"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	b.ClearRules() // array b moved: I/O resumes
	r, err := h.Wait()
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := bench.FailoverFrom("B", r.Marks[0], "frontend:array-b", "failover")
	if !ok || rec.Duration < 190*time.Millisecond || rec.Duration > 2*time.Second {
		t.Fatalf("failover %+v (ok %v), want ≈200ms", rec, ok)
	}
	stall := r.Targets[1].LongestStall.Duration
	rec.Arrays = []bench.ArrayFailover{{Array: "b", From: "B", To: "A", Moved: true, Stall: stall}}
	res.Failover = &rec
	res.AddSeries(bench.SeriesFrom("failover", r))
	res.Rebuilds = []bench.RebuildRecord{{Array: "a", Start: start, End: start.Add(3 * time.Second), Bytes: 8 << 20,
		Samples: []bench.RebuildSample{{At: start.Add(time.Second), DoneBytes: 3 << 20}, {At: start.Add(3 * time.Second), DoneBytes: 8 << 20}}}}
	res.AddCheck("failover", bench.Pass, "")
	res.AddCheck("gds", bench.NotRun, "no GPU")
	res.Run.Finished = time.Now()

	dir := t.TempDir()
	if err := bench.WriteFile(dir+"/results.json", res); err != nil {
		t.Fatal(err)
	}
	back, err := bench.ReadFile(dir + "/results.json")
	if err != nil {
		t.Fatal(err)
	}
	p, err := Generate(back, dir+"/out")
	if err != nil {
		t.Fatal(err)
	}
	html, err := os.ReadFile(p.HTML)
	if err != nil {
		t.Fatal(err)
	}
	// retention, efficiency is n/a (no block layer): no bar; 2 timelines,
	// 4 CDFs, rebuild.
	if n := strings.Count(string(html), "data:image/png;base64,"); n != 8 {
		t.Errorf("%d images in the HTML, want 8", n)
	}
	md, _ := os.ReadFile(p.Markdown)
	if !strings.Contains(string(md), "| Failover time | "+fmtDuration(rec.Duration)+" |") {
		t.Errorf("report.md lacks the failover time %v:\n%s", rec.Duration, md)
	}
}
