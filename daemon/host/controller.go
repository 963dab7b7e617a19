package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
	"tier0/daemon/transport"
)

// assoc is one association with the controller: the admin queue and the
// I/O queues of one successful connect. A lost connection on any queue
// ends the association; the controller then builds a new one.
type assoc struct {
	admin  transport.Queue
	io     []transport.Queue
	cntlid uint16
	id     nvme.IdentifyController
	dead   chan struct{}
	once   sync.Once
	err    error
	now    func() time.Time
	// quiesce is how long after its loss a command of this association
	// may still execute on the controller (quiesceTime); lostAt is when
	// fail was first called. Both are read only after fail.
	quiesce time.Duration
	lostAt  time.Time
	// abandoned: a write sent on this association failed after its loss
	// without waiting for the quiesce (Options.FailFast); replaced: the
	// next association is being installed. Both under Controller.mu.
	abandoned, replaced bool
}

func (a *assoc) fail(err error) {
	a.once.Do(func() {
		a.err = err
		a.lostAt = a.now()
		close(a.dead)
		a.admin.Fail(err)
		for _, q := range a.io {
			q.Fail(err)
		}
	})
}

// Controller is a connection to one NVMe-oF controller, over NVMe/TCP or
// the transport of Options.Transport.
type Controller struct {
	addr string
	opts Options
	tr   transport.Transport // Options.Transport, or NVMe/TCP
	log  *slog.Logger

	mu     sync.Mutex
	cur    *assoc        // nil while reconnecting
	ready  chan struct{} // closed when cur becomes non-nil
	lost   time.Time     // when the last association was lost
	closed bool
	// restarted: the target's node restarted under Options.OneIncarnation,
	// and the controller stopped reconnecting (sameIncarnation).
	restarted error
	// inc is the boot incarnation of the target's node as the association
	// in use reported it (0: unknown).
	inc     atomic.Uint64
	closeCh chan struct{}
	wg      sync.WaitGroup

	rr      atomic.Uint32
	authTID atomic.Uint32 // DH-HMAC-CHAP transaction IDs

	anaMu    sync.Mutex
	anaGen   uint64
	ana      map[uint32]ANAState // group -> state, from the last ANA log read
	anaSub   []chan struct{}
	anaBusy  atomic.Bool
	anaAgain atomic.Bool

	stats struct {
		reconnects atomic.Int64
		aens       atomic.Int64
	}
}

// Dial connects to the controller of opts.SubNQN at addr (host:port):
// admin queue, Identify Controller, I/O queues, keep-alive and the
// asynchronous event handler. After a lost connection the controller
// reconnects by itself with backoff.
func Dial(ctx context.Context, addr string, opts Options) (*Controller, error) {
	if opts.SubNQN == "" {
		return nil, errors.New("host.Dial: Options.SubNQN is empty; give the subsystem NQN to connect to (see tier0 fabric discover)")
	}
	opts.setDefaults()
	if _, err := parseHostKeys(&opts); err != nil {
		return nil, fmt.Errorf("host.Dial: %w", err)
	}
	c := &Controller{addr: addr, opts: opts, log: opts.Logger.With("ctrl", addr, "subnqn", opts.SubNQN),
		ready: make(chan struct{}), closeCh: make(chan struct{}), ana: map[uint32]ANAState{}}
	c.tr = opts.Transport
	if c.tr == nil {
		c.tr = tcpTransport{o: &c.opts}
	}
	a, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.install(a)
	return c, nil
}

// Addr is the controller's address.
func (c *Controller) Addr() string { return c.addr }

// Options returns the options in effect (defaults filled in).
func (c *Controller) Options() Options { return c.opts }

// Identify returns the Identify Controller data of the current association.
func (c *Controller) Identify() nvme.IdentifyController {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return nvme.IdentifyController{}
	}
	return c.cur.id
}

// CntlID is the controller ID of the current association (0 while down).
func (c *Controller) CntlID() uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return 0
	}
	return c.cur.cntlid
}

