//go:build rdma && linux && cgo

package rdma

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

static int t0_count_devices(void) {
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l) return -1;
	ibv_free_device_list(l);
	return n;
}

// t0_get_event waits up to ms for the next CM event.
static int t0_get_event(struct rdma_event_channel *ch, int ms, struct rdma_cm_event **ev) {
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int r = poll(&p, 1, ms);
	if (r == 0) { errno = ETIMEDOUT; return -1; }
	if (r < 0) return -1;
	return rdma_get_cm_event(ch, ev);
}
static int t0_ev_type(struct rdma_cm_event *e) { return e->event; }
static int t0_ev_status(struct rdma_cm_event *e) { return e->status; }
static struct rdma_cm_id *t0_ev_id(struct rdma_cm_event *e) { return e->id; }
static int t0_ev_priv(struct rdma_cm_event *e, void *buf, int max) {
	int n = e->param.conn.private_data_len;
	if (!e->param.conn.private_data) return 0;
	if (n > max) n = max;
	memcpy(buf, e->param.conn.private_data, n);
	return n;
}

static void t0_sin(struct sockaddr_in *s, uint32_t ip, uint16_t port) {
	memset(s, 0, sizeof *s);
	s->sin_family = AF_INET;
	s->sin_addr.s_addr = htonl(ip);
	s->sin_port = htons(port);
}
static int t0_resolve_addr(struct rdma_cm_id *id, uint32_t ip, uint16_t port, int ms) {
	struct sockaddr_in s; t0_sin(&s, ip, port);
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&s, ms);
}
static int t0_bind_listen(struct rdma_cm_id *id, uint32_t ip, uint16_t port) {
	struct sockaddr_in s; t0_sin(&s, ip, port);
	if (rdma_bind_addr(id, (struct sockaddr *)&s)) return -1;
	return rdma_listen(id, 64);
}
static int t0_local_port(struct rdma_cm_id *id) {
	return ntohs(rdma_get_src_port(id));
}

struct t0_q {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	int qp;
};

// t0_setup creates the queue's PD, completion channel (non-blocking fd),
// CQ, RC QP and its one memory region; it returns the failed step (1..6)
// with errno set, or 0.
static int t0_setup(struct t0_q *q, struct rdma_cm_id *id, int depth, int rdmaops, void *buf, size_t len) {
	memset(q, 0, sizeof *q);
	q->id = id;
	if (!(q->pd = ibv_alloc_pd(id->verbs))) return 1;
	if (!(q->ch = ibv_create_comp_channel(id->verbs))) return 2;
	int fl = fcntl(q->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(q->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) return 2;
	// every receive, send and RDMA READ/WRITE may complete at once
	if (!(q->cq = ibv_create_cq(id->verbs, 2 * depth + rdmaops + 8, NULL, q->ch, 0))) return 3;
	if (ibv_req_notify_cq(q->cq, 0)) return 4;
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = a.recv_cq = q->cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = depth + rdmaops + 2;
	a.cap.max_recv_wr = depth + 1;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, q->pd, &a)) return 5;
	q->qp = 1;
	if (!(q->mr = ibv_reg_mr(q->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE))) return 6;
	return 0;
}

static void t0_teardown(struct t0_q *q) {
	if (q->qp) rdma_destroy_qp(q->id);
	if (q->mr) ibv_dereg_mr(q->mr);
	if (q->cq) ibv_destroy_cq(q->cq);
	if (q->ch) ibv_destroy_comp_channel(q->ch);
	if (q->pd) ibv_dealloc_pd(q->pd);
	memset(q, 0, sizeof *q);
}

static uint32_t t0_rkey(struct t0_q *q) { return q->mr->rkey; }

