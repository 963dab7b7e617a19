package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// fakeTarget is an in-memory NVMe/RDMA target behind fake queue pairs: it
// checks what the host sends (private data, Connect fields, keyed SGLs)
// and answers like nvmet-rdma. Its "RDMA" is a copy to or from the slot
// buffer that the keyed SGL names, so a wrong address, length or key fails.
type fakeTarget struct {
	t      *testing.T
	mu     sync.Mutex
	disk   []byte
	bs     int
	mdts   uint8
	inc    uint64 // boot incarnation reported in Identify Controller
	mqes   uint16
	cc     uint64
	conns  []*fakeConn
	cntlID uint16
	// failWrite makes writes at this LBA fail with the status.
	failLBA    uint64
	failStatus nvme.Status
	order      int // flips the SEND/RECV completion order
}

type fakeConn struct {
	tg    *fakeTarget
	pd    PrivateData
	cfg   Config
	mem   []byte
	rkey  uint32
	base  uint64
	mu    sync.Mutex
	wg    sync.WaitGroup
	qid   uint16
	ready bool
}

func (tg *fakeTarget) dial(ctx context.Context, addr string, pd PrivateData, cfg Config) (capsuleConn, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if pd.QID == 0 && pd.HSQSize+1 > adminDepth {
		return nil, fmt.Errorf("rejected: %s", RejectReason(RejectInvalidHSQSize))
	}
	if int(pd.HRQSize) != cfg.Depth || int(pd.HSQSize) != cfg.Depth-1 {
		tg.t.Errorf("queue %d private data HRQSIZE %d HSQSIZE %d for a queue of depth %d", pd.QID, pd.HRQSize, pd.HSQSize, cfg.Depth)
	}
	c := &fakeConn{tg: tg, pd: pd, cfg: cfg, mem: make([]byte, cfg.Depth*cfg.DataSize), rkey: 0x1000 + uint32(len(tg.conns)), base: 0x7f0000000000 + uint64(len(tg.conns))<<32, qid: pd.QID}
	tg.conns = append(tg.conns, c)
	return c, nil
}

func (c *fakeConn) Data(slot int) []byte {
	return c.mem[slot*c.cfg.DataSize : (slot+1)*c.cfg.DataSize]
}

func (c *fakeConn) Key(slot int) (uint64, uint32) {
	return c.base + uint64(slot*c.cfg.DataSize), c.rkey
}

func (c *fakeConn) Close() error { c.wg.Wait(); return nil }

// remote resolves a keyed SGL to the host memory it names, as an RNIC would.
func (c *fakeConn) remote(addr uint64, n int, key uint32) ([]byte, error) {
	if key != c.rkey {
		return nil, fmt.Errorf("rkey %#x, the queue's region has %#x", key, c.rkey)
	}
	if addr < c.base || addr+uint64(n) > c.base+uint64(len(c.mem)) {
		return nil, fmt.Errorf("address %#x+%d outside the registered region", addr, n)
	}
	return c.mem[addr-c.base : addr-c.base+uint64(n)], nil
}

func (c *fakeConn) Send(slot int, msg []byte) error {
	if len(msg) != nvme.SQELen {
		return fmt.Errorf("capsule of %d bytes, want 64", len(msg))
	}
	s, _ := nvme.ParseSQE(msg)
	if int(s.CID) != slot {
		c.tg.t.Errorf("command ID %d sent from slot %d", s.CID, slot)
	}
	addr, n, key, keyed := KeyedSGL(msg)
	if !keyed {
		c.tg.t.Errorf("command %#x: SGL type %#x, want keyed %#x", s.Opcode, msg[39], SGLTypeKeyed)
	}
	var data []byte
	if n > 0 {
		var err error
		if data, err = c.remote(addr, n, key); err != nil {
			c.tg.t.Errorf("command %#x: keyed SGL: %v", s.Opcode, err)
			return nil
		}
	}
	cqe := c.tg.exec(c, &s, data)
	cqe.CID, cqe.SQID = s.CID, c.qid
	resp := cqe.Append(nil)
	c.tg.mu.Lock()
	c.tg.order++
	sendFirst := c.tg.order%2 == 0
	c.tg.mu.Unlock()
	c.wg.Add(1)
	go func() { // the completion goroutine
		defer c.wg.Done()
		c.mu.Lock()
		defer c.mu.Unlock()
		if sendFirst {
			c.cfg.Handler(Completion{Op: OpSend, Slot: slot})
		}
		c.cfg.Handler(Completion{Op: OpRecv, Slot: 0, Data: resp})
		if !sendFirst {
			c.cfg.Handler(Completion{Op: OpSend, Slot: slot})
		}
	}()
	return nil
}

