package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/daemon/nvme"
)

func TestFabricServeFlagsValidated(t *testing.T) {
	for _, tc := range []struct {
		o    fabricServeFlags
		want string
	}{
		{fabricServeFlags{ns: []string{"x"}}, "--nqn"},
		{fabricServeFlags{nqn: "nqn.x"}, "--ns"},
		{fabricServeFlags{nqn: "nqn.x", ns: []string{"x"}, anaState: "sleepy"}, "--ana-state"},
		{fabricServeFlags{nqn: "nqn.x", ns: []string{"x"}, anaState: "optimized", size: "lots"}, "--size"},
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
	o := fabricServeFlags{listen: "127.0.0.1:0", nqn: "nqn.2026-01.io.tier0:cli", ns: []string{filepath.Join(dir, "ns1.img")},
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
