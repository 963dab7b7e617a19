package reports

import (
	"bytes"
	"flag"
	stdhtml "html"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"tier0/bench"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func load(t *testing.T, name string) *bench.Results {
	t.Helper()
	r, err := bench.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMarkdownGolden(t *testing.T) {
	for _, name := range []string{"full", "minimal"} {
		t.Run(name, func(t *testing.T) {
			out := t.TempDir()
			p, err := Generate(load(t, name+".json"), out)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(p.Markdown)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name+".md.golden")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./reports -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("report.md differs from %s (rerun with -update if the change is intended):\n%s", golden, got)
			}
			// Every image the Markdown links exists as a PNG.
			for _, m := range regexp.MustCompile(`\]\((img/[^)]+\.png)\)`).FindAllStringSubmatch(string(got), -1) {
				f, err := os.Open(filepath.Join(out, m[1]))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := png.Decode(f); err != nil {
					t.Fatalf("%s: %v", m[1], err)
				}
				f.Close()
			}
		})
	}
}

func TestHTMLEmbedsImagesAndFigures(t *testing.T) {
	res := load(t, "full.json")
	out := t.TempDir()
	p, err := Generate(res, out)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p.HTML)
	if err != nil {
		t.Fatal(err)
	}
	html := stdhtml.UnescapeString(string(b))
	// retention, efficiency, failover throughput + latency, 4 CDFs, rebuild.
	if n := strings.Count(html, `src="data:image/png;base64,`); n != 9 || len(p.Images) != 9 {
		t.Fatalf("%d embedded PNGs, %d image files; want 9 each", n, len(p.Images))
	}
	for _, want := range []string{
		"<h2>Side by side with the seed</h2>",
		"<td>Retained with one node lost, sequential read</td><td>68.0% (1 run: spread unknown)</td><td>≈70%</td>",
		"2.30 s",  // failover time
		"55.00 s", // slowest rebuild (array e)
		"≈70%",    // seed retention
		"+10–15%", // seed sequential latency change
		"100.4%",  // seed read efficiency 131.7/131.2
		`<td class="notrun">NOT RUN</td><td>no GPU on this host`,
		`<td class="fail">FAIL</td><td>sequential read retained 68.0%, below 70%`,
		"4 passed, 1 failed, 1 not run",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if strings.Contains(html, "http://") || strings.Contains(html, "https://") || strings.Contains(html, "<script") {
		t.Error("the HTML must not reference external assets")
	}
}

func TestNotRunNeverShownAsPass(t *testing.T) {
	res := load(t, "minimal.json")
	var buf bytes.Buffer
	if err := WriteTables(&buf, res); err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	if !strings.Contains(s, "NOT RUN") || strings.Contains(s, "PASS") {
		t.Fatalf("minimal results have one not-run check and no pass:\n%s", s)
	}
	if !strings.Contains(s, "the run was started with --no-failover") {
		t.Fatal("the not-run reason is missing")
	}
	p, err := Generate(res, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(p.Markdown)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| Sequential read efficiency | n/a (no frontend healthy seq-read-1m measurement) |") {
		t.Fatalf("a missing figure must say why:\n%s", md)
	}
	if strings.Contains(string(md), "PASS") {
		t.Fatal("report.md shows a pass that the results do not contain")
	}
}

func TestWriteTables(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTables(&buf, load(t, "full.json")); err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	for _, want := range []string{"MEASUREMENTS", "SIDE BY SIDE WITH THE SEED", "FAILOVER", "REBUILD", "rand-write-4k", "tier0-loadgen", "fio", "│"} {
		if !strings.Contains(s, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	// 4 scenarios x (raw healthy + block and frontend in two states) + fio.
	if n := strings.Count(s, "tier0-loadgen"); n != 20 {
		t.Errorf("%d loadgen rows, want 20", n)
	}
}

func TestCompareFigures(t *testing.T) {
	ref, err := Seed()
	if err != nil {
		t.Fatal(err)
	}
	if ref.Topology.Nodes != 5 || ref.Healthy.SeqReadGiBs.Filesystem != 131.7 || ref.OneNodeLost.Retained.Sequential != 0.70 {
		t.Fatalf("embedded seed: %+v", ref)
	}
	rows := Compare(load(t, "full.json"), ref)
	get := func(metric string) Row {
		for _, r := range rows {
			if r.Metric == metric {
				return r
			}
		}
		t.Fatalf("no row %q", metric)
		return Row{}
	}
	near := func(metric string, want float64) {
		t.Helper()
		if r := get(metric); math.Abs(r.Tier0-want) > 1e-3 {
			t.Errorf("%s = %v, want %v", metric, r.Tier0, want)
		}
	}
	near("Sequential read efficiency", 2.05/2.21)
	near("Block layer ÷ raw drives, sequential write", 1.41/2.10)
	near("Retained with one node lost, random read IOPS", 0.79)
	near("Failover time", 2.3)
	near("Rebuild time", 55)
	if r := get("Mean latency change, random write"); math.Abs(r.Tier0) > 0.05 {
		t.Errorf("random write latency change %v: the fixture grew it by 0.4%% (histogram noise aside)", r.Tier0)
	}
	m := Compare(load(t, "minimal.json"), ref)
	for _, r := range m {
		if strings.HasPrefix(r.Metric, "Block layer") {
			if !r.Has() {
				t.Errorf("%s should be computable from raw and block: %s", r.Metric, r.Missing)
			}
		} else if r.Has() || r.Missing == "" {
			t.Errorf("%s: %v without a reason %q; minimal has no frontend, degraded, failover or rebuild data", r.Metric, r.Tier0, r.Missing)
		}
	}
}