static int t0_conn_param(struct rdma_cm_id *id, struct rdma_conn_param *p, void *priv, int privlen) {
	struct ibv_device_attr d;
	memset(p, 0, sizeof *p);
	if (ibv_query_device(id->verbs, &d)) return -1;
	p->private_data = priv;
	p->private_data_len = privlen;
	p->responder_resources = d.max_qp_rd_atom > 255 ? 255 : d.max_qp_rd_atom;
	p->initiator_depth = d.max_qp_init_rd_atom > 255 ? 255 : d.max_qp_init_rd_atom;
	p->flow_control = 1;
	p->retry_count = 7;
	p->rnr_retry_count = 7;
	return 0;
}
static int t0_connect(struct rdma_cm_id *id, void *priv, int privlen) {
	struct rdma_conn_param p;
	if (t0_conn_param(id, &p, priv, privlen)) return -1;
	return rdma_connect(id, &p);
}
// t0_accept accepts with at most the RDMA READ depths the connecting side
// offered (ird: its responder resources, ord: its initiator depth).
static int t0_accept(struct rdma_cm_id *id, void *priv, int privlen, int ird, int ord) {
	struct rdma_conn_param p;
	if (t0_conn_param(id, &p, priv, privlen)) return -1;
	if (p.initiator_depth > ird) p.initiator_depth = ird;
	if (p.responder_resources > ord) p.responder_resources = ord;
	return rdma_accept(id, &p);
}
// In a CONNECT_REQUEST the depths are the passive side's view: initiator_depth
// is what it may use (the peer's responder resources).
static int t0_ev_ird(struct rdma_cm_event *e) { return e->param.conn.initiator_depth; }
static int t0_ev_ord(struct rdma_cm_event *e) { return e->param.conn.responder_resources; }
static int t0_peer(struct rdma_cm_id *id, char *buf, int n) {
	struct sockaddr *sa = rdma_get_peer_addr(id);
	if (!sa || sa->sa_family != AF_INET) return -1;
	struct sockaddr_in *s = (struct sockaddr_in *)sa;
	if (!inet_ntop(AF_INET, &s->sin_addr, buf, n)) return -1;
	return ntohs(s->sin_port);
}

// ibv_post_* return an errno value, not -1.
static int t0_post_recv(struct t0_q *q, uint64_t wr, void *addr, uint32_t len) {
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = q->mr->lkey };
	struct ibv_recv_wr w, *bad;
	memset(&w, 0, sizeof w);
	w.wr_id = wr; w.sg_list = &s; w.num_sge = 1;
	return ibv_post_recv(q->id->qp, &w, &bad);
}
static int t0_post_send(struct t0_q *q, uint64_t wr, int op, void *addr, uint32_t len, uint64_t raddr, uint32_t rkey) {
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = q->mr->lkey };
	struct ibv_send_wr w, *bad;
	memset(&w, 0, sizeof w);
	w.wr_id = wr; w.sg_list = &s; w.num_sge = 1;
	w.send_flags = IBV_SEND_SIGNALED;
	switch (op) {
	case 2: w.opcode = IBV_WR_SEND; break;
	case 3: w.opcode = IBV_WR_RDMA_READ; break;
	case 4: w.opcode = IBV_WR_RDMA_WRITE; break;
	default: return EINVAL;
	}
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(q->id->qp, &w, &bad);
}

struct t0_wc { uint64_t wr_id; uint32_t status; uint32_t byte_len; uint32_t vendor_err; };