// Incarnation is the boot incarnation of the target's node that the
// association in use (or the last one) reported in Identify Controller: it
// changes when a reconnect finds the node rebooted; 0 when the target
// reports none (Linux nvmet, an older tier0).
func (c *Controller) Incarnation() uint64 { return c.inc.Load() }

// Connected reports whether an association is up.
func (c *Controller) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur != nil
}

// Reconnects counts associations rebuilt after a lost connection.
func (c *Controller) Reconnects() int64 { return c.stats.reconnects.Load() }

// adminDepth is the admin queue's depth (NVME_AQ_DEPTH: the most a Linux
// target takes), adminMaxData the most data of one admin command.
const (
	adminDepth   = 32
	adminMaxData = 64 << 10
)

// dialQueue connects one queue of an association over the transport.
func (c *Controller) dialQueue(ctx context.Context, p transport.Params) (transport.Queue, error) {
	dctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	q, err := c.tr.DialQueue(dctx, c.addr, p)
	if err != nil {
		return nil, fmt.Errorf("%s queue %d to %s: %w", c.tr.Name(), p.QID, c.addr, err)
	}
	return q, nil
}

// connect builds a whole association.
func (c *Controller) connect(ctx context.Context) (*assoc, error) {
	o := &c.opts
	admin, err := c.dialQueue(ctx, transport.Params{QID: 0, SQSize: adminDepth - 1, Depth: adminDepth, MaxData: adminMaxData, InlineMax: 8192 - nvme.SQELen})
	if err != nil {
		return nil, err
	}
	a := &assoc{admin: admin, dead: make(chan struct{}), now: o.Clock.Now}
	fail := func(err error) (*assoc, error) {
		a.fail(err)
		return nil, err
	}
	kato := uint32(0)
	if o.KATO > 0 {
		kato = uint32(o.KATO / time.Millisecond)
	}
	cntlid, err := c.fabricsConnect(admin, 0, adminDepth-1, kato, nvme.CntlIDDynamic)
	if err != nil {
		return fail(err)
	}
	a.cntlid = cntlid
	capv, err := c.propGet(admin, nvme.PropCAP, true)
	if err != nil {
		return fail(err)
	}
	mqes := int(capv&0xFFFF) + 1
	cc := uint32(nvme.CCEnable) | 6<<16 | 4<<20
	if err := c.propSet(admin, nvme.PropCC, uint64(cc)); err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(o.DialTimeout)
	for {
		csts, err := c.propGet(admin, nvme.PropCSTS, false)
		if err != nil {
			return fail(err)
		}
		if csts&uint64(nvme.CSTSFatal) != 0 {
			return fail(fmt.Errorf("controller %s reports a fatal status (CSTS %#x) after enable", c.addr, csts))
		}
		if csts&uint64(nvme.CSTSReady) != 0 {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("controller %s did not become ready within %v of enable", c.addr, o.DialTimeout))
		}
		time.Sleep(10 * time.Millisecond)
	}
	buf := make([]byte, nvme.IdentifyLen)
	if err := c.adminCmd(admin, "identify controller", nvme.IdentifyCmd{CNS: nvme.CNSController}.SQE(0), nil, buf); err != nil {
		return fail(err)
	}
	a.id, err = nvme.ParseIdentifyController(buf)
	if err != nil {
		return fail(fmt.Errorf("identify controller from %s: %w", c.addr, err))
	}
	if a.id.SubNQN != "" && a.id.SubNQN != o.SubNQN {
		return fail(fmt.Errorf("controller %s reports subsystem %q, wanted %q", c.addr, a.id.SubNQN, o.SubNQN))
	}
	a.quiesce = quiesceTime(o, a.id.CQT)
	nq := o.IOQueues
	if nq > 0 && o.SubNQN != nvme.DiscoveryNQN {
		// Number of Queues: 0's based counts of SQs and CQs.
		cqe, err := c.adminRaw(admin, nvme.SQE{Opcode: nvme.AdminSetFeatures, CDW10: uint32(nvme.FeatNumQueues),
			CDW11: uint32(nq-1) | uint32(nq-1)<<16}, nil, nil)
		if err != nil {
			return fail(err)
		}
		if cqe.Status.OK() {
			got := int(min(cqe.DW0()&0xFFFF, cqe.DW0()>>16)) + 1
			if got < nq {
				nq = got
			}
		}
		depth := min(o.QueueDepth, mqes-1)
		if depth < 1 {
			depth = 1
		}
		p := transport.Params{SQSize: uint16(depth), Depth: depth, MaxData: c.maxIO(a.id.MDTS), InlineMax: a.id.InCapsuleData()}
		for i := 1; i <= nq; i++ {
			p.QID = uint16(i)
			q, err := c.dialQueue(ctx, p)
			if err != nil {
				return fail(err)
			}
			a.io = append(a.io, q)
			if _, err := c.fabricsConnect(q, uint16(i), uint16(depth), 0, cntlid); err != nil {
				return fail(err)
			}
		}
	}
	if o.SubNQN != nvme.DiscoveryNQN && a.id.OAES&nvme.OAESANAChange != 0 {
		// enable ANA change notices; errors are not fatal (older targets)
		c.adminRaw(admin, nvme.SQE{Opcode: nvme.AdminSetFeatures, CDW10: uint32(nvme.FeatAsyncEventCfg), CDW11: nvme.OAESANAChange}, nil, nil)
	}
	if tq, ok := admin.(*queue); ok {
		c.log.Info("connected", "transport", c.tr.Name(), "cntlid", cntlid, "ioqueues", len(a.io), "digest", tq.digest, "maxh2cdata", tq.maxH2C)
	} else {
		c.log.Info("connected", "transport", c.tr.Name(), "cntlid", cntlid, "ioqueues", len(a.io))
	}
	return a, nil
}

