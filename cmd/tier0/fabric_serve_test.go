package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
	"tier0/internal/units"
)

func TestFabricServeFlagsValidated(t *testing.T) {
	for _, tc := range []struct {
		o    fabricServeOptions
		want string
	}{
		{fabricServeOptions{ns: []string{"x"}}, "--nqn"},
		{fabricServeOptions{nqn: "nqn.x"}, "--ns"},
		{fabricServeOptions{nqn: "nqn.x", ns: []string{"x"}, anaState: "sleepy"}, "--ana-state"},
		{fabricServeOptions{nqn: "nqn.x", ns: []string{"x"}, anaState: "optimized", size: "lots"}, "--size"},
	} {
		err := runFabricServe(context.Background(), &tc.o, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %s", tc.o, err, tc.want)
		}
	}
	if a, b := func() ([16]byte, [16]byte) { return namespaceIDs("nqn.a", 1) }(); a == b {
		t.Fatal("NGUID equals UUID")
	}
	n1, _ := namespaceIDs("nqn.a", 1)
	n2, _ := namespaceIDs("nqn.a", 2)
	n1b, _ := namespaceIDs("nqn.a", 1)
	if n1 == n2 || n1 != n1b {
		t.Fatal("namespace IDs must be deterministic and distinct per namespace")
	}
}

// TestFabricServeAnswersICReq runs the verb over a file and completes the
// NVMe/TCP connection handshake and a discovery Connect against it.
func TestFabricServeAnswersICReq(t *testing.T) {
	dir := t.TempDir()
	o := fabricServeOptions{listen: "127.0.0.1:0", nqn: "nqn.2026-01.io.tier0:cli", ns: []string{filepath.Join(dir, "ns1.img")},
		size: "4M", blockSize: 4096, anaState: "optimized", anaGroup: 1, cntlidBase: 1, cntlidCount: 16, buffered: true}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- runFabricServe(ctx, &o, pw, io.Discard); pw.Close() }()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no serving line: %v (%v)", err, <-done)
	}
	go io.Copy(io.Discard, pr)
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "serving" {
		t.Fatalf("unexpected output %q", line)
	}
	addr := strings.TrimSuffix(f[3], ":")
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	nc.Write(nvme.ICReq{}.Append(nil))
	resp := make([]byte, nvme.ICRespLen)
	if _, err := io.ReadFull(nc, resp); err != nil {
		t.Fatal(err)
	}
	if r, err := nvme.ParseICResp(resp); err != nil || r.MaxData < 4096 {
		t.Fatalf("ICResp %+v %v", r, err)
	}
	d := nvme.ConnectData{CntlID: 0xFFFF, SubNQN: o.nqn, HostNQN: "nqn.test-host"}
	sqe := nvme.ConnectCmd{SQSize: 31}.SQE(1)
	b := nvme.AppendCapsuleCmd(nil, &sqe, nvme.ConnectDataLen, 0)
	nc.Write(d.Append(b))
	cr := make([]byte, nvme.CapsuleRespHLen)
	if _, err := io.ReadFull(nc, cr); err != nil {
		t.Fatal(err)
	}
	if cqe, err := nvme.ParseCapsuleResp(cr); err != nil || !cqe.Status.OK() || cqe.DW0() < 1 || cqe.DW0() > 16 {
		t.Fatalf("connect: %+v %v", cqe, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(o.ns[0]); err != nil || st.Size() != 4<<20 {
		t.Fatalf("namespace file: %v %v", st, err)
	}
	_ = bytes.MinRead
}

// startServe runs `fabric serve` with o and returns its listen address.
func startServe(t *testing.T, o fabricServeOptions) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- runFabricServe(ctx, &o, pw, io.Discard); pw.Close() }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fabric serve: %v", err)
		}
	})
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("no serving line: %v", err)
	}
	go io.Copy(io.Discard, pr)
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "serving" {
		t.Fatalf("unexpected output %q", line)
	}
	return strings.TrimSuffix(f[3], ":")
}

