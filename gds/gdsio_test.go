package gds

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGdsioArgs(t *testing.T) {
	c := SeedGdsioConfig("/scale/f", 2)
	a, err := c.Args()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(a, " "), "-f /scale/f -d 2 -w 8 -s 10G -i 1M -x 0 -I 0 -T 60"; got != want {
		t.Errorf("args = %q, want %q", got, want)
	}
	c.Xfer, c.Verify, c.File, c.Dir = XferCPUOnly, true, "", "/scale"
	a, _ = c.Args()
	if got := strings.Join(a, " "); got != "-D /scale -d 2 -w 8 -s 10G -i 1M -x 1 -I 0 -T 60 -V" {
		t.Errorf("args = %q", got)
	}
	for name, bad := range map[string]GdsioConfig{
		"none":    {Threads: 1, Size: "1G", IOSize: "1M"},
		"both":    {File: "a", Dir: "b", Threads: 1, Size: "1G", IOSize: "1M"},
		"threads": {File: "a", Size: "1G", IOSize: "1M"},
		"xfer":    {File: "a", Threads: 1, Size: "1G", IOSize: "1M", Xfer: 9},
		"size":    {File: "a", Threads: 1},
	} {
		if _, err := bad.Args(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func fakeGdsio(t *testing.T, body string) (bin, argsFile string) {
	t.Helper()
	dir := t.TempDir()
	bin, argsFile = filepath.Join(dir, "gdsio"), filepath.Join(dir, "args")
	script := "#!/bin/sh\necho \"$@\" > " + argsFile + "\n" + body
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, argsFile
}

func TestRunGdsio(t *testing.T) {
	line := "IoType: READ XferType: GPUD Threads: 8 DataSetSize: 818796544/4096000(KiB) IOSize: 1024(KiB) Throughput: 6.524658 GiB/sec, Avg_Latency: 1197.370995 usecs ops: 799606 total_time 119.679102 secs"
	bin, argsFile := fakeGdsio(t, "echo 'some banner'\necho '"+line+"'\n")
	c := SeedGdsioConfig("/scale/f", 0)
	c.Binary = bin
	rs, _, err := RunGdsio(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Ops != 799606 || rs[0].ThroughputGiBs != 6.524658 {
		t.Errorf("results = %+v", rs)
	}
	got, _ := os.ReadFile(argsFile)
	if strings.TrimSpace(string(got)) != "-f /scale/f -d 0 -w 8 -s 10G -i 1M -x 0 -I 0 -T 60" {
		t.Errorf("gdsio ran with %q", got)
	}
}

func TestRunGdsioFailure(t *testing.T) {
	bin, _ := fakeGdsio(t, "echo 'cuFile initialization failed' >&2\nexit 1\n")
	c := SeedGdsioConfig("/f", 0)
	c.Binary = bin
	_, out, err := RunGdsio(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "cuFile initialization failed") || !strings.Contains(string(out), "cuFile initialization failed") {
		t.Errorf("err = %v, output %q", err, out)
	}
	bin, _ = fakeGdsio(t, "echo nothing useful\n")
	c.Binary = bin
	if _, _, err := RunGdsio(context.Background(), c); !errors.Is(err, ErrNoGdsioResult) {
		t.Errorf("err = %v, want ErrNoGdsioResult", err)
	}
}

func TestFindGdsioMissing(t *testing.T) {
	if _, err := os.Stat(DefaultGdsioPath); err == nil {
		t.Skip("gdsio is installed here")
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := FindGdsio(); !errors.Is(err, ErrNoGdsio) || !strings.Contains(err.Error(), DefaultGdsioPath) {
		t.Errorf("err = %v", err)
	}
}

func TestAggregateGdsio(t *testing.T) {
	// The seed's five nodes, one GPU each.
	var rs []GdsioResult
	for i, n := range []string{"a", "b", "c", "d", "e"} {
		rs = append(rs, GdsioResult{Node: n, IoType: "READ", XferType: "GPUD", ThroughputGiBs: 26.42, Ops: 1000 * int64(i+1), AvgLatencyUs: float64(100 * (i + 1)), TotalTimeS: 60 + float64(i), DataKiB: 10})
	}
	a, err := AggregateGdsio(rs)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(a.ThroughputGiBs-132.1) > 1e-9 || a.Ops != 15000 || a.Results != 5 || len(a.Nodes) != 5 || a.MaxTotalTimeS != 64 || a.DataKiB != 50 {
		t.Errorf("aggregate = %+v", a)
	}
	// ops-weighted latency: sum(1000i * 100i)/15000 for i=1..5 = 100*55/15
	if want := 100.0 * 55 / 15; math.Abs(a.AvgLatencyUs-want) > 1e-9 {
		t.Errorf("latency = %v, want %v", a.AvgLatencyUs, want)
	}
	rs[2].XferType = "CPUONLY"
	if _, err := AggregateGdsio(rs); err == nil || !strings.Contains(err.Error(), `"c"`) {
		t.Errorf("mixed kinds: err = %v", err)
	}
	if _, err := AggregateGdsio(nil); err == nil {
		t.Error("empty aggregate: no error")
	}
}