// t0_wait waits up to ms for a completion event, re-arms the CQ and drains
// it into out (at most max). Arm-then-drain: a completion after the drain
// raises a new event. Returns the count or -1 with errno.
// cmfd (or -1) is the connection's CM event channel: *cmready is set when
// it has an event (a disconnect).
static int t0_wait(struct t0_q *q, int cmfd, int ms, struct t0_wc *out, int max, int *cmready) {
	*cmready = 0;
	if (ms > 0) {
		struct pollfd p[2] = { { .fd = q->ch->fd, .events = POLLIN }, { .fd = cmfd, .events = POLLIN } };
		int r = poll(p, cmfd >= 0 ? 2 : 1, ms);
		if (r < 0 && errno != EINTR) return -1;
		if (r > 0 && cmfd >= 0 && (p[1].revents & POLLIN)) *cmready = 1;
	}
	struct ibv_cq *cq; void *ctx; int got = 0;
	while (ibv_get_cq_event(q->ch, &cq, &ctx) == 0) got++;
	if (got) {
		ibv_ack_cq_events(q->cq, got);
		if (ibv_req_notify_cq(q->cq, 0)) return -1;
	}
	struct ibv_wc wc[32];
	int n = 0;
	while (n < max) {
		int want = max - n < 32 ? max - n : 32;
		int k = ibv_poll_cq(q->cq, want, wc);
		if (k < 0) { errno = EIO; return -1; }
		for (int i = 0; i < k; i++) {
			out[n].wr_id = wc[i].wr_id; out[n].status = wc[i].status;
			out[n].byte_len = wc[i].byte_len; out[n].vendor_err = wc[i].vendor_err;
			n++;
		}
		if (k < want) break;
	}
	return n;
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Built reports whether this binary has the RDMA transport.
const Built = true

const defaultTimeout = 5 * time.Second

// Conn is one connected queue pair with its completion queue and its one
// registered memory region.
type Conn struct {
	q       C.struct_t0_q
	ch      *C.struct_rdma_event_channel // owned by a dialed Conn; nil when accepted
	id      *C.struct_rdma_cm_id
	mem     []byte
	cfg     Config
	recvOff int
	sendOff int
	dataOff int
	peer    PrivateData
	accept  AcceptData

	closed   atomic.Bool
	peerGone atomic.Bool // a CM disconnect arrived
	done     chan struct{}
	closeMu  sync.Mutex
	stopped  bool
	isClosed bool
}

func checkDevices() error {
	n, err := C.t0_count_devices()
	if n < 0 {
		if errors.Is(err, syscall.ENOSYS) {
			return fmt.Errorf("%w (ibv_get_device_list: %v: /sys/class/infiniband_verbs is absent, the kernel's ib_uverbs is not loaded); modprobe ib_uverbs, or for soft-RoCE %s", ErrNoDevice, err, softRoCEHint)
		}
		return fmt.Errorf("%w (ibv_get_device_list failed: %v); %s", ErrNoDevice, err, softRoCEHint)
	}
	if n == 0 {
		return fmt.Errorf("%w (ibv_get_device_list found none); %s", ErrNoDevice, softRoCEHint)
	}
	return nil
}

func newEventChannel() (*C.struct_rdma_event_channel, error) {
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		return nil, fmt.Errorf("rdma: rdma_create_event_channel failed (%v): /dev/infiniband/rdma_cm is missing or unusable; load rdma_ucm (modprobe rdma_ucm)", err)
	}
	return ch, nil
}

func ip4(addr string) (uint32, uint16, error) {
	a, err := net.ResolveTCPAddr("tcp4", addr)
	if err != nil {
		return 0, 0, fmt.Errorf("rdma: address %q: %v (want IPv4 HOST:PORT)", addr, err)
	}
	ip := a.IP.To4()
	if ip == nil && a.IP == nil {
		ip = net.IPv4zero.To4()
	}
	if ip == nil {
		return 0, 0, fmt.Errorf("rdma: address %q is not IPv4 (only IPv4 is supported)", addr)
	}
	return uint32(ip[0])<<24 | uint32(ip[1])<<16 | uint32(ip[2])<<8 | uint32(ip[3]), uint16(a.Port), nil
}

var cmEventNames = map[int]string{
	C.RDMA_CM_EVENT_ADDR_RESOLVED: "ADDR_RESOLVED", C.RDMA_CM_EVENT_ADDR_ERROR: "ADDR_ERROR",
	C.RDMA_CM_EVENT_ROUTE_RESOLVED: "ROUTE_RESOLVED", C.RDMA_CM_EVENT_ROUTE_ERROR: "ROUTE_ERROR",
	C.RDMA_CM_EVENT_CONNECT_REQUEST: "CONNECT_REQUEST", C.RDMA_CM_EVENT_CONNECT_RESPONSE: "CONNECT_RESPONSE",
	C.RDMA_CM_EVENT_CONNECT_ERROR: "CONNECT_ERROR", C.RDMA_CM_EVENT_UNREACHABLE: "UNREACHABLE",
	C.RDMA_CM_EVENT_REJECTED: "REJECTED", C.RDMA_CM_EVENT_ESTABLISHED: "ESTABLISHED",
	C.RDMA_CM_EVENT_DISCONNECTED: "DISCONNECTED", C.RDMA_CM_EVENT_DEVICE_REMOVAL: "DEVICE_REMOVAL",
	C.RDMA_CM_EVENT_TIMEWAIT_EXIT: "TIMEWAIT_EXIT",
}

