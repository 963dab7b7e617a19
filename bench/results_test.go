package bench

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

func TestScenariosOnMemAndResultsRoundTrip(t *testing.T) {
	ctx := context.Background()
	devs := []Target{{ID: "A1", Dev: blockdev.NewMem(8*mib, 4096)}, {ID: "A2", Dev: blockdev.NewMem(8*mib, 4096)}}
	if _, err := Fill(ctx, 1, 2, devs); err != nil {
		t.Fatal(err)
	}
	o := Options{SeqQueueDepth: 2, RandQueueDepth: 4, Duration: 60 * time.Millisecond, Interval: 20 * time.Millisecond, Verify: true, Generation: 2, MinGeneration: 1}
	start := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	r := NewResults("t1", "mem", start, CollectEnvironment("test", "mem"))
	for _, sc := range Standard(o) {
		m, ts, res, err := sc.Run(ctx, LayerRaw, Healthy, devs)
		if err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		if err := res.VerifyErr(); err != nil {
			t.Fatalf("%s: %v", sc.Name, err)
		}
		if m.Ops == 0 || m.BytesPerS <= 0 || m.Latency.Count != uint64(m.Ops) || len(m.Targets) != 2 {
			t.Fatalf("%s: measurement %+v", sc.Name, m)
		}
		if (sc.Config.Pattern == SeqRead || sc.Config.Pattern == RandRead) && (m.Verify == nil || m.Verify.Checked == 0) {
			t.Fatalf("%s: read scenario verified nothing: %+v", sc.Name, m.Verify)
		}
		if len(ts.Points) == 0 || ts.ID != m.SeriesID || ts.Scenario != sc.Name {
			t.Fatalf("%s: series %+v", sc.Name, ts)
		}
		r.Add(m)
		r.AddSeries(ts)
	}
	r.AddCheck("gds", NotRun, "")
	r.AddCheck("failover", Pass, "")
	r.GDS = &GDSSlot{Status: NotRun, Reason: "no GPU"}
	if err := r.GDS.SetVerdict(map[string]int{"ops": 3}); err != nil {
		t.Fatal(err)
	}
	if r.Environment.GoVersion == "" || r.Environment.LogicalCores == 0 || r.Environment.Tier0Version != "test" {
		t.Fatalf("environment %+v", r.Environment)
	}
	path := filepath.Join(t.TempDir(), "results.json")
	if err := WriteFile(path, r); err != nil {
		t.Fatal(err)
	}
	back, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Measurements) != 4 || len(back.Series) != 4 || back.Checks[0].Reason != "no reason given" || strings.Join(strings.Fields(string(back.GDS.Verdict)), "") != `{"ops":3}` {
		t.Fatalf("round trip lost data: %d measurements, %d series, checks %+v, gds %s", len(back.Measurements), len(back.Series), back.Checks, back.GDS.Verdict)
	}
	m, ok := back.Find(LayerRaw, Healthy, ScenarioRandRead4K)
	if !ok || m.Latency.P99Ns == 0 || len(m.Latency.CDF) == 0 {
		t.Fatalf("rand read after round trip: %+v", m)
	}
	var a, b bytes.Buffer
	r.Encode(&a)
	back.Encode(&b)
	if a.String() != b.String() {
		t.Fatal("encode(decode(x)) != x")
	}
}

func TestDecodeRejectsOtherSchemas(t *testing.T) {
	for _, in := range []string{`{"schema":"tier0.bench/v2"}`, `[]`, `{"schema":"tier0.bench/v1","checks":[{"name":"x","status":"ok"}]}`} {
		if _, err := Decode(strings.NewReader(in)); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: err %v, want ErrSchema", in, err)
		}
	}
}
