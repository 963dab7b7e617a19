package target

// The NVMe/RDMA transport of the target (NVMe over Fabrics, RDMA
// transport binding). An RDMA queue is the same conn as a TCP one — the
// same Connect, authentication, controller, subsystem, ANA, reservation and
// command execution (Target.execute) — whose bytes move differently:
//
//   - rdma_cm accepts each NVMe queue as its own reliable-connected queue
//     pair after checking the connect private data (decide: QID, HSQSIZE,
//     HRQSIZE; the reply carries CRQSIZE);
//   - command capsules arrive as RECVs into buffers registered once per
//     queue (daemon/rdma: one region per queue pair), 64 bytes of SQE plus
//     up to the advertised in-capsule size (IOCCSZ) of data;
//   - a write's data that is not in the capsule is fetched with RDMA READ
//     from the host's keyed SGL into one of the queue's registered data
//     buffers, and the command executes from there; a read's data is
//     copied into a data buffer and RDMA WRITten to the host's keyed SGL
//     before the response;
//   - responses (16-byte CQEs) leave as SENDs;
//   - completions are handled by the queue pair's one completion goroutine
//     (daemon/rdma), which parses capsules and starts commands; I/O
//     commands execute on the queue's workers as on TCP, admin and fabrics
//     commands on the completion goroutine.
//
// The data-safety rules of conn.go hold (docs/FABRIC.md, "Command
// lifetime"): when the queue dies (disconnect, failed work request,
// connect timeout, teardown of its controller) its completion goroutine is
// stopped first, so no further command starts; commands waiting for a
// data buffer or for their RDMA READ are dropped, never executed; conn's
// teardown drops the queued ones and waits for the executing ones (the
// I/O queue counts as draining meanwhile, so the host's new association
// is refused until then); only after that is the registered memory, from
// which those commands may still execute, unmapped.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
)

// TrTypeRDMA is the discovery log transport type of NVMe/RDMA.
const trTypeRDMA = 1

// RDMA TSAS (discovery log entry bytes 768..1023) of an RDMA port:
// reliable connected queue pairs, no provider type, rdma_cm.
const (
	rdmaQPTypeConnected   = 1
	rdmaPrTypeUnspecified = 1
	rdmaCMSRDMACM         = 1
)

// Data buffers per RDMA queue pair (each MaxDataTransfer bytes, registered
// once): a command moving data holds one from its start to its response's
// SEND completion; commands beyond them wait (in order) for one.
const (
	rdmaIODataSlots    = 16
	rdmaAdminDataSlots = 2
)

// rdmaLink is what an RDMA queue needs of its connected queue pair:
// *rdma.Conn, or rdma.MemConn in tests.
type rdmaLink interface {
	Send(slot int, msg []byte) error
	RDMARead(slot, n int, raddr uint64, rkey uint32) error
	RDMAWrite(slot, n int, raddr uint64, rkey uint32) error
	Data(slot int) []byte
	Remote() string
	// Stop disconnects; after it returns the handler is not called again
	// and the memory stays mapped. Close frees it.
	Stop()
	Close() error
}

// rdmaAcceptor accepts NVMe/RDMA queues: rdma.Listener, or a fake.
type rdmaAcceptor interface {
	Accept(ctx context.Context, decide rdma.Decide) (rdmaLink, error)
	Port() int
	Close() error
}

type verbsListener struct{ l *rdma.Listener }

func (v verbsListener) Accept(ctx context.Context, decide rdma.Decide) (rdmaLink, error) {
	c, err := v.l.Accept(ctx, decide)
	if err != nil {
		return nil, err
	}
	return c, nil
}
func (v verbsListener) Port() int    { return v.l.Port() }
func (v verbsListener) Close() error { return v.l.Close() }

// listenRDMA opens an rdma_cm listener; tests replace it.
var listenRDMA = func(addr string) (rdmaAcceptor, error) {
	l, err := rdma.Listen(addr)
	if err != nil {
		return nil, err
	}
	return verbsListener{l}, nil
}

// rdmaPort is one RDMA listener of the target and what its discovery
// entries advertise.
type rdmaPort struct {
	l          rdmaAcceptor
	host, port string
	cancel     context.CancelFunc
}

// ListenRDMA serves NVMe/RDMA on addr (IPv4 HOST:PORT; a bare host gets
// port 4420) in the background until Close. Discovery log entries read
// through this port advertise transport type RDMA at the host of addr
// (or of Config.Advertise when addr's host is unspecified) and the bound
// port. It needs a binary built with -tags rdma (rdma.ErrNotBuilt) and an
// RDMA device (rdma.ErrNoDevice).
func (t *Target) ListenRDMA(addr string) error {
	addr = withPort(addr, DefaultIOPort)
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("target: RDMA listen address %q: %v (want IPv4 HOST:PORT): %w", addr, err, ErrInvalid)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		h, _ := t.advertised()
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
			return fmt.Errorf("target: NVMe/RDMA listen on %s: discovery entries must carry an address hosts can reach; listen on the RDMA interface's IPv4 address or set Config.Advertise (fabric serve --advertise): %w", addr, ErrInvalid)
		}
		host = h
	}
	l, err := listenRDMA(addr)
	if err != nil {
		return fmt.Errorf("target: NVMe/RDMA listen on %s: %w", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &rdmaPort{l: l, host: host, port: strconv.Itoa(l.Port()), cancel: cancel}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		cancel()
		l.Close()
		return ErrClosed
	}
	t.rdmaPorts = append(t.rdmaPorts, p)
	t.mu.Unlock()
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.rdmaAcceptLoop(ctx, p)
	}()
	return nil
}