func evName(t int) string {
	if s, ok := cmEventNames[t]; ok {
		return s
	}
	return fmt.Sprintf("event %d", t)
}

type cmEvent struct {
	typ      int
	status   int
	id       *C.struct_rdma_cm_id
	priv     []byte
	ird, ord int // CONNECT_REQUEST: the RDMA READ depths the peer offers
}

// getEvent returns the next CM event (acknowledged, its fields copied).
func getEvent(ch *C.struct_rdma_event_channel, timeout time.Duration) (cmEvent, error) {
	var ev *C.struct_rdma_cm_event
	r, err := C.t0_get_event(ch, C.int(timeout/time.Millisecond), &ev)
	if r != 0 {
		if errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, syscall.EINTR) {
			return cmEvent{}, fmt.Errorf("no RDMA CM event within %v", timeout)
		}
		return cmEvent{}, fmt.Errorf("rdma_get_cm_event: %v", err)
	}
	var buf [256]byte
	n := C.t0_ev_priv(ev, unsafe.Pointer(&buf[0]), C.int(len(buf)))
	e := cmEvent{typ: int(C.t0_ev_type(ev)), status: int(C.t0_ev_status(ev)), id: C.t0_ev_id(ev), priv: append([]byte(nil), buf[:n]...),
		ird: int(C.t0_ev_ird(ev)), ord: int(C.t0_ev_ord(ev))}
	C.rdma_ack_cm_event(ev)
	return e, nil
}

func expect(ch *C.struct_rdma_event_channel, timeout time.Duration, want int, what string) (cmEvent, error) {
	e, err := getEvent(ch, timeout)
	if err != nil {
		return e, fmt.Errorf("rdma: %s: waiting for %s: %v", what, evName(want), err)
	}
	if e.typ != want {
		msg := fmt.Sprintf("rdma: %s: got %s (status %d), want %s", what, evName(e.typ), e.status, evName(want))
		if e.typ == C.RDMA_CM_EVENT_REJECTED && len(e.priv) >= 4 {
			st := uint16(e.priv[2]) | uint16(e.priv[3])<<8
			msg += fmt.Sprintf(": the target rejected the connection: %s (NVMe/RDMA status %d)", RejectReason(st), st)
		}
		return e, errors.New(msg)
	}
	return e, nil
}

func timeoutOf(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		if t := time.Until(d); t > 0 {
			return t
		}
		return time.Millisecond
	}
	return defaultTimeout
}