// install makes a the current association and starts its helpers.
func (c *Controller) install(a *assoc) {
	c.mu.Lock()
	c.cur = a
	c.inc.Store(a.id.Incarnation)
	close(c.ready)
	c.mu.Unlock()
	watch := func(q transport.Queue) {
		defer c.wg.Done()
		select {
		case <-q.Done():
			a.fail(q.Err())
		case <-a.dead:
		}
	}
	c.wg.Add(1 + len(a.io))
	go watch(a.admin)
	for _, q := range a.io {
		go watch(q)
	}
	c.wg.Add(3)
	go c.keepAlive(a)
	go c.aenLoop(a)
	go c.supervise(a)
	if a.id.ANACAP != 0 && c.opts.SubNQN != nvme.DiscoveryNQN {
		go func() {
			if err := c.RefreshANA(context.Background()); err != nil {
				c.log.Warn("reading the ANA log after connect failed", "err", err)
			}
		}()
	}
}

// aenLoop keeps one Asynchronous Event Request outstanding and handles
// what it returns.
func (c *Controller) aenLoop(a *assoc) {
	defer c.wg.Done()
	if c.opts.SubNQN == nvme.DiscoveryNQN {
		return
	}
	for {
		cqe, err := submit(a.admin, transport.Command{SQE: nvme.SQE{Opcode: nvme.AdminAsyncEvent}, NoTimeout: true})
		if err != nil {
			return
		}
		if !cqe.Status.OK() {
			c.log.Debug("asynchronous event request refused", "status", cqe.Status)
			return
		}
		dw0 := cqe.DW0()
		ev := AEN{Type: uint8(dw0 & 0x7), Info: uint8(dw0 >> 8), LogPage: uint8(dw0 >> 16)}
		c.stats.aens.Add(1)
		c.log.Info("asynchronous event", "type", ev.Type, "info", ev.Info, "log", ev.LogPage)
		if ev.Type == nvme.AENTypeNotice && ev.Info == nvme.AENNoticeANAChange {
			// read the log in the background so that the next AER goes
			// out at once (a change meanwhile is then reported too)
			c.refreshANAAsync()
		}
		if c.opts.OnAEN != nil {
			c.opts.OnAEN(ev)
		}
	}
}

