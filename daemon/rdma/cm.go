//go:build rdma && linux && cgo

package rdma

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include "verbs.h"
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
		// The wait bounds how late Close is seen (idle listeners wake
		// twice a second).
		wait := min(time.Until(deadline), idleWaitMs*time.Millisecond)
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