// Dial connects one queue pair to the NVMe/RDMA target at addr (IPv4
// HOST:PORT) with rdma_cm, sending pd as the connect private data.
func Dial(ctx context.Context, addr string, pd PrivateData, cfg Config) (*Conn, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	ip, port, err := ip4(addr)
	if err != nil {
		return nil, err
	}
	if err := checkDevices(); err != nil {
		return nil, err
	}
	to := timeoutOf(ctx)
	ch, err := newEventChannel()
	if err != nil {
		return nil, err
	}
	c := &Conn{ch: ch, cfg: cfg, done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			c.destroy()
		}
	}()
	if r, err := C.rdma_create_id(ch, &c.id, nil, C.RDMA_PS_TCP); r != 0 {
		return nil, fmt.Errorf("rdma: rdma_create_id: %v", err)
	}
	if r, err := C.t0_resolve_addr(c.id, C.uint32_t(ip), C.uint16_t(port), C.int(to/time.Millisecond)); r != 0 {
		return nil, fmt.Errorf("rdma: rdma_resolve_addr %s: %v", addr, err)
	}
	if _, err := expect(ch, to, C.RDMA_CM_EVENT_ADDR_RESOLVED, "resolving "+addr+" (is an RDMA link on the interface that reaches it? rdma link show)"); err != nil {
		return nil, err
	}
	if r, err := C.rdma_resolve_route(c.id, C.int(to/time.Millisecond)); r != 0 {
		return nil, fmt.Errorf("rdma: rdma_resolve_route %s: %v", addr, err)
	}
	if _, err := expect(ch, to, C.RDMA_CM_EVENT_ROUTE_RESOLVED, "route to "+addr); err != nil {
		return nil, err
	}
	if err := c.setup(c.id); err != nil {
		return nil, err
	}
	priv := pd.Append(nil)
	cpriv := C.CBytes(priv)
	defer C.free(cpriv)
	if r, err := C.t0_connect(c.id, cpriv, C.int(len(priv))); r != 0 {
		return nil, fmt.Errorf("rdma: rdma_connect %s: %v", addr, err)
	}
	e, err := expect(ch, to, C.RDMA_CM_EVENT_ESTABLISHED, "connecting to "+addr)
	if err != nil {
		return nil, err
	}
	if len(e.priv) >= 4 {
		c.accept = AcceptData{RecFmt: uint16(e.priv[0]) | uint16(e.priv[1])<<8, CRQSize: uint16(e.priv[2]) | uint16(e.priv[3])<<8}
	}
	c.peer = pd
	ok = true
	go c.poll()
	return c, nil
}

