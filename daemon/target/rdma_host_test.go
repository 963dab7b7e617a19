package target

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
)

// rdmaLinks dials the host's queues over a memAcceptor and keeps each
// queue's host end and completion handler, so that a test can drop every
// connection the way a target whose port goes away does: the target's end
// sees the host's queue pair go, the host's handler a DISCONNECTED event.
type rdmaLinks struct {
	acc   *memAcceptor
	mu    sync.Mutex
	ends  []*rdma.MemConn
	hands []func(rdma.Completion)
	dials int
}

func (l *rdmaLinks) dial(ctx context.Context, addr string, pd rdma.PrivateData, cfg rdma.Config) (rdma.QueueConn, error) {
	h := cfg.Handler
	c, err := l.acc.dialMem(ctx, pd, cfg)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.ends, l.hands = append(l.ends, c), append(l.hands, h)
	l.dials++
	l.mu.Unlock()
	return c, nil
}

// drop disconnects every queue dialed so far.
func (l *rdmaLinks) drop() {
	l.mu.Lock()
	ends, hands := l.ends, l.hands
	l.ends, l.hands = nil, nil
	l.mu.Unlock()
	for i, c := range ends {
		c.Stop()
		hands[i](rdma.Completion{Err: fmt.Errorf("%w (RDMA_CM_EVENT_DISCONNECTED: the test dropped the queue)", rdma.ErrDisconnected)})
	}
}

func rdmaHostOpts(l *rdmaLinks) host.Options {
	return host.Options{SubNQN: testSubNQN, HostNQN: testHostNQN, HostID: testHostID, IOQueues: 2, QueueDepth: 16,
		ReconnectDelay: 10 * time.Millisecond, Transport: &rdma.Transport{Dial: l.dial}}
}

// TestHostOverRDMATransport: daemon/host over rdma.Transport to the
// target's NVMe/RDMA port: I/O of every size class (split at the MDTS,
// in a batch), concurrent I/O, Flush, Write Zeroes and a reservation, as
// over NVMe/TCP; then every queue is dropped, and the host reconnects by
// itself (Reconnects 1, new queue pairs dialed) and reads back what was
// written before, while a write issued after the drop completes on the new
// association.
func TestHostOverRDMATransport(t *testing.T) {
	dev := blockdev.NewMem(testSize, testBS)
	_, acc := newRDMATarget(t, Config{MaxDataTransfer: 256 << 10}, dev)
	l := &rdmaLinks{acc: acc}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := host.Dial(ctx, "10.9.8.7:4420", rdmaHostOpts(l))
	if err != nil {
		t.Fatalf("host.Dial over rdma.Transport: %v", err)
	}
	defer c.Close()
	if l.dials != 3 {
		t.Fatalf("%d queue pairs dialed, want 3 (admin and 2 I/O queues)", l.dials)
	}
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(0)
	var written [][2]int64 // offset, size
	var data [][]byte
	for _, n := range []int{512, 4096, 64 << 10, 256 << 10, 1<<20 + 512} {
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
		written, data = append(written, [2]int64{off, int64(n)}), append(data, w)
		off += int64(n+4095) / 4096 * 4096
	}
	// more commands at once than a queue has slots
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 48; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			w := bytes.Repeat([]byte{byte(g + 1)}, 8192)
			at := 3<<20 + int64(g)*8192
			if _, err := ns.WriteAt(w, at); err != nil {
				errs <- err
				return
			}
			got := make([]byte, len(w))
			if _, err := ns.ReadAt(got, at); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, w) {
				errs <- fmt.Errorf("concurrent I/O %d read back different data", g)
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := ns.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if err := ns.WriteZeroes(4<<20, 64<<10); err != nil {
		t.Fatalf("write zeroes: %v", err)
	}
	if err := ns.Register(nvme.ResvRegister, 0, 0xC0FFEE, false); err != nil {
		t.Fatalf("reservation register: %v", err)
	}
	if st, err := ns.Report(); err != nil || len(st.Registrants) != 1 || st.Registrants[0].RKey != 0xC0FFEE {
		t.Fatalf("reservation report: %+v %v, want one registrant with key 0xC0FFEE", st, err)
	}

	l.drop()
	after := randBytes(t, 64<<10)
	if _, err := ns.WriteAt(after, 5<<20); err != nil {
		t.Fatalf("write after every queue was dropped: %v (the host should reconnect by itself)", err)
	}
	if n := c.Reconnects(); n != 1 {
		t.Fatalf("Reconnects %d after one drop, want 1", n)
	}
	if l.dials != 6 {
		t.Errorf("%d queue pairs dialed after the reconnect, want 6", l.dials)
	}
	for i, w := range written {
		got := make([]byte, w[1])
		if _, err := ns.ReadAt(got, w[0]); err != nil {
			t.Fatalf("read %d at %d after the reconnect: %v", w[1], w[0], err)
		}
		if !bytes.Equal(got, data[i]) {
			t.Fatalf("read %d at %d after the reconnect: differs from what was written before", w[1], w[0])
		}
	}
	got := make([]byte, len(after))
	if _, err := ns.ReadAt(got, 5<<20); err != nil || !bytes.Equal(got, after) {
		t.Fatalf("read of the write made after the drop: %v, equal %v", err, bytes.Equal(got, after))
	}
}

