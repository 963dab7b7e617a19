package target

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
)

// memAcceptor is an RDMA listener whose queue pairs are rdma.MemPairs: the
// target's NVMe/RDMA transport runs, without an RDMA device, against
// tier0's NVMe/RDMA host (rdma.Connect with Options.Dial) or a raw queue.
type memAcceptor struct {
	dials  chan memDial
	closed chan struct{}
	once   sync.Once
}

type memDial struct {
	pd    rdma.PrivateData
	cfg   rdma.Config
	reply chan memReply
}

type memReply struct {
	host *rdma.MemConn
	err  error
}

func (a *memAcceptor) Accept(ctx context.Context, decide rdma.Decide) (rdmaLink, error) {
	select {
	case d := <-a.dials:
		cfg, ad, st := decide(d.pd)
		if st != 0 {
			err := fmt.Errorf("the target rejected queue %d: %s", d.pd.QID, rdma.RejectReason(st))
			d.reply <- memReply{err: err}
			return nil, err
		}
		_ = ad
		h, tg, err := rdma.MemPair(d.cfg, cfg)
		d.reply <- memReply{host: h, err: err}
		if err != nil {
			return nil, err
		}
		return tg, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-a.closed:
		return nil, rdma.ErrClosed
	}
}

func (a *memAcceptor) Port() int    { return 4420 }
func (a *memAcceptor) Close() error { a.once.Do(func() { close(a.closed) }); return nil }