// setup maps and registers the queue's memory, creates its QP and CQ and
// posts every receive buffer.
func (c *Conn) setup(id *C.struct_rdma_cm_id) error {
	var total int
	c.recvOff, c.sendOff, c.dataOff, total = c.cfg.layout()
	mem, err := syscall.Mmap(-1, 0, total, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("rdma: mapping %d bytes of queue memory: %v", total, err)
	}
	c.mem = mem
	steps := [...]string{1: "ibv_alloc_pd", 2: "ibv_create_comp_channel", 3: "ibv_create_cq", 4: "ibv_req_notify_cq", 5: "rdma_create_qp", 6: "ibv_reg_mr"}
	if r, err := C.t0_setup(&c.q, id, C.int(c.cfg.Depth), C.int(c.cfg.dataSlots()), unsafe.Pointer(&mem[0]), C.size_t(total)); r != 0 {
		hint := ""
		if r == 6 {
			hint = " (locked memory limit? ulimit -l)"
		}
		return fmt.Errorf("rdma: %s failed for a queue of depth %d and %d bytes: %v%s", steps[r], c.cfg.Depth, total, err, hint)
	}
	for i := 0; i < c.cfg.Depth; i++ {
		if err := c.postRecv(i); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) postRecv(slot int) error {
	off := c.recvOff + slot*c.cfg.RecvSize
	if r := C.t0_post_recv(&c.q, C.uint64_t(uint64(OpRecv)<<32|uint64(slot)), unsafe.Pointer(&c.mem[off]), C.uint32_t(c.cfg.RecvSize)); r != 0 {
		return fmt.Errorf("rdma: ibv_post_recv slot %d: %v", slot, syscall.Errno(r))
	}
	return nil
}

func (c *Conn) slotCheck(slot int) error {
	if slot < 0 || slot >= c.cfg.Depth {
		return fmt.Errorf("rdma: slot %d out of range 0..%d", slot, c.cfg.Depth-1)
	}
	if c.closed.Load() {
		return ErrClosed
	}
	if c.peerGone.Load() {
		return fmt.Errorf("rdma: the peer disconnected: %w", ErrClosed)
	}
	return nil
}

// Send copies msg into slot's send buffer and posts it as a SEND. The
// handler sees OpSend for slot when the buffer may be reused.
func (c *Conn) Send(slot int, msg []byte) error {
	if err := c.slotCheck(slot); err != nil {
		return err
	}
	if len(msg) > c.cfg.SendSize {
		return fmt.Errorf("rdma: message of %d bytes exceeds the send buffer of %d", len(msg), c.cfg.SendSize)
	}
	off := c.sendOff + slot*c.cfg.SendSize
	copy(c.mem[off:], msg)
	if r := C.t0_post_send(&c.q, C.uint64_t(uint64(OpSend)<<32|uint64(slot)), C.int(OpSend), unsafe.Pointer(&c.mem[off]), C.uint32_t(len(msg)), 0, 0); r != 0 {
		return fmt.Errorf("rdma: ibv_post_send (SEND) slot %d: %v", slot, syscall.Errno(r))
	}
	return nil
}

// RDMARead reads n bytes of the peer's memory at (raddr, rkey) into slot's
// data buffer (a target fetching a host's write data).
func (c *Conn) RDMARead(slot, n int, raddr uint64, rkey uint32) error {
	return c.rdma(OpRDMARead, slot, n, raddr, rkey)
}

// RDMAWrite writes the first n bytes of slot's data buffer to the peer's
// memory at (raddr, rkey) (a target returning read data).
func (c *Conn) RDMAWrite(slot, n int, raddr uint64, rkey uint32) error {
	return c.rdma(OpRDMAWrite, slot, n, raddr, rkey)
}

func (c *Conn) rdma(op Op, slot, n int, raddr uint64, rkey uint32) error {
	if err := c.slotCheck(slot); err != nil {
		return err
	}
	if slot >= c.cfg.dataSlots() {
		return fmt.Errorf("rdma: %v from data slot %d, the queue has %d", op, slot, c.cfg.dataSlots())
	}
	if n < 1 || n > c.cfg.DataSize {
		return fmt.Errorf("rdma: %v of %d bytes, want 1..%d (the data slot size)", op, n, c.cfg.DataSize)
	}
	off := c.dataOff + slot*c.cfg.DataSize
	if r := C.t0_post_send(&c.q, C.uint64_t(uint64(op)<<32|uint64(slot)), C.int(op), unsafe.Pointer(&c.mem[off]), C.uint32_t(n), C.uint64_t(raddr), C.uint32_t(rkey)); r != 0 {
		return fmt.Errorf("rdma: ibv_post_send (%v) slot %d: %v", op, slot, syscall.Errno(r))
	}
	return nil
}

// Data is slot's registered data buffer.
func (c *Conn) Data(slot int) []byte {
	off := c.dataOff + slot*c.cfg.DataSize
	return c.mem[off : off+c.cfg.DataSize : off+c.cfg.DataSize]
}

// Key is the (address, rkey) pair under which the peer reaches slot's data
// buffer with RDMA READ/WRITE: the keyed SGL of a command using it.
func (c *Conn) Key(slot int) (uint64, uint32) {
	off := c.dataOff + slot*c.cfg.DataSize
	return uint64(uintptr(unsafe.Pointer(&c.mem[off]))), uint32(C.t0_rkey(&c.q))
}

// Peer is the connect private data (sent when dialed, received when
// accepted).
func (c *Conn) Peer() PrivateData { return c.peer }

// Accepted is the accept private data (received when dialed, sent when
// accepted).
func (c *Conn) Accepted() AcceptData { return c.accept }

// poll is the queue's one completion goroutine.
func (c *Conn) poll() {
	defer close(c.done)
	const batch = 64
	wcs := make([]C.struct_t0_wc, batch)
	ms := 0
	cmfd := C.int(-1)
	if c.ch != nil {
		cmfd = C.int(c.ch.fd)
	}
	for !c.closed.Load() {
		var cmReady C.int
		n, err := C.t0_wait(&c.q, cmfd, C.int(ms), &wcs[0], batch, &cmReady)
		if n < 0 {
			if !c.closed.Load() {
				c.cfg.Handler(Completion{Err: fmt.Errorf("rdma: completion queue: %v", err)})
			}
			return
		}
		for _, wc := range wcs[:n] {
			op, slot := Op(wc.wr_id>>32), int(uint32(wc.wr_id))
			if wc.status != C.IBV_WC_SUCCESS {
				if c.closed.Load() {
					continue
				}
				c.cfg.Handler(Completion{Op: op, Slot: slot, Err: fmt.Errorf("rdma: %v on slot %d failed: %s (vendor error %#x)",
					op, slot, C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(wc.status))), uint32(wc.vendor_err))})
				continue
			}
			if op == OpRecv {
				off := c.recvOff + slot*c.cfg.RecvSize
				c.cfg.Handler(Completion{Op: op, Slot: slot, Data: c.mem[off : off+int(wc.byte_len)]})
				if !c.closed.Load() {
					if err := c.postRecv(slot); err != nil {
						c.cfg.Handler(Completion{Op: op, Slot: slot, Err: err})
					}
				}
				continue
			}
			c.cfg.Handler(Completion{Op: op, Slot: slot})
		}
		if cmReady != 0 {
			c.cmEvents()
		}
		// drain at once when the batch was full, else wait for an event
		if int(n) == batch {
			ms = 0
		} else {
			ms = 50
		}
	}
}