func (tg *fakeTarget) exec(c *fakeConn, s *nvme.SQE, data []byte) nvme.CQE {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	ok := nvme.CQE{}
	bad := nvme.CQE{Status: nvme.StatusInvalidField}
	if s.Opcode == nvme.AdminFabrics {
		switch s.FCType() {
		case nvme.FabricsConnect:
			cc := nvme.ParseConnectCmd(s)
			d, err := nvme.ParseConnectData(data)
			if err != nil || cc.QID != c.qid || int(cc.SQSize) != c.cfg.Depth-1 || d.SubNQN != "nqn.test:sub" {
				tg.t.Errorf("connect: qid %d sqsize %d data %+v err %v (queue %d depth %d)", cc.QID, cc.SQSize, d, err, c.qid, c.cfg.Depth)
				return bad
			}
			if cc.QID == 0 {
				tg.cntlID = 7
			} else if d.CntlID != tg.cntlID || tg.cc&1 == 0 {
				tg.t.Errorf("I/O queue connect with cntlid %d (have %d), CC %#x", d.CntlID, tg.cntlID, tg.cc)
				return bad
			}
			c.ready = true
			return nvme.CQE{Result: uint64(tg.cntlID)}
		case nvme.FabricsPropertyGet:
			p := nvme.ParsePropertyCmd(s)
			switch p.Offset {
			case nvme.PropCAP:
				return nvme.CQE{Result: uint64(tg.mqes)}
			case nvme.PropCSTS:
				return nvme.CQE{Result: tg.cc & 1}
			}
			return bad
		case nvme.FabricsPropertySet:
			tg.cc = nvme.ParsePropertyCmd(s).Value
			return ok
		}
		return bad
	}
	if !c.ready {
		tg.t.Errorf("command %#x before Connect", s.Opcode)
		return bad
	}
	if c.qid == 0 {
		if s.Opcode != nvme.AdminIdentify || len(data) != nvme.IdentifyLen {
			return bad
		}
		id := nvme.ParseIdentifyCmd(s)
		var b []byte
		switch id.CNS {
		case nvme.CNSController:
			ic := nvme.IdentifyController{MN: "fake", MDTS: tg.mdts, SGLS: 1<<2 | 1, CntlID: tg.cntlID, SubNQN: "nqn.test:sub", Incarnation: tg.inc}
			b = ic.Append(nil)
		case nvme.CNSNamespace:
			if id.NSID != 1 {
				b = make([]byte, nvme.IdentifyLen)
				break
			}
			lbads := uint8(9)
			if tg.bs == 4096 {
				lbads = 12
			}
			ns := nvme.IdentifyNamespace{NSZE: uint64(len(tg.disk) / tg.bs), NCAP: uint64(len(tg.disk) / tg.bs), LBAF: []nvme.LBAFormat{{LBADS: lbads}}}
			b = ns.Append(nil)
		default:
			return bad
		}
		copy(data, b)
		return ok
	}
	switch s.Opcode {
	case nvme.CmdRead, nvme.CmdWrite:
		off, n := int(s.SLBA())*tg.bs, int(s.NLB())*tg.bs
		if n != len(data) || off+n > len(tg.disk) {
			tg.t.Errorf("opcode %#x: %d blocks at %d with a %d-byte keyed SGL", s.Opcode, s.NLB(), s.SLBA(), len(data))
			return bad
		}
		if tg.mdts != 0 && n > 4096<<tg.mdts {
			tg.t.Errorf("transfer of %d bytes beyond MDTS %d", n, tg.mdts)
			return bad
		}
		if s.Opcode == nvme.CmdWrite {
			if tg.failStatus != 0 && s.SLBA() == tg.failLBA {
				return nvme.CQE{Status: tg.failStatus}
			}
			copy(tg.disk[off:], data)
		} else {
			copy(data, tg.disk[off:off+n])
		}
		return ok
	case nvme.CmdFlush:
		return ok
	case nvme.CmdWriteZeroes:
		off, n := int(s.SLBA())*tg.bs, int(s.NLB())*tg.bs
		clear(tg.disk[off : off+n])
		return ok
	case nvme.CmdDSM:
		r, err := nvme.ParseDSMRanges(data, 1)
		if err != nil {
			return bad
		}
		clear(tg.disk[int(r[0].SLBA)*tg.bs : int(r[0].SLBA+uint64(r[0].NLB))*tg.bs])
		return ok
	}
	return bad
}

