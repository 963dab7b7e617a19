package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"tier0/daemon/rdma"
)

func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	return b
}

// noDevice: with rdma-core present but no RDMA link, connecting fails with
// the message that names what is missing.
func noDevice(addr string) error {
	_, err := rdma.Connect(context.Background(), addr, rdma.Options{SubNQN: "nqn.x"})
	if !errors.Is(err, rdma.ErrNoDevice) {
		return fmt.Errorf("connect without an RDMA device: %v, want %v", err, rdma.ErrNoDevice)
	}
	fmt.Printf("PASS no device: %v\n", err)
	return nil
}

// host connects tier0's NVMe/RDMA host to the target and verifies every
// I/O size class, concurrent I/O and Flush.
func host(addr, nqn string) error {
	ctx := context.Background()
	t0 := time.Now()
	c, err := rdma.Connect(ctx, addr, rdma.Options{SubNQN: nqn, HostID: [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 0x72}, IOQueues: 2, QueueDepth: 32})
	if err != nil {
		return err
	}
	defer c.Close()
	id := c.Identify()
	fmt.Printf("PASS connect in %v: cntlid %d mn %q mdts %d sgls %#x ioccsz %d max transfer %d\n",
		time.Since(t0).Round(time.Millisecond), c.CntlID(), id.MN, id.MDTS, id.SGLS, id.IOCCSZ, c.MaxTransfer())
	ns, err := c.Namespace(1)
	if err != nil {
		return err
	}
	fmt.Printf("PASS identify namespace: %d bytes, %d-byte blocks\n", ns.Size(), ns.BlockSize())
	off := int64(0)
	for i, n := range []int{512, 4096, 8192, 16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2<<20 + 512} {
		w := pattern(uint64(i+1), n)
		if _, err := ns.WriteAt(w, off); err != nil {
			return err
		}
		r := make([]byte, n)
		if _, err := ns.ReadAt(r, off); err != nil {
			return err
		}
		if !bytes.Equal(w, r) {
			return fmt.Errorf("%d bytes at %d read back different", n, off)
		}
		fmt.Printf("PASS write+read %d bytes at %d\n", n, off)
		off += int64(n)
	}
	// many in flight over both queues
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o := int64(32<<20 + i*8192)
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
				errs <- fmt.Errorf("8 KiB at %d read back different (concurrent)", o)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Println("PASS 64 concurrent 8 KiB write+read")
	if err := ns.Flush(); err != nil {
		return err
	}
	fmt.Println("PASS flush")
	if err := ns.WriteZeroes(0, 64<<10); err != nil {
		return err
	}
	r := make([]byte, 64<<10)
	if _, err := ns.ReadAt(r, 0); err != nil {
		return err
	}
	if !bytes.Equal(r, make([]byte, len(r))) {
		return errors.New("range not zero after Write Zeroes")
	}
	fmt.Println("PASS write zeroes")
	return nil
}

// loopback runs tier0's own listener and dialer over the RDMA link: the
// private data exchange, a SEND each way, and the target-side RDMA WRITE
// and READ against the dialer's registered buffer (the keyed-SGL data path
// of a target).
func loopback(addr string) error {
	l, err := rdma.Listen(addr)
	if err != nil {
		return err
	}
	defer l.Close()
	recvd := make(chan []byte, 4)
	done := make(chan rdma.Op, 8)
	handler := func(name string) func(rdma.Completion) {
		return func(c rdma.Completion) {
			if c.Err != nil {
				fmt.Printf("%s completion error: %v\n", name, c.Err)
				return
			}
			if c.Op == rdma.OpRecv {
				recvd <- append([]byte(nil), c.Data...)
				return
			}
			done <- c.Op
		}
	}
	type acc struct {
		c   *rdma.Conn
		err error
	}
	ach := make(chan acc, 1)
	go func() {
		cfg := rdma.Config{Depth: 4, RecvSize: 64, SendSize: 16, DataSize: 1 << 20, Handler: handler("target")}
		c, err := l.Accept(context.Background(),
			func(p rdma.PrivateData) (rdma.Config, rdma.AcceptData, uint16) {
				if p.QID != 1 || p.HRQSize != 4 || p.HSQSize != 3 {
					return cfg, rdma.AcceptData{}, rdma.RejectInvalidHSQSize
				}
				return cfg, rdma.AcceptData{CRQSize: 4}, 0
			})
		ach <- acc{c, err}
	}()
	hc, err := rdma.Dial(context.Background(), addr, rdma.PrivateData{QID: 1, HRQSize: 4, HSQSize: 3},
		rdma.Config{Depth: 4, RecvSize: 16, SendSize: 64, DataSize: 1 << 20, Handler: handler("host")})
	if err != nil {
		return err
	}
	defer hc.Close()
	a := <-ach
	if a.err != nil {
		return a.err
	}
	tc := a.c
	defer tc.Close()
	if hc.Accepted().CRQSize != 4 || tc.Peer().HSQSize != 3 {
		return fmt.Errorf("private data: host saw accept %+v, target saw %+v", hc.Accepted(), tc.Peer())
	}
	fmt.Println("PASS loopback connect with NVMe/RDMA private data")
	wait := func(what string, want rdma.Op) error {
		select {
		case op := <-done:
			if op != want {
				return fmt.Errorf("%s: completion %v, want %v", what, op, want)
			}
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s: no completion in 10 s", what)
		}
	}
	capsule := pattern(7, 64)
	if err := hc.Send(0, capsule); err != nil {
		return err
	}
	if err := wait("host SEND", rdma.OpSend); err != nil {
		return err
	}
	select {
	case got := <-recvd:
		if !bytes.Equal(got, capsule) {
			return errors.New("target received a different capsule")
		}
	case <-time.After(10 * time.Second):
		return errors.New("target received nothing in 10 s")
	}
	fmt.Println("PASS SEND/RECV of a 64-byte capsule")
	// target writes 1 MiB into the host's slot 1, then reads it back into
	// its slot 2
	w := pattern(8, 1<<20)
	copy(tc.Data(1), w)
	raddr, rkey := hc.Key(1)
	if err := tc.RDMAWrite(1, len(w), raddr, rkey); err != nil {
		return err
	}
	if err := wait("RDMA WRITE", rdma.OpRDMAWrite); err != nil {
		return err
	}
	if !bytes.Equal(hc.Data(1), w) {
		return errors.New("host buffer differs after the target's RDMA WRITE")
	}
	copy(hc.Data(1), pattern(9, 1<<20))
	if err := tc.RDMARead(2, 1<<20, raddr, rkey); err != nil {
		return err
	}
	if err := wait("RDMA READ", rdma.OpRDMARead); err != nil {
		return err
	}
	if !bytes.Equal(tc.Data(2), pattern(9, 1<<20)) {
		return errors.New("target buffer differs after its RDMA READ of the host's")
	}
	fmt.Println("PASS RDMA WRITE and READ of 1 MiB through the host's rkey")
	return nil
}