// TestFabricServeMemNamespace serves --ns mem:8M beside a file namespace
// and moves data through both with tier0's host.
func TestFabricServeMemNamespace(t *testing.T) {
	const nqn = "nqn.2026-01.io.tier0:mem"
	addr := startServe(t, fabricServeOptions{listen: "127.0.0.1:0", nqn: nqn, ns: []string{"mem:8M", filepath.Join(t.TempDir(), "f.img")},
		size: "1M", blockSize: 4096, anaState: "optimized", anaGroup: 1, cntlidBase: 1, cntlidCount: 16, buffered: true})
	c, err := host.Dial(context.Background(), addr, host.Options{SubNQN: nqn, IOQueues: 1, CtrlLossTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	if ns.Size() != 8<<20 || ns.BlockSize() != 4096 {
		t.Fatalf("mem:8M namespace: size %d block %d, want %d and 4096", ns.Size(), ns.BlockSize(), 8<<20)
	}
	if ns2, err := c.Namespace(2); err != nil || ns2.Size() != 1<<20 {
		t.Fatalf("file namespace beside it: %v", err)
	}
	w := make([]byte, 64<<10)
	fillPattern(w, 7<<20, 9)
	if _, err := ns.WriteAt(w, 7<<20); err != nil {
		t.Fatal(err)
	}
	r := make([]byte, len(w))
	if _, err := ns.ReadAt(r, 7<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r, w) {
		t.Fatal("mem namespace did not read back what was written")
	}
	if _, err := ns.ReadAt(r[:4096], 8<<20); err == nil {
		t.Fatal("read past the end of mem:8M succeeded")
	}
}

func TestFabricServeMemNamespaceBadSize(t *testing.T) {
	for _, ns := range []string{"mem:", "mem:lots", "mem:0", "mem:1000"} {
		o := fabricServeOptions{listen: "127.0.0.1:0", nqn: "nqn.x", ns: []string{ns}, blockSize: 4096, anaState: "optimized", anaGroup: 1, cntlidBase: 1, cntlidCount: 1}
		err := runFabricServe(context.Background(), &o, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), ns) {
			t.Errorf("--ns %s: error %v, want one naming it", ns, err)
		}
	}
}

// TestFabricSizes: the fabric verbs take the one size parser's sizes
// (units.ParseBytes, as the site file), in either case; a memory
// namespace's and --size must be positive.
func TestFabricSizes(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "4k": 4096, "4K": 4096, "64KiB": 64 << 10, "64kib": 64 << 10,
		"1M": 1 << 20, "512m": 512 << 20, "2G": 2 << 30, "1T": 1 << 40, "0": 0} {
		if got, err := units.ParseBytes(in); err != nil || got != want {
			t.Errorf("units.ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1", "4X", "1.5G"} {
		if _, err := units.ParseBytes(in); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("units.ParseBytes(%q): error %v, want one naming the value", in, err)
		}
	}
	if _, err := positiveBytes("0"); err == nil || !strings.Contains(err.Error(), `"0"`) {
		t.Errorf("positiveBytes(0): %v, want an error naming the zero size", err)
	}
	if n, err := positiveBytes("512M"); err != nil || n != 512<<20 {
		t.Errorf("positiveBytes(512M) = %d, %v", n, err)
	}
}

// TestFabricServeTransportRDMA: fabric serve --transport rdma reaches the
// target's NVMe/RDMA listener: without the rdma build tag it says how to
// build one; with it on a machine without an RDMA device it names what is
// missing (test/rdma serves Linux's nvme-rdma host this way in the guest).
// An unknown transport is refused with the valid values.
func TestFabricServeTransportRDMA(t *testing.T) {
	_, stderr, code := runCLI(t, nil, "fabric", "serve", "--transport", "rdma", "--listen", "127.0.0.1:0", "--nqn", "nqn.2026-12.io.tier0:x", "--ns", "mem:1M")
	want := "--transport rdma: " + rdma.ErrNotBuilt.Error()
	if rdma.Built {
		want = "NVMe/RDMA listen on 127.0.0.1:0: no RDMA device"
	}
	if code != 1 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr %q; want exit 1 and %q", code, stderr, want)
	}
	if rdma.Built {
		// all addresses, nothing to advertise: refused with what to do
		_, stderr, code = runCLI(t, nil, "fabric", "serve", "--transport", "rdma", "--nqn", "nqn.2026-12.io.tier0:x", "--ns", "mem:1M")
		if code != 1 || !strings.Contains(stderr, "--advertise") {
			t.Fatalf("exit %d, stderr %q; want exit 1 naming --advertise", code, stderr)
		}
	}
	_, stderr, code = runCLI(t, nil, "fabric", "serve", "--transport", "ib", "--nqn", "nqn.2026-12.io.tier0:x", "--ns", "mem:1M")
	if code != 1 || !strings.Contains(stderr, `--transport "ib"`) || !strings.Contains(stderr, "tcp or rdma") {
		t.Fatalf("exit %d, stderr %q; want exit 1 naming the value and tcp or rdma", code, stderr)
	}
}
