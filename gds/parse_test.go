package gds

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func openFixture(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestParseNvfsStatsEnabled(t *testing.T) {
	s, err := ParseNvfsStats(openFixture(t, "nvfs-stats-2.20.5-iostats-enabled.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if s.GDSVersion != "1.10.0.4" || s.DriverVersion != "2.20.5" || s.StatsVersion != "4.0" || !s.IOStatsEnabled {
		t.Errorf("header: gds %q driver %q stats %q enabled %v", s.GDSVersion, s.DriverVersion, s.StatsVersion, s.IOStatsEnabled)
	}
	r := s.Reads()
	if !r.Present || r.N != 0 || r.OK != 0 || r.Err != 0 {
		t.Errorf("Reads = %+v, want present zeros", r)
	}
	// The two "Reads" lines merge; a key from the second line is there.
	if v, ok := s.Counter("Reads", "Bandwidth(MiB/s)"); !ok || v != 0 {
		t.Errorf("Reads Bandwidth = %v %v", v, ok)
	}
	for _, c := range []struct {
		sec, key string
		want     int64
	}{
		{"Mmap", "n", 1}, {"Mmap", "munmap", 1}, {"Bar1-map", "free", 1}, {"Sparse Reads", "holes", 0},
		{"Writes", "pg-cache-eio", 0}, {"Ops", "Read", 0}, {"Batches", "Avg-Submit-Latency(usec)", 0},
		{"Error", "dma-ref", 0},
	} {
		if v, ok := s.Counter(c.sec, c.key); !ok || v != c.want {
			t.Errorf("%s %s = %d %v, want %d", c.sec, c.key, v, ok, c.want)
		}
	}
	if s.Info["Active Shadow-Buffer (MiB)"] != "0" || s.Info["Logging level"] != "debug" {
		t.Errorf("info = %v", s.Info)
	}
	if len(s.GPUs) != 0 {
		t.Errorf("GPUs = %v, want none", s.GPUs)
	}
}

func TestParseNvfsStatsDisabled(t *testing.T) {
	s, err := ParseNvfsStats(openFixture(t, "nvfs-stats-2.25.7-iostats-disabled.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if s.IOStatsEnabled || s.DriverVersion != "2.25.7" || s.GDSVersion != "1.14.0.31" {
		t.Errorf("header: %+v", s)
	}
	r := s.Reads()
	if r.Present {
		t.Errorf("Reads = %+v: n/ok must be absent when IO stats are disabled", r)
	}
	if v, ok := s.Counter("Mmap", "munmap"); !ok || v != 2 {
		t.Errorf("Mmap munmap = %d %v, want 2", v, ok)
	}
	if len(s.GPUs) != 1 {
		t.Fatalf("GPUs = %+v, want 1", s.GPUs)
	}
	g := s.GPUs[0]
	if g.BusID != "0000:01:00.0" || g.UUID != "fb1e6550-2a78-d767-1f0d-7512eb8c552d" || g.Counters["max_pinned_MiB"] != 1 {
		t.Errorf("GPU = %+v", g)
	}
}

func TestParseNvfsStatsRejects(t *testing.T) {
	if _, err := ParseNvfsStats(strings.NewReader("hello\nworld\n")); err == nil {
		t.Error("garbage parsed without error")
	}
	_, err := ParseNvfsStats(strings.NewReader("NVFS Driver(version: 2.20.5)\nReads : n=abc ok=0\n"))
	if err == nil || !strings.Contains(err.Error(), `"abc"`) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad value error = %v, want it to name the value and line", err)
	}
}

func TestParseGdsStats(t *testing.T) {
	s, err := ParseGdsStats(openFixture(t, "gds_stats-l3-nvidia-doc.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != 3 || s.Global["Total Files"] != 8 || s.Global["Total Read Size (MiB)"] != 78193 || s.Global["Read BandWidth (GiB/s)"] != 6.32129 {
		t.Errorf("global = %v version %d", s.Global, s.Version)
	}
	if len(s.GPUs) != 4 {
		t.Fatalf("GPUs = %d, want 4 (RDMA and pool lines are not GPUs)", len(s.GPUs))
	}
	g := s.GPUs[2]
	if g.Index != 2 || g.Read["n"] != 78193 || g.Read["posix"] != 0 || g.Read["util(%)"] != 797 || g.BufRegister["n"] != 8 || g.Write["n"] != 0 {
		t.Errorf("GPU 2 = %+v", g)
	}
	n, posix, errs, nvfs, hasNvfs := s.ReadTotals()
	if n != 78193 || posix != 0 || errs != 0 || nvfs != 0 || hasNvfs {
		t.Errorf("totals = %d %d %d %d %v", n, posix, errs, nvfs, hasNvfs)
	}
}

func TestParseGdsStatsNewerNvfsField(t *testing.T) {
	in := "cuFile STATS VERSION : 4\nGLOBAL STATS:\nTotal Files: 1\nPER_GPU STATS:\n" +
		"GPU 0 Read: bw=1.5 util(%)=10 n=100 nvfs=90 posix=10 unalign=0 err=0 MiB=100 Write: bw=0 util(%)=0 n=0 posix=0 unalign=0 err=0 MiB=0 BufRegister: n=1 err=0 free=0 MiB=1\n"
	s, err := ParseGdsStats(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	n, posix, _, nvfs, hasNvfs := s.ReadTotals()
	if n != 100 || posix != 10 || nvfs != 90 || !hasNvfs {
		t.Errorf("totals = n %d posix %d nvfs %d has %v", n, posix, nvfs, hasNvfs)
	}
	if _, err := ParseGdsStats(strings.NewReader("GPU 0 Read: n=1\n")); err == nil {
		t.Error("output without the version line parsed without error")
	}
}

func TestScanCufileLog(t *testing.T) {
	s, err := ScanCufileLog(openFixture(t, "cufile-log-signatures.txt"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Lines != 11 || s.DirectPath != 2 || len(s.Compat) != 2 || len(s.Errors) != 7 {
		t.Fatalf("scan = lines %d direct %d compat %d errors %d", s.Lines, s.DirectPath, len(s.Compat), len(s.Errors))
	}
	if !strings.Contains(s.Compat[0].Message, "compat mode enabled") || s.Compat[0].PID != 3540949 || s.Compat[0].Level != "NOTICE" {
		t.Errorf("compat[0] = %+v", s.Compat[0])
	}
	if s.Compat[1].Message != "running in compatible mode" {
		t.Errorf("compat[1] = %+v", s.Compat[1])
	}
	// Only the libcuda failure of pid 20192 (the GPU-less libcufile 1.4 run).
	s, _ = ScanCufileLog(openFixture(t, "cufile-log-signatures.txt"), 20192)
	if got := logErrorSummary(s); got != "unable to load, libcuda.so.1; missing cuda symbols while dynamic loading; cuFile initialization failed" {
		t.Errorf("pid 20192 errors = %q", got)
	}
}

func TestParseGdsioFixture(t *testing.T) {
	rs, err := ParseGdsio(openFixture(t, "gdsio-lines.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 9 {
		t.Fatalf("results = %d, want 9", len(rs))
	}
	r := rs[0]
	want := GdsioResult{IoType: "READ", XferType: "GPUD", Threads: 8, DataKiB: 818796544, DataSetKiB: 4096000, IOSizeKiB: "1024",
		IOSizeBytes: 1 << 20, ThroughputGiBs: 6.524658, AvgLatencyUs: 1197.370995, Ops: 799606, TotalTimeS: 119.679102}
	if r.IoType != want.IoType || r.XferType != want.XferType || r.Threads != want.Threads || r.DataKiB != want.DataKiB ||
		r.DataSetKiB != want.DataSetKiB || r.IOSizeKiB != want.IOSizeKiB || r.IOSizeBytes != want.IOSizeBytes ||
		r.ThroughputGiBs != want.ThroughputGiBs || r.AvgLatencyUs != want.AvgLatencyUs || r.Ops != want.Ops || r.TotalTimeS != want.TotalTimeS {
		t.Errorf("first = %+v\nwant    %+v", r, want)
	}
	if b := rs[6]; b.XferType != "GPU_BATCH" || b.IoDepth != 10 || b.Ops != 20 || b.DataKiB != 80 {
		t.Errorf("batch = %+v", b)
	}
	if rs[4].XferType != "CPUONLY" || rs[4].IOSizeBytes != 256<<10 {
		t.Errorf("cpu only = %+v", rs[4])
	}
	if rs[7].Verified || !rs[8].Verified {
		t.Errorf("verified flags = %v %v, want false true", rs[7].Verified, rs[8].Verified)
	}
}

func TestParseGdsioPrintfFormats(t *testing.T) {
	// Fill the printf formats of the gdsio 1.4 binary the way C would.
	b, err := os.ReadFile("testdata/gdsio-printf-formats-1.4.txt")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 4 {
		t.Fatalf("fixture has %d formats, want 4", len(lines))
	}
	fill := func(f string, vals ...string) string {
		for _, v := range vals {
			i := strings.Index(f, "%")
			j := i + 1
			for strings.ContainsRune("l", rune(f[j])) {
				j++
			}
			f = f[:i] + v + f[j+1:]
		}
		return f
	}
	out := strings.Join([]string{
		fill(lines[2], "0", "4", "1048576", "2.5", "800.5"),
		fill(lines[3], "0.6", "0.65", "790", "810"),
		fill(lines[2], "1", "4", "1048576", "2.25", "820"),
		fill(lines[0], "READ", "GPUD", "8", "2097152", "2097152", "1024", "4.75", "810.25", "2048", "0.42"),
		fill(lines[1], "WRITE", "GPU_BATCH", "2", "16", "64", "64", "4", "0.01", "3000", "16", "0.01"),
	}, "\n")
	rs, err := ParseGdsio(strings.NewReader(out))
	if err != nil {
		t.Fatalf("%v\ninput:\n%s", err, out)
	}
	if len(rs) != 2 {
		t.Fatalf("results = %d, want 2; input:\n%s", len(rs), out)
	}
	r := rs[0]
	if r.Threads != 8 || r.ThroughputGiBs != 4.75 || r.Ops != 2048 || len(r.Jobs) != 2 {
		t.Fatalf("result = %+v", r)
	}
	j := r.Jobs[0]
	if j.ID != 0 || j.Threads != 4 || j.DataKiB != 1048576 || j.ThroughputGiBs != 2.5 || j.ThreadMinGiBs != 0.6 || j.ThreadMaxLatencyUs != 810 {
		t.Errorf("job 0 = %+v", j)
	}
	if rs[1].IoDepth != 16 || rs[1].XferType != "GPU_BATCH" {
		t.Errorf("batch = %+v", rs[1])
	}
}

func TestParseGdsioNoResult(t *testing.T) {
	_, err := ParseGdsio(strings.NewReader("Error: cuFileDriverOpen failed\n"))
	if !errors.Is(err, ErrNoGdsioResult) {
		t.Errorf("err = %v, want ErrNoGdsioResult", err)
	}
}

func FuzzParsers(f *testing.F) {
	for _, name := range []string{"nvfs-stats-2.20.5-iostats-enabled.txt", "nvfs-stats-2.25.7-iostats-disabled.txt",
		"gds_stats-l3-nvidia-doc.txt", "gdsio-lines.txt", "cufile-log-signatures.txt"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseNvfsStats(strings.NewReader(string(b)))
		ParseGdsStats(strings.NewReader(string(b)))
		ParseGdsio(strings.NewReader(string(b)))
		ScanCufileLog(strings.NewReader(string(b)), 0)
	})
}

func TestScanCufileLogIgnoresConfigEcho(t *testing.T) {
	in := " 29-11-2026 18:00:00:000 [pid=7 tid=7] INFO  cufio-cfg:1 properties.allow_compat_mode : true (compat mode allowed)\n" +
		" 29-11-2026 18:00:00:000 [pid=7 tid=7] DEBUG  cufio:1 compat mode check skipped\n" +
		" 29-11-2026 18:00:00:000 [pid=7 tid=7] WARN  cufio:2 falling back to compat mode for fd 5\n"
	s, err := ScanCufileLog(strings.NewReader(in), 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Compat) != 1 || s.Compat[0].Level != "WARN" {
		t.Errorf("compat = %+v, want only the WARN line", s.Compat)
	}
}
