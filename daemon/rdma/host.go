package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// SGLTypeKeyed is the keyed SGL data block descriptor (type 4, subtype 0:
// address), with which a host gives the target a buffer to RDMA READ from
// or WRITE to.
const SGLTypeKeyed uint8 = 0x40

// PutKeyedSGL writes a keyed SGL data block descriptor into the DPTR of
// the 64-byte encoded SQE b (bytes 24..39): address, 24-bit length, key.
func PutKeyedSGL(b []byte, addr uint64, length int, key uint32) {
	le := binary.LittleEndian
	le.PutUint64(b[24:], addr)
	b[32], b[33], b[34] = byte(length), byte(length>>8), byte(length>>16)
	le.PutUint32(b[35:], key)
	b[39] = SGLTypeKeyed
}

// KeyedSGL decodes the keyed SGL of an encoded SQE: address, length, key,
// and whether the descriptor type is keyed.
func KeyedSGL(b []byte) (addr uint64, length int, key uint32, ok bool) {
	le := binary.LittleEndian
	return le.Uint64(b[24:]), int(b[32]) | int(b[33])<<8 | int(b[34])<<16, le.Uint32(b[35:]), b[39] == SGLTypeKeyed
}

// capsuleConn is what the host queue needs of a connected queue pair
// (*Conn; a fake in the unit tests).
type capsuleConn = QueueConn

