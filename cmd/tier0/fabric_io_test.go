package main

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/target"
)

func TestFabricIOWriteVerify(t *testing.T) {
	const nqn = "nqn.2026-11.io.tier0.test:cli"
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(l)
	defer tg.Close()
	if err := tg.AddSubsystem(target.SubsystemConfig{NQN: nqn, AllowAnyHost: true}); err != nil {
		t.Fatal(err)
	}
	mem := blockdev.NewMem(8<<20, 512)
	if err := tg.AddNamespace(nqn, target.NamespaceConfig{NSID: 1, Device: mem}); err != nil {
		t.Fatal(err)
	}
	base := fabricIOOptions{connect: l.Addr().String(), nqn: nqn, nsid: 1, offset: "1M", length: "3M", block: "256K",
		seed: 42, queues: 2, depth: 16, parallel: 4, timeout: 60e9}
	w := base
	w.write = true
	if err := runFabricIO(context.Background(), &w, io.Discard); err != nil {
		t.Fatalf("write: %v", err)
	}
	// the device holds the pattern at the absolute offsets
	got := make([]byte, 4096)
	mem.ReadAt(got, 2<<20)
	want := make([]byte, 4096)
	fillPattern(want, 2<<20, 42)
	if string(got) != string(want) {
		t.Fatal("device content at 2 MiB is not the pattern")
	}
	v := base
	v.verify, v.offset, v.length = true, "2M", "1M" // a sub-range verifies
	if err := runFabricIO(context.Background(), &v, io.Discard); err != nil {
		t.Fatalf("verify: %v", err)
	}
	v.seed = 43
	err = runFabricIO(context.Background(), &v, io.Discard)
	var ve *verifyError
	if !errors.As(err, &ve) || ve.ExitCode() != 2 || ve.off != 2<<20 {
		t.Fatalf("verify with the wrong seed: %v, want a verify error at offset %d with exit code 2", err, 2<<20)
	}
	bad := base
	bad.read, bad.offset = true, "7M" // 1M+3M past the 8 MiB end
	if err := runFabricIO(context.Background(), &bad, io.Discard); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Fatalf("range past the end: %v, want ErrOutOfRange", err)
	}
	two := base
	two.read, two.write = true, true
	if err := runFabricIO(context.Background(), &two, io.Discard); err == nil {
		t.Fatal("--read with --write accepted")
	}
}