func (a *memAcceptor) dialMem(ctx context.Context, pd rdma.PrivateData, cfg rdma.Config) (*rdma.MemConn, error) {
	d := memDial{pd: pd, cfg: cfg, reply: make(chan memReply, 1)}
	select {
	case a.dials <- d:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	rep := <-d.reply
	return rep.host, rep.err
}

func (a *memAcceptor) dial(ctx context.Context, addr string, pd rdma.PrivateData, cfg rdma.Config) (rdma.QueueConn, error) {
	h, err := a.dialMem(ctx, pd, cfg)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// newRDMATarget serves testSubNQN (one namespace on dev) over a memory
// RDMA port at 10.9.8.7:4420.
func newRDMATarget(t testing.TB, cfg Config, dev blockdev.Device) (*Target, *memAcceptor) {
	t.Helper()
	acc := &memAcceptor{dials: make(chan memDial), closed: make(chan struct{})}
	old := listenRDMA
	listenRDMA = func(string) (rdmaAcceptor, error) { return acc, nil }
	t.Cleanup(func() { listenRDMA = old })
	cfg.RDMAListen = "10.9.8.7:4420"
	tg, _ := newTarget(t, cfg, dev)
	return tg, acc
}

// TestRDMATargetWithTier0Host: tier0's NVMe/RDMA host connects to the
// target's RDMA transport (admin queue, two I/O queues, keyed SGLs both
// ways) and every size class up to MDTS, split above it, and concurrent
// I/O read back what was written, on the device itself too.
func TestRDMATargetWithTier0Host(t *testing.T) {
	dev := blockdev.NewMem(testSize, testBS)
	tg, acc := newRDMATarget(t, Config{MaxDataTransfer: 256 << 10}, dev)
	if got := tg.RDMAAddr(); got != "10.9.8.7:4420" {
		t.Errorf("RDMAAddr %q, want 10.9.8.7:4420", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc, err := rdma.Connect(ctx, "10.9.8.7:4420", rdma.Options{SubNQN: testSubNQN, HostNQN: testHostNQN, IOQueues: 2, QueueDepth: 32, Dial: acc.dial, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("tier0's RDMA host to the target's RDMA port: %v", err)
	}
	defer hc.Close()
	if id := hc.Identify(); id.SGLS&(1<<2) == 0 || id.IOCCSZ != uint32((nvme.SQELen+defaultInline)/16) {
		t.Errorf("Identify over RDMA: SGLS %#x (want keyed bit 2), IOCCSZ %d", id.SGLS, id.IOCCSZ)
	}
	ns, err := hc.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(0)
	for _, n := range []int{512, 4096, 8192, 64 << 10, 256 << 10, 1<<20 + 512} { // MDTS 256 KiB
		w := randBytes(t, n)
		if _, err := ns.WriteAt(w, off); err != nil {
			t.Fatalf("write %d at %d: %v", n, off, err)
		}
		got := make([]byte, n)
		if _, err := ns.ReadAt(got, off); err != nil {
			t.Fatalf("read %d at %d: %v", n, off, err)
		}
		if !bytes.Equal(got, w) {
			t.Fatalf("read back %d bytes at %d: differ", n, off)
		}
		direct := make([]byte, n)
		dev.ReadAt(direct, off)
		if !bytes.Equal(direct, w) {
			t.Fatalf("device holds other data than the %d bytes written at %d", n, off)
		}
		off += int64(n+4095) / 4096 * 4096
	}
	// more commands than the queues have data buffers at once
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o := int64(4<<20) + int64(i)*(32<<10)
			w := bytes.Repeat([]byte{byte(i + 1)}, 32<<10)
			if _, err := ns.WriteAt(w, o); err != nil {
				errs <- err
				return
			}
			got := make([]byte, len(w))
			if _, err := ns.ReadAt(got, o); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, w) {
				errs <- fmt.Errorf("concurrent pair %d read back other data", i)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := ns.Flush(); err != nil {
		t.Errorf("flush: %v", err)
	}
}

// rawRDMAQueue is a minimal NVMe/RDMA host queue for what tier0's host
// does not send: in-capsule data, and the discovery log.
type rawRDMAQueue struct {
	t    *testing.T
	c    *rdma.MemConn
	cqes chan nvme.CQE
	errs chan error
}

func dialRawRDMA(t *testing.T, acc *memAcceptor, qid uint16, depth int) *rawRDMAQueue {
	t.Helper()
	q := &rawRDMAQueue{t: t, cqes: make(chan nvme.CQE, depth), errs: make(chan error, 4)}
	cfg := rdma.Config{Depth: depth, RecvSize: nvme.CQELen, SendSize: nvme.SQELen + 2*defaultInline, DataSize: 64 << 10, Handler: func(c rdma.Completion) {
		switch {
		case c.Err != nil:
			select {
			case q.errs <- c.Err:
			default:
			}
		case c.Op == rdma.OpRecv:
			cqe, _ := nvme.ParseCQE(c.Data)
			q.cqes <- cqe
		}
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := acc.dialMem(ctx, rdma.PrivateData{QID: qid, HRQSize: uint16(depth), HSQSize: uint16(depth - 1)}, cfg)
	if err != nil {
		t.Fatalf("queue %d: %v", qid, err)
	}
	q.c = h
	t.Cleanup(func() { h.Close() })
	return q
}

// exec sends s with inline data (in the capsule) or a keyed SGL to slot 0's
// buffer holding keyed (a write) or receiving n bytes (a read).
func (q *rawRDMAQueue) exec(s nvme.SQE, inline []byte, keyedLen int, keyedData []byte) nvme.CQE {
	q.t.Helper()
	b := s.Append(nil)
	switch {
	case inline != nil:
		b[39] = nvme.SGLTypeInCapsule
		binary.LittleEndian.PutUint64(b[24:], 0)
		binary.LittleEndian.PutUint32(b[32:], uint32(len(inline)))
		b = append(b, inline...)
	case keyedLen > 0:
		copy(q.c.Data(0), keyedData)
		addr, key := q.c.Key(0)
		rdma.PutKeyedSGL(b, addr, keyedLen, key)
	default:
		rdma.PutKeyedSGL(b, 0, 0, 0)
	}
	if err := q.c.Send(0, b); err != nil {
		q.t.Fatal(err)
	}
	select {
	case cqe := <-q.cqes:
		return cqe
	case err := <-q.errs:
		q.t.Fatalf("command %#x: the queue failed: %v", s.Opcode, err)
	case <-time.After(10 * time.Second):
		q.t.Fatalf("command %#x: no response", s.Opcode)
	}
	return nvme.CQE{}
}

func (q *rawRDMAQueue) connect(subnqn string, cntlid uint16, depth int, inline bool) nvme.CQE {
	q.t.Helper()
	var hid [16]byte
	hid[0] = 7
	cd := nvme.ConnectData{HostID: hid, CntlID: cntlid, SubNQN: subnqn, HostNQN: testHostNQN}
	d := cd.Append(nil)
	qid := uint16(0)
	if cntlid != nvme.CntlIDDynamic {
		qid = 1
	}
	s := nvme.ConnectCmd{QID: qid, SQSize: uint16(depth - 1)}.SQE(1)
	if inline {
		return q.exec(s, d, 0, nil)
	}
	return q.exec(s, nil, len(d), d)
}

// TestRDMATargetInCapsuleAndDiscovery: what Linux's nvme-rdma host does
// and tier0's host does not: the I/O queue's Connect data and small
// writes in the capsule (up to IOCCSZ), larger in-capsule data refused;
// the discovery log read over the RDMA port names transport RDMA, its
// TSAS and the RDMA port's address; a connect request beyond the queue
// limits is rejected with the NVMe/RDMA status.
func TestRDMATargetInCapsuleAndDiscovery(t *testing.T) {
	dev := blockdev.NewMem(testSize, testBS)
	_, acc := newRDMATarget(t, Config{}, dev)

	// discovery over RDMA
	dq := dialRawRDMA(t, acc, 0, 4)
	if cqe := dq.connect(nvme.DiscoveryNQN, nvme.CntlIDDynamic, 4, false); !cqe.Status.OK() {
		t.Fatalf("discovery connect: %v", cqe.Status)
	}
	set := nvme.PropertyCmd{Offset: nvme.PropCC, Value: uint64(nvme.CCEnable | 6<<16 | 4<<20)}.SQE(2, true)
	if cqe := dq.exec(set, nil, 0, nil); !cqe.Status.OK() {
		t.Fatalf("CC.EN: %v", cqe.Status)
	}
	glp := nvme.GetLogPageCmd{LID: nvme.LogDiscovery, Len: 3 * 1024}.SQE(3)
	if cqe := dq.exec(glp, nil, 3*1024, nil); !cqe.Status.OK() {
		t.Fatalf("discovery log: %v", cqe.Status)
	}
	l, err := nvme.ParseDiscoveryLog(dq.c.Data(0)[:3*1024])
	if err != nil || len(l.Entries) != 2 {
		t.Fatalf("discovery log over RDMA: %v, %d entries (want the discovery subsystem and %s)", err, len(l.Entries), testSubNQN)
	}
	for i, e := range l.Entries {
		raw := dq.c.Data(0)[1024*(i+1):]
		if e.TrType != trTypeRDMA || e.TrAddr != "10.9.8.7" || e.TrSvcID != "4420" || raw[768] != 1 || raw[769] != 1 || raw[770] != 1 {
			t.Errorf("entry %d (%s): trtype %d at %s:%s, TSAS qptype %d prtype %d cms %d; want RDMA (1) at 10.9.8.7:4420, TSAS 1 1 1",
				i, e.SubNQN, e.TrType, e.TrAddr, e.TrSvcID, raw[768], raw[769], raw[770])
		}
	}

	// an admin queue, then an I/O queue whose Connect data is in the capsule
	aq := dialRawRDMA(t, acc, 0, 4)
	cqe := aq.connect(testSubNQN, nvme.CntlIDDynamic, 4, false)
	if !cqe.Status.OK() {
		t.Fatalf("admin connect: %v", cqe.Status)
	}
	cntlid := uint16(cqe.DW0())
	if cqe := aq.exec(set, nil, 0, nil); !cqe.Status.OK() {
		t.Fatalf("CC.EN: %v", cqe.Status)
	}
	iq := dialRawRDMA(t, acc, 1, 8)
	if cqe := iq.connect(testSubNQN, cntlid, 8, true); !cqe.Status.OK() {
		t.Fatalf("I/O queue connect with in-capsule data: %v", cqe.Status)
	}
	w := randBytes(t, 8192)
	wr := nvme.SQE{Opcode: nvme.CmdWrite, CID: 4, NSID: 1, CDW10: 16, CDW12: uint32(8192/testBS - 1)}
	if cqe := iq.exec(wr, w, 0, nil); !cqe.Status.OK() {
		t.Fatalf("write of 8 KiB in the capsule: %v", cqe.Status)
	}
	got := make([]byte, 8192)
	dev.ReadAt(got, 16*testBS)
	if !bytes.Equal(got, w) {
		t.Fatal("the in-capsule write did not reach the device")
	}
	rd := nvme.SQE{Opcode: nvme.CmdRead, CID: 5, NSID: 1, CDW10: 16, CDW12: uint32(8192/testBS - 1)}
	if cqe := iq.exec(rd, nil, 8192, nil); !cqe.Status.OK() || !bytes.Equal(iq.c.Data(0)[:8192], w) {
		t.Fatalf("read back by RDMA WRITE: %v, equal %v", cqe.Status, bytes.Equal(iq.c.Data(0)[:8192], w))
	}
	// in-capsule data beyond IOCCSZ does not fit the receive buffer: on
	// RDMA that fails the queue pair (a local length error), and the
	// target closes the queue
	big := nvme.SQE{Opcode: nvme.CmdWrite, CID: 6, NSID: 1, CDW10: 64, CDW12: uint32((defaultInline+4096)/testBS - 1)}
	b := big.Append(nil)
	b[39] = nvme.SGLTypeInCapsule
	if err := iq.c.Send(0, append(b, make([]byte, defaultInline+4096)...)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-iq.errs:
		t.Logf("oversized capsule: %v", err)
	case cqe := <-iq.cqes:
		t.Errorf("oversized capsule answered with %v, want the queue to fail", cqe.Status)
	case <-time.After(5 * time.Second):
		t.Error("oversized capsule: the queue neither failed nor answered")
	}

	// connect requests the target must reject
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cfg := rdma.Config{Depth: 4, RecvSize: 16, SendSize: 64, Handler: func(rdma.Completion) {}}
	if _, err := acc.dialMem(ctx, rdma.PrivateData{QID: 0, HRQSize: 200, HSQSize: 199}, cfg); err == nil || !bytes.Contains([]byte(err.Error()), []byte("HSQSIZE")) {
		t.Errorf("admin queue of 200 entries: %v, want a reject naming HSQSIZE", err)
	}
	if _, err := acc.dialMem(ctx, rdma.PrivateData{QID: 99, HRQSize: 4, HSQSize: 3}, cfg); err == nil || !bytes.Contains([]byte(err.Error()), []byte("queue ID")) {
		t.Errorf("queue ID 99: %v, want a reject naming the queue ID", err)
	}
}

// gateDevice holds writes at a gate and records which ones ran.
type gateDevice struct {
	blockdev.Device
	gate    chan struct{}
	entered chan int64
	mu      sync.Mutex
	ran     []int64
}

func (g *gateDevice) WriteAt(p []byte, off int64) (int, error) {
	g.entered <- off
	<-g.gate
	g.mu.Lock()
	g.ran = append(g.ran, off)
	g.mu.Unlock()
	return g.Device.WriteAt(p, off)
}

// TestRDMADeadQueueCommandLifetime: the command lifetime rule over RDMA.
// The host sends 24 writes on a queue with 16 data buffers and 2 workers:
// 2 execute (held in the device), 14 wait for a worker, 8 for a data
// buffer. The host disconnects. The commands not started are dropped,
// never executed; the 2 executing finish with their own data, because the
// queue's registered memory ends (rdma.MemConn.Close zeroes it) only after
// they returned.
func TestRDMADeadQueueCommandLifetime(t *testing.T) {
	mem := blockdev.NewMem(testSize, testBS)
	dev := &gateDevice{Device: mem, gate: make(chan struct{}), entered: make(chan int64, 64)}
	tg, acc := newRDMATarget(t, Config{WorkersPerQueue: 2}, dev)
	aq := dialRawRDMA(t, acc, 0, 4)
	cqe := aq.connect(testSubNQN, nvme.CntlIDDynamic, 4, false)
	if !cqe.Status.OK() {
		t.Fatalf("admin connect: %v", cqe.Status)
	}
	set := nvme.PropertyCmd{Offset: nvme.PropCC, Value: uint64(nvme.CCEnable | 6<<16 | 4<<20)}.SQE(2, true)
	if cqe := aq.exec(set, nil, 0, nil); !cqe.Status.OK() {
		t.Fatalf("CC.EN: %v", cqe.Status)
	}
	iq := dialRawRDMA(t, acc, 1, 32)
	if cqe := iq.connect(testSubNQN, uint16(cqe.DW0()), 32, false); !cqe.Status.OK() {
		t.Fatalf("I/O connect: %v", cqe.Status)
	}
	const n, size = 24, 4096
	for i := 0; i < n; i++ {
		copy(iq.c.Data(i), bytes.Repeat([]byte{byte(i + 1)}, size))
		addr, key := iq.c.Key(i)
		s := nvme.SQE{Opcode: nvme.CmdWrite, CID: uint16(10 + i), NSID: 1, CDW10: uint32(i * size / testBS), CDW12: size/testBS - 1}
		b := s.Append(nil)
		rdma.PutKeyedSGL(b, addr, size, key)
		if err := iq.c.Send(i, b); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		select {
		case <-dev.entered:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d writes reached the device", i)
		}
	}
	var q *rdmaQueue
	deadline := time.Now().Add(10 * time.Second)
	for {
		tg.mu.Lock()
		for c := range tg.conns {
			if c.rd != nil && c.rd.qid == 1 {
				q = c.rd
			}
		}
		tg.mu.Unlock()
		waiting := -1
		if q != nil {
			q.smu.Lock()
			waiting = len(q.waitData)
			q.smu.Unlock()
		}
		if waiting == n-rdmaIODataSlots {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d commands wait for a data buffer, want %d", waiting, n-rdmaIODataSlots)
		}
		time.Sleep(5 * time.Millisecond)
	}
	iq.c.Stop() // the host disconnects
	<-q.c.done
	close(dev.gate) // the 2 executing writes may finish now
	<-q.c.torn
	for {
		tg.mu.Lock()
		_, live := tg.conns[q.c]
		tg.mu.Unlock()
		if !live {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	dev.mu.Lock()
	ran := append([]int64(nil), dev.ran...)
	dev.mu.Unlock()
	if len(ran) != 2 {
		t.Fatalf("%d writes executed (at %v), want the 2 that had started: a dead queue's other commands must be dropped", len(ran), ran)
	}
	for i := 0; i < n; i++ {
		got := make([]byte, size)
		mem.ReadAt(got, int64(i*size))
		want := make([]byte, size)
		if slicesContain(ran, int64(i*size)) {
			want = bytes.Repeat([]byte{byte(i + 1)}, size)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("block %d holds %#x..., want %#x... (executed: %v)", i, got[0], want[0], slicesContain(ran, int64(i*size)))
		}
	}
	if d := q.c.dropped.Load(); d != n-2 {
		t.Errorf("dropped %d commands, want %d", d, n-2)
	}
}

func slicesContain(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestRDMAListenAllAddressesNeedsAdvertise: discovery entries of an RDMA
// port must name an address a host can connect to; listening on 0.0.0.0
// without Config.Advertise (and no TCP listener to take it from) is
// refused with what to do, not served with an empty TRADDR.
func TestRDMAListenAllAddressesNeedsAdvertise(t *testing.T) {
	acc := &memAcceptor{dials: make(chan memDial), closed: make(chan struct{})}
	old := listenRDMA
	listenRDMA = func(string) (rdmaAcceptor, error) { return acc, nil }
	t.Cleanup(func() { listenRDMA = old })
	tg, err := New(Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if err := tg.ListenRDMA("0.0.0.0:4420"); err == nil || !strings.Contains(err.Error(), "Advertise") {
		t.Fatalf("ListenRDMA(0.0.0.0:4420) without Advertise: %v, want an error naming Advertise", err)
	}
	tg2, err := New(Config{Logger: testLogger(t), Advertise: "10.1.2.3:4420"})
	if err != nil {
		t.Fatal(err)
	}
	defer tg2.Close()
	if err := tg2.ListenRDMA("0.0.0.0:4420"); err != nil {
		t.Fatal(err)
	}
	if got := tg2.RDMAAddr(); got != "10.1.2.3:4420" {
		t.Errorf("RDMAAddr %q, want the advertised host 10.1.2.3 and the bound port", got)
	}
}