// dialQueue connects one queue; tests replace it.
var dialQueue = func(ctx context.Context, addr string, pd PrivateData, cfg Config) (capsuleConn, error) {
	c, err := Dial(ctx, addr, pd, cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Options configure an NVMe/RDMA host controller.
type Options struct {
	SubNQN  string
	HostNQN string // default: nqn.2014-08.org.nvmexpress:uuid:<HostID>
	HostID  [16]byte
	// IOQueues is the number of I/O queues (default 1); QueueDepth their
	// depth (default 32, at most the controller's MQES+1).
	IOQueues, QueueDepth int
	// MaxTransfer caps one command's data (default 1 MiB, also capped by
	// the controller's MDTS); each I/O queue registers QueueDepth buffers
	// of this size once.
	MaxTransfer int
	// Timeout bounds connecting and each command (default 10 s).
	Timeout time.Duration
	// Dial, when set, connects each queue instead of rdma_cm (tests: a
	// MemPair to an in-process target).
	Dial func(ctx context.Context, addr string, pd PrivateData, cfg Config) (QueueConn, error)
}

const (
	adminDepth = 32 // NVME_AQ_DEPTH: the most a Linux target takes on the admin queue
	adminData  = nvme.IdentifyLen
)

// Controller is an NVMe/RDMA host association: an admin queue and I/O
// queues, each its own queue pair.
type Controller struct {
	opts    Options
	admin   *hostQueue
	io      []*hostQueue
	next    atomic.Uint32
	id      nvme.IdentifyController
	cntlID  uint16
	maxXfer int
	closed  atomic.Bool
}

// Connect establishes an association with the subsystem o.SubNQN at addr
// (IPv4 HOST:PORT, the target's RDMA port, usually 4420): Fabrics Connect
// on the admin queue, controller enable, Identify Controller, then Fabrics
// Connect on each I/O queue.
func Connect(ctx context.Context, addr string, o Options) (*Controller, error) {
	if o.SubNQN == "" {
		return nil, errors.New("rdma: Options.SubNQN is empty; name the subsystem to connect to")
	}
	if o.IOQueues <= 0 {
		o.IOQueues = 1
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = 32
	}
	if o.MaxTransfer <= 0 {
		o.MaxTransfer = 1 << 20
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.HostNQN == "" {
		h := o.HostID
		o.HostNQN = fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
	}
	c := &Controller{opts: o}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var err error
	c.admin, err = openQueue(cctx, o.Dial, addr, 0, adminDepth, adminData, 0, o.Timeout)
	if err != nil {
		return nil, fmt.Errorf("rdma: admin queue to %s: %w", addr, err)
	}
	if c.cntlID, err = c.admin.connect(o, nvme.CntlIDDynamic); err != nil {
		return nil, fmt.Errorf("rdma: Fabrics Connect (admin queue) to %s subsystem %q: %w", addr, o.SubNQN, err)
	}
	capv, err := c.propGet(nvme.PropCAP, true)
	if err != nil {
		return nil, fmt.Errorf("rdma: reading CAP: %w", err)
	}
	mqes := int(capv&0xFFFF) + 1
	cc := nvme.CCEnable | 6<<16 | 4<<20 // IOSQES 64 B, IOCQES 16 B
	if err := c.propSet(nvme.PropCC, uint64(cc)); err != nil {
		return nil, fmt.Errorf("rdma: enabling the controller (CC.EN): %w", err)
	}
	deadline := time.Now().Add(o.Timeout)
	for {
		csts, err := c.propGet(nvme.PropCSTS, false)
		if err != nil {
			return nil, fmt.Errorf("rdma: reading CSTS: %w", err)
		}
		if csts&uint64(nvme.CSTSFatal) != 0 {
			return nil, fmt.Errorf("rdma: controller reports a fatal status (CSTS %#x) after enable", csts)
		}
		if csts&uint64(nvme.CSTSReady) != 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("rdma: controller not ready (CSTS %#x) %v after CC.EN=1", csts, o.Timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, nvme.IdentifyLen)
	if err := c.admin.run(nvme.IdentifyCmd{CNS: nvme.CNSController}.SQE(0), buf, false); err != nil {
		return nil, fmt.Errorf("rdma: Identify Controller: %w", err)
	}
	if c.id, err = nvme.ParseIdentifyController(buf); err != nil {
		return nil, fmt.Errorf("rdma: Identify Controller: %w", err)
	}
	if c.id.SGLS&(1<<2) == 0 {
		return nil, fmt.Errorf("rdma: controller SGLS %#x lacks keyed SGL data block support (bit 2), which NVMe/RDMA needs", c.id.SGLS)
	}
	c.maxXfer = o.MaxTransfer
	if c.id.MDTS != 0 && 4096<<c.id.MDTS < c.maxXfer {
		c.maxXfer = 4096 << c.id.MDTS
	}
	depth := min(o.QueueDepth, mqes)
	for i := 1; i <= o.IOQueues; i++ {
		q, err := openQueue(cctx, o.Dial, addr, uint16(i), depth, c.maxXfer, 0, o.Timeout)
		if err != nil {
			return nil, fmt.Errorf("rdma: I/O queue %d to %s: %w", i, addr, err)
		}
		c.io = append(c.io, q)
		if _, err := q.connect(o, c.cntlID); err != nil {
			return nil, fmt.Errorf("rdma: Fabrics Connect (I/O queue %d): %w", i, err)
		}
	}
	ok = true
	return c, nil
}

func (c *Controller) propGet(off uint32, size8 bool) (uint64, error) {
	cqe, err := c.admin.exec(nvme.PropertyCmd{Offset: off, Size8: size8}.SQE(0, false), nil, false)
	return cqe.Result, err
}

func (c *Controller) propSet(off uint32, v uint64) error {
	_, err := c.admin.exec(nvme.PropertyCmd{Offset: off, Value: v}.SQE(0, true), nil, false)
	return err
}

// Identify is the controller's Identify data.
func (c *Controller) Identify() nvme.IdentifyController { return c.id }

// CntlID is the controller ID the target assigned.
func (c *Controller) CntlID() uint16 { return c.cntlID }

// MaxTransfer is the largest data of one command.
func (c *Controller) MaxTransfer() int { return c.maxXfer }

func (c *Controller) ioQueue() *hostQueue {
	return c.io[int(c.next.Add(1))%len(c.io)]
}

// Namespace identifies namespace nsid and returns it as a block device.
func (c *Controller) Namespace(nsid uint32) (*Namespace, error) {
	buf := make([]byte, nvme.IdentifyLen)
	if err := c.admin.run(nvme.IdentifyCmd{CNS: nvme.CNSNamespace, NSID: nsid}.SQE(0), buf, false); err != nil {
		return nil, fmt.Errorf("rdma: Identify Namespace %d: %w", nsid, err)
	}
	id, err := nvme.ParseIdentifyNamespace(buf)
	if err != nil {
		return nil, fmt.Errorf("rdma: Identify Namespace %d: %w", nsid, err)
	}
	bs := id.BlockSize()
	if id.NSZE == 0 || bs == 0 {
		return nil, fmt.Errorf("rdma: namespace %d is not active (NSZE %d, block size %d)", nsid, id.NSZE, bs)
	}
	return &Namespace{c: c, nsid: nsid, bs: bs, size: int64(id.NSZE) * int64(bs)}, nil
}

// Close disconnects every queue.
func (c *Controller) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	for _, q := range c.io {
		q.close()
	}
	if c.admin != nil {
		c.admin.close()
	}
	return nil
}

// Namespace is one namespace of an NVMe/RDMA controller, a blockdev.Device.
type Namespace struct {
	c      *Controller
	nsid   uint32
	bs     int
	size   int64
	closed atomic.Bool
}

var _ blockdev.Device = (*Namespace)(nil)

func (n *Namespace) Size() int64    { return n.size }
func (n *Namespace) BlockSize() int { return n.bs }

// Close closes the namespace (not the controller).
func (n *Namespace) Close() error {
	n.closed.Store(true)
	return nil
}

func (n *Namespace) check(off, length int64) error {
	if n.closed.Load() || n.c.closed.Load() {
		return blockdev.ErrClosed
	}
	return blockdev.CheckRange(off, length, n.size, n.bs)
}

func (n *Namespace) ReadAt(p []byte, off int64) (int, error) {
	return n.rw(nvme.CmdRead, p, off, false)
}

func (n *Namespace) WriteAt(p []byte, off int64) (int, error) {
	return n.rw(nvme.CmdWrite, p, off, false)
}

// WriteAtFUA writes with Force Unit Access: each command completes only
// once its data is durable.
func (n *Namespace) WriteAtFUA(p []byte, off int64) (int, error) {
	return n.rw(nvme.CmdWrite, p, off, true)
}

func (n *Namespace) rw(op uint8, p []byte, off int64, fua bool) (int, error) {
	if err := n.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		k := min(len(p)-done, n.c.maxXfer)
		s := nvme.SQE{Opcode: op, Flags: nvme.SQEFlagSGLMeta, NSID: n.nsid}
		s.SetRW(uint64((off+int64(done))/int64(n.bs)), uint32(k/n.bs))
		if fua {
			s.CDW12 |= nvme.CmdWriteFUABit
		}
		if err := n.c.ioQueue().run(s, p[done:done+k], op == nvme.CmdWrite); err != nil {
			return done, fmt.Errorf("rdma: %s of %d bytes at %d (namespace %d): %w", opName(op), k, off+int64(done), n.nsid, err)
		}
		done += k
	}
	return done, nil
}

func opName(op uint8) string {
	switch op {
	case nvme.CmdRead:
		return "read"
	case nvme.CmdWrite:
		return "write"
	case nvme.CmdWriteZeroes:
		return "write zeroes"
	case nvme.CmdDSM:
		return "deallocate"
	case nvme.CmdFlush:
		return "flush"
	case nvme.CmdResvRegister:
		return "reservation register"
	case nvme.CmdResvAcquire:
		return "reservation acquire"
	case nvme.CmdResvRelease:
		return "reservation release"
	case nvme.CmdResvReport:
		return "reservation report"
	}
	return fmt.Sprintf("opcode %#x", op)
}

// Flush makes completed writes durable.
func (n *Namespace) Flush() error {
	if n.closed.Load() || n.c.closed.Load() {
		return blockdev.ErrClosed
	}
	if err := n.c.ioQueue().run(nvme.SQE{Opcode: nvme.CmdFlush, Flags: nvme.SQEFlagSGLMeta, NSID: n.nsid}, nil, false); err != nil {
		return fmt.Errorf("rdma: flush (namespace %d): %w", n.nsid, err)
	}
	return nil
}

// WriteZeroes zeroes [off, off+length) with Write Zeroes commands.
func (n *Namespace) WriteZeroes(off, length int64) error {
	if err := n.check(off, length); err != nil {
		return err
	}
	for length > 0 {
		blocks := min(length/int64(n.bs), 1<<16)
		s := nvme.SQE{Opcode: nvme.CmdWriteZeroes, Flags: nvme.SQEFlagSGLMeta, NSID: n.nsid}
		s.SetRW(uint64(off/int64(n.bs)), uint32(blocks))
		if err := n.c.ioQueue().run(s, nil, false); err != nil {
			return fmt.Errorf("rdma: write zeroes of %d blocks at %d (namespace %d): %w", blocks, off, n.nsid, err)
		}
		off += blocks * int64(n.bs)
		length -= blocks * int64(n.bs)
	}
	return nil
}

// Discard deallocates [off, off+length) with Dataset Management.
func (n *Namespace) Discard(off, length int64) error {
	if err := n.check(off, length); err != nil {
		return err
	}
	for length > 0 {
		blocks := min(length/int64(n.bs), 1<<31)
		r := nvme.DSMRange{NLB: uint32(blocks), SLBA: uint64(off / int64(n.bs))}.Append(nil)
		s := nvme.SQE{Opcode: nvme.CmdDSM, Flags: nvme.SQEFlagSGLMeta, NSID: n.nsid, CDW10: 0, CDW11: nvme.DSMDeallocate}
		if err := n.c.ioQueue().run(s, r, true); err != nil {
			return fmt.Errorf("rdma: deallocate of %d blocks at %d (namespace %d): %w", blocks, off, n.nsid, err)
		}
		off += blocks * int64(n.bs)
		length -= blocks * int64(n.bs)
	}
	return nil
}