// Close disconnects and stops reconnecting. Namespaces of the controller
// fail with blockdev.ErrClosed afterwards.
func (c *Controller) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	a := c.cur
	close(c.closeCh)
	c.mu.Unlock()
	if a != nil {
		// polite shutdown: CC.SHN normal; ignore failures
		done := make(chan struct{})
		go func() {
			c.propSet(a.admin, nvme.PropCC, uint64(nvme.CCEnable)|1<<14|6<<16|4<<20)
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
		a.fail(errClosed)
	}
	c.wg.Wait()
	c.notifyANA()
	return nil
}

// now returns the live association without waiting.
func (c *Controller) now() (*assoc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errClosed
	}
	if c.restarted != nil {
		return nil, c.restarted
	}
	if c.cur == nil {
		return nil, fmt.Errorf("controller %s: %w: %w", c.addr, errCtrlDown, blockdev.ErrIO)
	}
	return c.cur, nil
}

// ioQueue picks an I/O queue of a round robin.
func (a *assoc) ioQueue(c *Controller) (transport.Queue, error) {
	if len(a.io) == 0 {
		return nil, fmt.Errorf("controller %s has no I/O queues: %w", c.addr, blockdev.ErrIO)
	}
	return a.io[int(c.rr.Add(1))%len(a.io)], nil
}

// modifies reports whether a command changes the namespace or its
// reservation, i.e. must not run after its retry.
func modifies(opc uint8) bool {
	switch opc {
	case nvme.CmdWrite, nvme.CmdWriteZeroes, nvme.CmdDSM, nvme.CmdResvRegister, nvme.CmdResvAcquire, nvme.CmdResvRelease:
		return true
	}
	return false
}

// I/O flags.
const (
	ioNoRetry  = 1 << iota // do not resend after a lost connection
	ioFailFast             // do not wait for a reconnect (multipath)
	ioAbandon              // with ioFailFast: a lost write fails at once (Options.FailFast)
)

// io runs one I/O command, retrying it on a new association when the
// connection is lost (within CtrlLossTimeout) unless ioNoRetry. A modifying
// command that was sent before the loss is resubmitted only after the lost
// association is quiesced (waitQuiesced); without retry its error is a
// *lostError, so that Multipath waits the same before another path.
func (c *Controller) io(op string, sqe nvme.SQE, w, r []byte, flags int) (nvme.CQE, error) {
	noRetry := flags&(ioNoRetry|ioFailFast) != 0
	for {
		var a *assoc
		var err error
		if flags&ioFailFast != 0 {
			a, err = c.now()
		} else {
			a, err = c.current(context.Background())
		}
		if err != nil {
			return nvme.CQE{}, fmt.Errorf("%s: %w", op, err)
		}
		q, err := a.ioQueue(c)
		if err != nil {
			return nvme.CQE{}, err
		}
		cid, err := q.Start(transport.Command{SQE: sqe, Write: w, Read: r}, true)
		sent := err == nil
		var cqe nvme.CQE
		if sent {
			cqe, err = q.Wait(cid)
		}
		if err == nil {
			return cqe, nil
		}
		// the queue failed: make sure the association is torn down so that
		// current() waits for the reconnect
		a.fail(err)
		lost := sent && modifies(sqe.Opcode)
		if noRetry || errors.Is(a.err, errClosed) || errors.Is(a.err, blockdev.ErrTimeout) {
			if errors.Is(a.err, blockdev.ErrTimeout) && !noRetry {
				err = fmt.Errorf("%s on %s: %w", op, c.addr, a.err)
			} else {
				err = fmt.Errorf("%s on %s: %w: %w", op, c.addr, err, ioErrKind(a.err))
			}
			if lost {
				err = c.lostWrite(a, flags, err)
			}
			return cqe, err
		}
		if lost {
			if werr := c.waitQuiesced(a, nil); werr != nil {
				return cqe, fmt.Errorf("%s on %s: %w (while waiting for the lost association to quiesce before resubmitting)", op, c.addr, werr)
			}
		}
	}
}