// cmEvents handles the CM events of a dialed connection after it is
// established: a disconnect (the target removed its port, deleted the
// controller or went away) or a device removal fails the queue at once
// instead of leaving its commands to time out.
func (c *Conn) cmEvents() {
	for !c.closed.Load() {
		e, err := getEvent(c.ch, 0)
		if err != nil {
			return
		}
		switch e.typ {
		case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
			if !c.peerGone.Swap(true) {
				c.cfg.Handler(Completion{Err: fmt.Errorf("%w (%s)", ErrDisconnected, evName(e.typ))})
			}
		}
	}
}

// Stop disconnects and waits for the completion goroutine to end: once
// it returns the handler is not called again and no post succeeds, but
// the registered memory stays mapped (Data is still valid) until Close.
// A target stops a dead queue first, waits for the commands still
// executing from its data buffers, then closes it.
func (c *Conn) Stop() {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.stopped {
		return
	}
	c.stopped = true
	c.closed.Store(true)
	if c.id != nil {
		C.rdma_disconnect(c.id)
	}
	<-c.done
}

// Close disconnects and frees the queue. Pending work requests are
// flushed; the handler is not called for them.
func (c *Conn) Close() error {
	c.Stop()
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.isClosed {
		return nil
	}
	c.isClosed = true
	c.destroy()
	return nil
}

// Remote is the peer's IPv4 address and port ("?" when unknown).
func (c *Conn) Remote() string {
	var buf [64]C.char
	port := C.t0_peer(c.id, &buf[0], C.int(len(buf)))
	if port < 0 {
		return "?"
	}
	return net.JoinHostPort(C.GoString(&buf[0]), fmt.Sprint(int(port)))
}

func (c *Conn) destroy() {
	C.t0_teardown(&c.q)
	if c.id != nil {
		C.rdma_destroy_id(c.id)
		c.id = nil
	}
	if c.ch != nil {
		C.rdma_destroy_event_channel(c.ch)
		c.ch = nil
	}
	if c.mem != nil {
		syscall.Munmap(c.mem)
		c.mem = nil
	}
}

// Listener accepts NVMe/RDMA queue connections (the target side).
type Listener struct {
	ch     *C.struct_rdma_event_channel
	id     *C.struct_rdma_cm_id
	mu     sync.Mutex // held by Accept while it uses the channel, and by Close
	closed atomic.Bool
	port   int
}

// Listen binds an rdma_cm listener to addr (IPv4 HOST:PORT; port 0 picks
// one, see Port).
func Listen(addr string) (*Listener, error) {
	ip, port, err := ip4(addr)
	if err != nil {
		return nil, err
	}
	if err := checkDevices(); err != nil {
		return nil, err
	}
	ch, err := newEventChannel()
	if err != nil {
		return nil, err
	}
	l := &Listener{ch: ch}
	if r, err := C.rdma_create_id(ch, &l.id, nil, C.RDMA_PS_TCP); r != 0 {
		l.Close()
		return nil, fmt.Errorf("rdma: rdma_create_id: %v", err)
	}
	if r, err := C.t0_bind_listen(l.id, C.uint32_t(ip), C.uint16_t(port)); r != 0 {
		l.Close()
		return nil, fmt.Errorf("rdma: listening on %s: %v (is an RDMA link on that address? rdma link show)", addr, err)
	}
	l.port = int(C.t0_local_port(l.id))
	return l, nil
}

