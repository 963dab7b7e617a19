package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev/local"
	"tier0/daemon/target"
	"tier0/internal/units"
)

// perfTarget serves a memory namespace the way `fabric serve --ns mem:SIZE`
// does, in this process, and returns its address.
func perfTarget(t *testing.T, nqn string, size int64) (string, *local.Memory) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(l)
	t.Cleanup(func() { tg.Close() })
	if err := tg.AddSubsystem(target.SubsystemConfig{NQN: nqn, AllowAnyHost: true}); err != nil {
		t.Fatal(err)
	}
	mem, err := local.NewMemory(size, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.AddNamespace(nqn, target.NamespaceConfig{NSID: 1, Device: mem}); err != nil {
		t.Fatal(err)
	}
	return l.Addr().String(), mem
}

// TestFabricPerfLoopback runs a short benchmark of each workload against a
// memory namespace on loopback and checks what it reports.
func TestFabricPerfLoopback(t *testing.T) {
	const nqn = "nqn.2026-12.io.tier0.test:perf"
	addr, mem := perfTarget(t, nqn, 8<<20)
	for _, w := range []struct{ workload, bs string }{{"randwrite", "4k"}, {"randread", "4k"}, {"write", "128k"}, {"read", "128K"}} {
		var out bytes.Buffer
		o := fabricPerfOptions{connect: addr, nqn: nqn, nsid: 1, workload: w.workload, bs: w.bs, qd: 8, cores: 1,
			duration: 200 * time.Millisecond, region: "4M", json: true}
		if err := runFabricPerf(context.Background(), &o, &out); err != nil {
			t.Fatalf("%s: %v", w.workload, err)
		}
		var r fabricPerfResult
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v in %q", w.workload, err, out.String())
		}
		bs, _ := units.ParseBytes(w.bs)
		if r.Workload != w.workload || r.BlockSize != int(bs) || r.QueueDepth != 8 || r.IOs == 0 || r.Bytes != r.IOs*bs ||
			r.IOPS <= 0 || r.MiBps <= 0 || r.CPUPerIO <= 0 || r.Queues != 1 || r.NQN != nqn {
			t.Fatalf("%s: implausible result %+v", w.workload, r)
		}
		l := r.Latency
		if !(0 < l.P50 && l.P50 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max*1.04) {
			t.Fatalf("%s: latency percentiles out of order: %+v", w.workload, l)
		}
	}
	// the writes landed in the first 4 MiB (--region) only
	z := make([]byte, 4<<20)
	if _, err := mem.ReadAt(z, 4<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(z, make([]byte, len(z))) {
		t.Fatal("a write went past --region 4M")
	}
	if _, err := mem.ReadAt(z, 0); err != nil || bytes.Equal(z, make([]byte, len(z))) {
		t.Fatalf("nothing was written inside --region: %v", err)
	}
}

func TestFabricPerfHumanOutput(t *testing.T) {
	const nqn = "nqn.2026-12.io.tier0.test:perf-text"
	addr, _ := perfTarget(t, nqn, 1<<20)
	var out bytes.Buffer
	o := fabricPerfOptions{connect: addr, nqn: nqn, nsid: 1, workload: "randread", bs: "4k", qd: 4, cores: 1, queues: 2, duration: 100 * time.Millisecond, region: "0"}
	if err := runFabricPerf(context.Background(), &o, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 I/O queue(s)", "IOPS", "MiB/s", "p50", "p99", "p99.9", "max", "us per I/O"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestFabricPerfFlagsValidated(t *testing.T) {
	base := fabricPerfOptions{connect: "127.0.0.1:1", nqn: "nqn.x", workload: "randread", bs: "4k", qd: 32, cores: 1, duration: time.Second, region: "0"}
	for _, tc := range []struct {
		mod  func(*fabricPerfOptions)
		want string
	}{
		{func(o *fabricPerfOptions) { o.connect = "" }, "--connect"},
		{func(o *fabricPerfOptions) { o.workload = "mixed" }, `"mixed"`},
		{func(o *fabricPerfOptions) { o.bs = "4q" }, "--bs"},
		{func(o *fabricPerfOptions) { o.qd = 0 - 1 }, "queue depth -1"},
		{func(o *fabricPerfOptions) { o.cores = 0 }, "--cores 0"},
		{func(o *fabricPerfOptions) { o.duration = 0 }, "--time"},
		{func(o *fabricPerfOptions) { o.region = "x" }, "--region"},
	} {
		o := base
		tc.mod(&o)
		err := runFabricPerf(context.Background(), &o, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one naming %s", err, tc.want)
		}
	}
}