// TestHostOverRDMATransportAuth: DH-HMAC-CHAP over NVMe/RDMA is the
// host's own, unchanged: with the subsystem's secret every queue
// authenticates (and again after a reconnect); with another secret
// host.Dial fails with host.ErrAuth.
func TestHostOverRDMATransportAuth(t *testing.T) {
	secret := mustSecret(t, 32, nvme.HashSHA256)
	tg, acc := newRDMATarget(t, Config{}, nil)
	if err := tg.SetDHCHAP(testSubNQN, DHCHAPConfig{HostSecret: secret}); err != nil {
		t.Fatal(err)
	}
	l := &rdmaLinks{acc: acc}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o := rdmaHostOpts(l)
	o.DHCHAPSecret = mustSecret(t, 32, nvme.HashSHA256)
	if c, err := host.Dial(ctx, "10.9.8.7:4420", o); !errors.Is(err, host.ErrAuth) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("host.Dial over RDMA with another secret: %v, want ErrAuth", err)
	}
	l.drop()
	o.DHCHAPSecret = secret
	c, err := host.Dial(ctx, "10.9.8.7:4420", o)
	if err != nil {
		t.Fatalf("host.Dial over RDMA with the subsystem's secret: %v", err)
	}
	defer c.Close()
	ns, err := c.Namespace(1)
	if err != nil {
		t.Fatal(err)
	}
	w := randBytes(t, 4096)
	if _, err := ns.WriteAt(w, 0); err != nil {
		t.Fatal(err)
	}
	l.drop()
	got := make([]byte, len(w))
	if _, err := ns.ReadAt(got, 0); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("read after a reconnect (authenticated again): %v, equal %v", err, bytes.Equal(got, w))
	}
	if c.Reconnects() != 1 {
		t.Fatalf("Reconnects %d, want 1", c.Reconnects())
	}
}

// sendLog is a QueueConn that records the SGL type and the length of every
// message its queue sends.
type sendLog struct {
	rdma.QueueConn
	qid  uint16
	mu   *sync.Mutex
	sent *[]sentMsg
}

type sentMsg struct {
	qid    uint16
	opcode uint8
	sgl    uint8
	n      int
}

func (s sendLog) Send(slot int, msg []byte) error {
	s.mu.Lock()
	*s.sent = append(*s.sent, sentMsg{s.qid, msg[0], msg[39], len(msg)})
	s.mu.Unlock()
	return s.QueueConn.Send(slot, msg)
}

// TestHostOverRDMAInCapsuleWrites: daemon/host over rdma.Transport sends
// a write of up to the controller's in-capsule size (the target's IOCCSZ:
// 16 KiB) on an I/O queue in the command capsule (SGL type 0x01, the data
// after the SQE: no RDMA READ round trip), larger writes and reads by
// keyed SGL, and nothing in the capsule on the admin queue (Linux
// nvmet-rdma takes none there); the target stores what was written. With
// MaxInline < 0 every write is keyed.
func TestHostOverRDMAInCapsuleWrites(t *testing.T) {
	for _, noInline := range []bool{false, true} {
		dev := blockdev.NewMem(testSize, testBS)
		_, acc := newRDMATarget(t, Config{}, dev)
		l := &rdmaLinks{acc: acc}
		var mu sync.Mutex
		var sent []sentMsg
		tr := &rdma.Transport{Dial: func(ctx context.Context, addr string, pd rdma.PrivateData, cfg rdma.Config) (rdma.QueueConn, error) {
			c, err := l.dial(ctx, addr, pd, cfg)
			if err != nil {
				return nil, err
			}
			return sendLog{c, pd.QID, &mu, &sent}, nil
		}}
		if noInline {
			tr.MaxInline = -1
		}
		o := rdmaHostOpts(l)
		o.Transport = tr
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err := host.Dial(ctx, "10.9.8.7:4420", o)
		cancel()
		if err != nil {
			t.Fatalf("host.Dial over rdma.Transport: %v", err)
		}
		ns, err := c.Namespace(1)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		sent = sent[:0]
		mu.Unlock()
		sizes := []int{512, 4096, 16 << 10, 16<<10 + 512, 64 << 10}
		off := int64(0)
		for _, n := range sizes {
			w := randBytes(t, n)
			if _, err := ns.WriteAt(w, off); err != nil {
				t.Fatalf("write %d: %v", n, err)
			}
			got := make([]byte, n)
			if _, err := ns.ReadAt(got, off); err != nil || !bytes.Equal(got, w) {
				t.Fatalf("read back %d bytes: %v, equal %v", n, err, bytes.Equal(got, w))
			}
			dev.ReadAt(got, off)
			if !bytes.Equal(got, w) {
				t.Fatalf("device holds other data than the %d bytes written", n)
			}
			off += int64(n+4095) / 4096 * 4096
		}
		c.Close()
		mu.Lock()
		var writes []sentMsg
		for _, m := range sent {
			if m.qid == 0 && m.sgl != rdma.SGLTypeKeyed {
				t.Errorf("admin command %#x sent with SGL type %#x, %d bytes: want keyed, no in-capsule data", m.opcode, m.sgl, m.n)
			}
			if m.qid != 0 && m.opcode == nvme.CmdWrite {
				writes = append(writes, m)
			}
		}
		mu.Unlock()
		if len(writes) != len(sizes) {
			t.Fatalf("noInline %v: %d writes sent on I/O queues, want %d", noInline, len(writes), len(sizes))
		}
		for i, m := range writes {
			inline := !noInline && sizes[i] <= 16<<10
			want := sentMsg{m.qid, nvme.CmdWrite, rdma.SGLTypeKeyed, nvme.SQELen}
			if inline {
				want.sgl, want.n = nvme.SGLTypeInCapsule, nvme.SQELen+sizes[i]
			}
			if m != want {
				t.Errorf("MaxInline %d: write of %d bytes sent as SGL type %#x in %d bytes, want %#x in %d", tr.MaxInline, sizes[i], m.sgl, m.n, want.sgl, want.n)
			}
		}
	}
}