// RDMAAddr is the HOST:PORT of the first RDMA listener ("" when none).
func (t *Target) RDMAAddr() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.rdmaPorts) == 0 {
		return ""
	}
	return net.JoinHostPort(t.rdmaPorts[0].host, t.rdmaPorts[0].port)
}

// closeRDMA stops the RDMA listeners (t.mu held, from Close).
func (t *Target) closeRDMALocked() {
	for _, p := range t.rdmaPorts {
		p.cancel()
		p.l.Close()
	}
}

func (t *Target) rdmaAcceptLoop(ctx context.Context, p *rdmaPort) {
	for ctx.Err() == nil {
		q := &rdmaQueue{t: t, port: p, ready: make(chan struct{})}
		link, err := p.l.Accept(ctx, q.decide)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, rdma.ErrClosed) {
				return
			}
			if !errors.Is(err, rdma.ErrAcceptTimeout) {
				t.warnLimited("rdma-accept", "NVMe/RDMA queue not accepted", "port", p.port, "err", err)
			}
			continue
		}
		q.link = link
		c := newConn(t, &rdmaNetConn{q: q})
		c.rd, q.c = q, c
		q.initSlots()
		// The Connect deadline before the queue takes capsules: its
		// Connect, handled on the completion goroutine, clears it, and
		// may come before serve runs (a deadline set there fired on
		// connected queues: the emulated guest's lost queues, 60 s
		// after each connect).
		_ = c.nc.SetReadDeadline(time.Now().Add(t.connectTimeout()))
		close(q.ready)
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.close()
		} else {
			t.conns[c] = struct{}{}
			t.mu.Unlock()
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			q.serve()
		}()
	}
}

// transportLog rewrites the entries of a discovery log page read over an
// RDMA port: transport type RDMA, the RDMA TSAS and the port's address.
func (c *conn) transportLog(b []byte) []byte {
	if c == nil || c.rd == nil {
		return b
	}
	p := c.rd.port
	for off := nvme.DiscoveryLogHeaderLen; off+nvme.DiscoveryLogEntryLen <= len(b); off += nvme.DiscoveryLogEntryLen {
		e := b[off : off+nvme.DiscoveryLogEntryLen]
		e[0] = trTypeRDMA
		clear(e[32:64])
		copy(e[32:63], p.port)
		clear(e[512:768])
		copy(e[512:767], p.host)
		clear(e[768:1024])
		e[768], e[769], e[770] = rdmaQPTypeConnected, rdmaPrTypeUnspecified, rdmaCMSRDMACM
	}
	return b
}

// keyedSGLs is the Identify Controller SGLS bit of keyed SGL data block
// descriptors, which the NVMe/RDMA transport requires (Linux's host
// refuses a controller without it).
func (c *conn) keyedSGLs() uint32 {
	if c != nil && c.rd != nil {
		return 1 << 2
	}
	return 0
}

// rdmaNetConn stands in for the byte stream that conn's Connect and
// authentication code arm read deadlines on: an RDMA queue has none, and a
// deadline closes the queue when it passes.
type rdmaNetConn struct {
	q     *rdmaQueue
	mu    sync.Mutex
	timer *time.Timer
}

var errNoStream = errors.New("an NVMe/RDMA queue has no byte stream")

func (n *rdmaNetConn) Read([]byte) (int, error)  { return 0, errNoStream }
func (n *rdmaNetConn) Write([]byte) (int, error) { return 0, errNoStream }
func (n *rdmaNetConn) LocalAddr() net.Addr {
	return rdmaAddr(net.JoinHostPort(n.q.port.host, n.q.port.port))
}
func (n *rdmaNetConn) RemoteAddr() net.Addr             { return rdmaAddr(n.q.link.Remote()) }
func (n *rdmaNetConn) SetDeadline(time.Time) error      { return nil }
func (n *rdmaNetConn) SetWriteDeadline(time.Time) error { return nil }

// Close stops the deadline; the queue's serve ends the transport.
func (n *rdmaNetConn) Close() error {
	n.mu.Lock()
	if n.timer != nil {
		n.timer.Stop()
	}
	n.mu.Unlock()
	return nil
}

// SetReadDeadline closes the queue at t unless cleared (zero t) before.
func (n *rdmaNetConn) SetReadDeadline(t time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.timer != nil {
		n.timer.Stop()
		n.timer = nil
	}
	if t.IsZero() {
		return nil
	}
	n.timer = time.AfterFunc(time.Until(t), func() {
		c := n.q.c
		if !c.closing() {
			c.t.warnLimited("rdma-deadline:"+c.remote(), "NVMe/RDMA queue closed: Connect or authentication did not finish in time", "remote", c.remote(), "qid", n.q.qid)
		}
		c.close()
	})
	return nil
}

type rdmaAddr string

func (a rdmaAddr) Network() string { return "rdma" }
func (a rdmaAddr) String() string  { return string(a) }