// Port is the bound port.
func (l *Listener) Port() int { return l.port }

// Decide sees a connecting queue's private data and returns the queue's
// Config and the accept data, or a non-zero NVMe/RDMA reject status.
type Decide func(PrivateData) (Config, AcceptData, uint16)

// ErrAcceptTimeout: no connect request arrived within Accept's time.
var ErrAcceptTimeout = errors.New("rdma: no connect request")

// Accept waits for one connect request (until ctx ends, ErrAcceptTimeout
// after its deadline, or without one 5 s), decides with decide, sets up
// the queue with the Config decide returned and completes the
// connection. The accepted queue gets its own CM event channel, so that
// its disconnect reaches its completion goroutine at once.
func (l *Listener) Accept(ctx context.Context, decide Decide) (*Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	deadline := time.Now().Add(timeoutOf(ctx))
	var e cmEvent
	for {
		if l.closed.Load() || l.ch == nil {
			return nil, ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		wait := min(time.Until(deadline), 100*time.Millisecond)
		if wait <= 0 {
			return nil, ErrAcceptTimeout
		}
		var err error
		if e, err = getEvent(l.ch, wait); err != nil {
			if strings.HasPrefix(err.Error(), "no RDMA CM event") {
				continue
			}
			return nil, fmt.Errorf("rdma: accepting: waiting for CONNECT_REQUEST: %v", err)
		}
		if e.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
			break
		}
	}
	reject := func(st uint16) {
		rej := RejectData{Status: st}.Append(nil)
		cr := C.CBytes(rej)
		C.rdma_reject(e.id, cr, C.uint8_t(len(rej)))
		C.free(cr)
		C.rdma_destroy_id(e.id)
	}
	pd, err := ParsePrivateData(e.priv)
	if err != nil {
		st := RejectInvalidPrivateDataLen
		if len(e.priv) >= PrivateDataLen {
			st = RejectInvalidRecFmt
		}
		reject(st)
		return nil, err
	}
	cfg, ad, st := decide(pd)
	if st == 0 {
		if err := cfg.check(); err != nil {
			reject(RejectNoResources)
			return nil, err
		}
	}
	if st != 0 {
		reject(st)
		return nil, fmt.Errorf("rdma: rejected queue %d: %s", pd.QID, RejectReason(st))
	}
	ch, err := newEventChannel()
	if err != nil {
		reject(RejectNoResources)
		return nil, err
	}
	if r, err := C.rdma_migrate_id(e.id, ch); r != 0 {
		C.rdma_destroy_event_channel(ch)
		reject(RejectNoResources)
		return nil, fmt.Errorf("rdma: rdma_migrate_id: %v", err)
	}
	c := &Conn{id: e.id, ch: ch, cfg: cfg, done: make(chan struct{}), peer: pd, accept: ad}
	if err := c.setup(e.id); err != nil {
		C.rdma_reject(e.id, nil, 0)
		c.destroy()
		return nil, err
	}
	priv := ad.Append(nil)
	cp := C.CBytes(priv)
	defer C.free(cp)
	if r, err := C.t0_accept(e.id, cp, C.int(len(priv)), C.int(e.ird), C.int(e.ord)); r != 0 {
		c.destroy()
		return nil, fmt.Errorf("rdma: rdma_accept: %v", err)
	}
	if _, err := expect(ch, max(time.Until(deadline), time.Second), C.RDMA_CM_EVENT_ESTABLISHED, fmt.Sprintf("accepting queue %d", pd.QID)); err != nil {
		c.destroy()
		return nil, err
	}
	go c.poll()
	return c, nil
}

// Close stops listening; an Accept in progress returns ErrClosed.
func (l *Listener) Close() error {
	l.closed.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != nil {
		C.rdma_destroy_id(l.id)
		l.id = nil
	}
	if l.ch != nil {
		C.rdma_destroy_event_channel(l.ch)
		l.ch = nil
	}
	return nil
}
