package target

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

var updateCorpus = flag.Bool("update-fuzz-corpus", false, "rewrite testdata/fuzz/FuzzServeConn/seed-* from serveConnSeeds")

// fuzzCntlID is the controller ID of the bystander admin queue that the
// fuzz target opens first; seeds connect I/O queues to it.
const fuzzCntlID = 1

func capsule(sqe nvme.SQE, data []byte, digest uint8) []byte {
	sqe.Flags |= nvme.SQEFlagSGLMeta
	if data != nil {
		sqe.DPTR = nvme.SGL{Length: uint32(len(data)), Type: nvme.SGLTypeInCapsule}
	} else if sqe.DPTR.Type == 0 {
		sqe.DPTR.Type = nvme.SGLTypeTransport
	}
	b := nvme.AppendCapsuleCmd(nil, &sqe, len(data), digest)
	b = append(b, data...)
	if len(data) > 0 && digest&nvme.DigestData != 0 {
		b = nvme.AppendDigest(b, data)
	}
	return b
}

// serveConnSeeds are byte streams a host could send on one connection.
func serveConnSeeds() [][]byte {
	var seeds [][]byte
	for _, dg := range []uint8{0, nvme.DigestHeader | nvme.DigestData} {
		ic := nvme.ICReq{Digest: dg}.Append(nil)
		adm := nvme.ConnectData{HostID: testHostID, CntlID: 0xFFFF, SubNQN: testSubNQN, HostNQN: testHostNQN}
		b := append([]byte{}, ic...)
		b = append(b, capsule(nvme.ConnectCmd{SQSize: 31, KATO: 0}.SQE(1), adm.Append(nil), dg)...)
		b = append(b, capsule(nvme.PropertyCmd{Offset: nvme.PropCC, Value: 1 | 6<<16 | 4<<20}.SQE(2, true), nil, dg)...)
		b = append(b, capsule(nvme.IdentifyCmd{CNS: nvme.CNSController}.SQE(3), nil, dg)...)
		b = append(b, capsule(nvme.GetLogPageCmd{LID: nvme.LogANA, Len: 4096}.SQE(4), nil, dg)...)
		b = append(b, capsule(nvme.SQE{Opcode: nvme.AdminAsyncEvent, CID: 5}, nil, dg)...)
		seeds = append(seeds, b)

		io := nvme.ConnectData{HostID: testHostID, CntlID: fuzzCntlID, SubNQN: testSubNQN, HostNQN: testHostNQN}
		b = append([]byte{}, ic...)
		b = append(b, capsule(nvme.ConnectCmd{QID: 1, SQSize: 15}.SQE(1), io.Append(nil), dg)...)
		w := rwSQE(nvme.CmdWrite, 1, 2, 1)
		w.CID = 2
		b = append(b, capsule(w, bytes.Repeat([]byte{0x5A}, 512), dg)...)
		r := rwSQE(nvme.CmdRead, 1, 2, 1)
		r.CID, r.DPTR = 3, nvme.SGL{Length: 512, Type: nvme.SGLTypeTransport}
		b = append(b, capsule(r, nil, dg)...)
		w2 := rwSQE(nvme.CmdWrite, 1, 8, 2)
		w2.CID, w2.DPTR = 4, nvme.SGL{Length: 1024, Type: nvme.SGLTypeTransport}
		b = append(b, capsule(w2, nil, dg)...)
		b = append(b, nvme.DataPDU{Type: nvme.PDUH2CData, Flags: nvme.FlagDataLast, CID: 4, TTag: 1, Length: 1024}.Append(nil, dg)...)
		b = append(b, make([]byte, 1024)...)
		if dg&nvme.DigestData != 0 {
			b = nvme.AppendDigest(b, make([]byte, 1024))
		}
		b = append(b, capsule(nvme.SQE{Opcode: nvme.CmdResvRegister, NSID: 1, CID: 5}, nvme.ResvKeys{Key2: 7}.Append(nil), dg)...)
		b = append(b, capsule(nvme.SQE{Opcode: nvme.CmdResvAcquire, NSID: 1, CID: 6, CDW10: 1 << 8}, nvme.ResvKeys{CRKey: 7}.Append(nil), dg)...)
		b = append(b, capsule(nvme.SQE{Opcode: nvme.CmdResvRelease, NSID: 1, CID: 7, CDW10: 1}, nvme.ResvKeys{CRKey: 7}.Append(nil)[:8], dg)...)
		b = append(b, capsule(nvme.SQE{Opcode: nvme.CmdDSM, NSID: 1, CID: 8, CDW11: nvme.DSMDeallocate}, nvme.DSMRange{NLB: 1, SLBA: 2}.Append(nil), dg)...)
		seeds = append(seeds, b)
	}
	disc := nvme.ConnectData{HostID: testHostID2, CntlID: 0xFFFF, SubNQN: nvme.DiscoveryNQN, HostNQN: testHostNQN2}
	b := nvme.ICReq{}.Append(nil)
	b = append(b, capsule(nvme.ConnectCmd{SQSize: 31}.SQE(1), disc.Append(nil), 0)...)
	b = append(b, capsule(nvme.PropertyCmd{Offset: nvme.PropCC, Value: 1 | 6<<16 | 4<<20}.SQE(2, true), nil, 0)...)
	b = append(b, capsule(nvme.GetLogPageCmd{LID: nvme.LogDiscovery, Len: 3072}.SQE(3), nil, 0)...)
	seeds = append(seeds, b)
	seeds = append(seeds, nvme.ICReq{}.Append(nil), []byte{4, 0, 72, 0, 0xFF, 0xFF, 0xFF, 0xFF}, nil)
	return seeds
}

func TestWriteServeConnCorpus(t *testing.T) {
	for i, in := range serveConnSeeds() {
		p := filepath.Join("testdata", "fuzz", "FuzzServeConn", fmt.Sprintf("seed-%d", i))
		content := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", in)
		if *updateCorpus {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, content, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, content) {
			t.Errorf("%s missing or stale; run go test ./daemon/target -run TestWriteServeConnCorpus -update-fuzz-corpus", p)
		}
	}
}

// FuzzServeConn feeds arbitrary bytes as one host connection into the
// target's connection handler. The handler must neither panic nor hang,
// and a bystander controller must keep working.
func FuzzServeConn(f *testing.F) {
	for _, s := range serveConnSeeds() {
		f.Add(s)
	}
	old := connectTimeout
	connectTimeout = 2 * time.Second
	f.Cleanup(func() { connectTimeout = old })
	tg, addr := newTarget(f, Config{KeepAliveSweep: time.Hour, MaxDataTransfer: 64 << 10, InlineDataSize: 4096}, blockdev.NewMem(1<<20, 512))
	by, id := adminConnect(f, addr, 0, testHostNQN, testHostID)
	if id != fuzzCntlID {
		f.Fatalf("bystander controller ID %d, seeds assume %d", id, fuzzCntlID)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			tg.ServeConn(server)
			close(done)
		}()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = client.Write(in)
		client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("ServeConn did not return after the host closed the connection")
		}
		by.t = t
		if r, err := by.try(nvme.SQE{Opcode: nvme.AdminKeepAlive}, nil, false); err != nil || !r.cqe.Status.OK() {
			t.Fatalf("bystander controller broken: %v %v", r.cqe.Status, err)
		}
	})
}