func newFake(t *testing.T) *fakeTarget {
	tg := &fakeTarget{t: t, disk: make([]byte, 16<<20), bs: 512, mdts: 5, mqes: 127}
	old := dialQueue
	dialQueue = tg.dial
	t.Cleanup(func() { dialQueue = old })
	return tg
}

func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestHostOverFakeTarget drives the NVMe/RDMA host logic against the fake
// target: queue setup with the right private data, Connect, enable,
// Identify, keyed-SGL reads and writes of every size class (split at
// MDTS: 128 KiB here), Flush, Write Zeroes, Discard, and range checks.
func TestHostOverFakeTarget(t *testing.T) {
	tg := newFake(t)
	c, err := Connect(context.Background(), "10.0.0.1:4420", Options{SubNQN: "nqn.test:sub", IOQueues: 2, QueueDepth: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.CntlID() != 7 || c.MaxTransfer() != 128<<10 {
		t.Fatalf("cntlid %d max transfer %d, want 7 and 128 KiB (MDTS 5)", c.CntlID(), c.MaxTransfer())
	}
	if len(tg.conns) != 3 {
		t.Fatalf("%d queue pairs, want 3 (admin + 2 I/O)", len(tg.conns))
	}
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	if ns.Size() != 16<<20 || ns.BlockSize() != 512 {
		t.Fatalf("size %d block %d", ns.Size(), ns.BlockSize())
	}
	off := int64(0)
	for i, n := range []int{512, 4096, 8192, 64 << 10, 128 << 10, 128<<10 + 512, 1 << 20} {
		w := pattern(uint64(i), n)
		if _, err := ns.WriteAt(w, off); err != nil {
			t.Fatalf("write %d at %d: %v", n, off, err)
		}
		r := make([]byte, n)
		if _, err := ns.ReadAt(r, off); err != nil {
			t.Fatalf("read %d at %d: %v", n, off, err)
		}
		if !bytes.Equal(w, r) {
			t.Fatalf("%d bytes at %d read back different", n, off)
		}
		if !bytes.Equal(tg.disk[off:off+int64(n)], w) {
			t.Fatalf("%d bytes at %d: the target's medium differs from what was written", n, off)
		}
		off += int64(n)
	}
	// concurrent I/O over both queues
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o := int64(8<<20 + i*8192)
			w := pattern(uint64(100+i), 8192)
			if _, err := ns.WriteAt(w, o); err != nil {
				errs <- err
				return
			}
			r := make([]byte, 8192)
			if _, err := ns.ReadAt(r, o); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(w, r) {
				errs <- fmt.Errorf("block at %d read back different", o)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := ns.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := ns.WriteZeroes(0, 4096); err != nil || !bytes.Equal(tg.disk[:4096], make([]byte, 4096)) {
		t.Fatalf("write zeroes: %v", err)
	}
	if err := ns.Discard(4096, 8192); err != nil || !bytes.Equal(tg.disk[4096:12288], make([]byte, 8192)) {
		t.Fatalf("discard: %v", err)
	}
	if _, err := ns.ReadAt(make([]byte, 100), 0); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Errorf("misaligned read: %v, want ErrMisaligned", err)
	}
	if _, err := ns.ReadAt(make([]byte, 512), ns.Size()); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Errorf("read past the end: %v, want ErrOutOfRange", err)
	}
	if _, err := c.Namespace(2); err == nil {
		t.Errorf("Namespace(2) of a target with one namespace succeeded")
	}
	c.Close()
	if _, err := ns.ReadAt(make([]byte, 512), 0); !errors.Is(err, blockdev.ErrClosed) {
		t.Errorf("read after Close: %v, want ErrClosed", err)
	}
}

// TestHostStatusError: an NVMe error status from the target reaches the
// caller as that status, and the queue keeps working.
// TestNamespaceIncarnation: an RDMA member reports the boot incarnation
// of its target's node from Identify Controller (raid.Incarnated), 0 from
// a target that reports none.
func TestNamespaceIncarnation(t *testing.T) {
	for _, inc := range []uint64{0, 0x5eed} {
		tg := newFake(t)
		tg.inc = inc
		c, err := Connect(context.Background(), "10.0.0.1:4420", Options{SubNQN: "nqn.test:sub", IOQueues: 1, QueueDepth: 16})
		if err != nil {
			t.Fatal(err)
		}
		ns, err := c.Namespace(1)
		if err != nil {
			t.Fatal(err)
		}
		if got := ns.Incarnation(); got != inc {
			t.Errorf("incarnation %#x from a target reporting %#x", got, inc)
		}
		c.Close()
	}
}

func TestHostStatusError(t *testing.T) {
	tg := newFake(t)
	tg.failLBA, tg.failStatus = 8, nvme.StatusInvalidField|nvme.StatusDNR
	c, err := Connect(context.Background(), "10.0.0.1:4420", Options{SubNQN: "nqn.test:sub"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ns.WriteAt(make([]byte, 512), 8*512)
	var st nvme.Status
	if !errors.As(err, &st) || st.Code() != nvme.StatusInvalidField {
		t.Fatalf("write to the failing LBA: %v, want the target's Invalid Field status", err)
	}
	if _, err := ns.WriteAt(make([]byte, 512), 0); err != nil {
		t.Fatalf("write after a failed command: %v", err)
	}
}

// TestHostTransportError: a failed work completion fails the commands in
// flight with ErrIO and every later command too (the queue pair is dead).
func TestHostTransportError(t *testing.T) {
	tg := newFake(t)
	c, err := Connect(context.Background(), "10.0.0.1:4420", Options{SubNQN: "nqn.test:sub"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	io := tg.conns[1]
	io.cfg.Handler(Completion{Op: OpSend, Slot: 0, Err: errors.New("transport retry counter exceeded")})
	_, err = ns.WriteAt(make([]byte, 512), 0)
	if !errors.Is(err, blockdev.ErrIO) || !strings.Contains(err.Error(), "retry counter exceeded") {
		t.Fatalf("write on a failed queue: %v, want ErrIO naming the completion error", err)
	}
}

func TestPrivateData(t *testing.T) {
	p := PrivateData{QID: 3, HRQSize: 128, HSQSize: 127, CntlID: 9}
	b := p.Append(nil)
	if len(b) != PrivateDataLen || b[2] != 3 || b[4] != 128 || b[6] != 127 || b[8] != 9 {
		t.Fatalf("encoding %x", b)
	}
	q, err := ParsePrivateData(b)
	if err != nil || q != p {
		t.Fatalf("round trip %+v %v", q, err)
	}
	if _, err := ParsePrivateData(b[:10]); err == nil {
		t.Errorf("10-byte private data accepted")
	}
	b[0] = 1
	if _, err := ParsePrivateData(b); err == nil {
		t.Errorf("record format 1 accepted")
	}
	if a := (AcceptData{CRQSize: 32}).Append(nil); len(a) != PrivateDataLen || a[2] != 32 {
		t.Errorf("accept data %x", a)
	}
}

func TestKeyedSGL(t *testing.T) {
	s := nvme.SQE{Opcode: nvme.CmdRead, CID: 5}
	b := s.Append(nil)
	PutKeyedSGL(b, 0x1122334455667788, 0x100000, 0xdeadbeef)
	want := []byte{0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0x00, 0x10, 0xef, 0xbe, 0xad, 0xde, 0x40}
	if !bytes.Equal(b[24:40], want) {
		t.Fatalf("DPTR %x, want %x", b[24:40], want)
	}
	a, n, k, ok := KeyedSGL(b)
	if a != 0x1122334455667788 || n != 0x100000 || k != 0xdeadbeef || !ok {
		t.Fatalf("decoded %#x %#x %#x %v", a, n, k, ok)
	}
}
