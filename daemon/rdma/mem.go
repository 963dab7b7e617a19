package rdma

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// QueueConn is what tier0's NVMe/RDMA host needs of a connected queue pair:
// *Conn, or a MemConn in tests (Options.Dial).
type QueueConn interface {
	Send(slot int, msg []byte) error
	Data(slot int) []byte
	Key(slot int) (uint64, uint32)
	Close() error
}

// MemConn is one end of an in-process stand-in for a connected queue pair
// (MemPair), for testing both NVMe/RDMA sides without an RDMA device, in
// every build. It keeps the semantics the two sides rely on: a SEND
// arrives as the peer's RECV; RDMA READ and WRITE resolve the peer's keyed
// address against its registered data buffers (a wrong address, length or
// key fails the work request, as on an RNIC); a queue's completions come
// in posting order on one goroutine per end; Close (or Stop) of one end
// is a disconnect the other end's handler sees as a failed completion.
type MemConn struct {
	cfg   Config
	data  []byte
	base  uint64
	key   uint32
	peer  *MemConn
	mu    sync.Mutex
	cond  sync.Cond
	q     []Completion
	recvs [][]byte // free receive buffers (RecvSize each), under mu
	dead  bool
	gone  atomic.Bool // no more posts: stopped, closed or disconnected
	done  chan struct{}
	stopO sync.Once
}

var memKeys atomic.Uint32

// MemPair connects two MemConns: a (the dialer) and b (the acceptor).
func MemPair(a, b Config) (*MemConn, *MemConn, error) {
	if err := a.check(); err != nil {
		return nil, nil, err
	}
	if err := b.check(); err != nil {
		return nil, nil, err
	}
	x, y := newMem(a), newMem(b)
	x.peer, y.peer = y, x
	return x, y, nil
}

func newMem(cfg Config) *MemConn {
	k := memKeys.Add(1)
	m := &MemConn{cfg: cfg, data: make([]byte, cfg.dataSlots()*cfg.DataSize), key: 0x100 + k, base: 0x7f00_0000_0000 + uint64(k)<<32, done: make(chan struct{})}
	m.cond.L = &m.mu
	go m.run()
	return m
}

func (m *MemConn) run() {
	defer close(m.done)
	for {
		m.mu.Lock()
		for len(m.q) == 0 && !m.dead {
			m.cond.Wait()
		}
		if m.dead {
			m.mu.Unlock()
			return
		}
		c := m.q[0]
		m.q = m.q[1:]
		m.mu.Unlock()
		m.cfg.Handler(c)
		if c.Op == OpRecv && c.Err == nil {
			// Data is valid only during the handler call (as a receive
			// buffer posted again): the next RECV reuses it
			m.mu.Lock()
			m.recvs = append(m.recvs, c.Data[:cap(c.Data)])
			m.mu.Unlock()
		}
	}
}

func (m *MemConn) push(c Completion) {
	m.mu.Lock()
	if !m.dead {
		m.q = append(m.q, c)
		m.cond.Signal()
	}
	m.mu.Unlock()
}

func (m *MemConn) check(slot int) error {
	if slot < 0 || slot >= m.cfg.Depth {
		return fmt.Errorf("rdma: slot %d out of range 0..%d", slot, m.cfg.Depth-1)
	}
	if m.gone.Load() {
		return ErrClosed
	}
	return nil
}

// Send delivers msg to the peer as a RECV and completes as OpSend.
func (m *MemConn) Send(slot int, msg []byte) error {
	if err := m.check(slot); err != nil {
		return err
	}
	if len(msg) > m.cfg.SendSize {
		return fmt.Errorf("rdma: message of %d bytes exceeds the send buffer of %d", len(msg), m.cfg.SendSize)
	}
	p := m.peer
	if len(msg) > p.cfg.RecvSize {
		m.fail(OpSend, slot, fmt.Errorf("rdma: SEND of %d bytes into a %d-byte receive buffer: local length error", len(msg), p.cfg.RecvSize))
		return nil
	}
	p.mu.Lock()
	var b []byte
	if n := len(p.recvs); n > 0 {
		b, p.recvs = p.recvs[n-1], p.recvs[:n-1]
	} else {
		b = make([]byte, p.cfg.RecvSize)
	}
	p.mu.Unlock()
	p.push(Completion{Op: OpRecv, Data: b[:copy(b, msg)]})
	m.push(Completion{Op: OpSend, Slot: slot})
	return nil
}

// remote resolves the peer's keyed address, as its RNIC would.
func (m *MemConn) remote(addr uint64, n int, key uint32) ([]byte, error) {
	p := m.peer
	if key != p.key {
		return nil, fmt.Errorf("remote access error: rkey %#x, the peer's region has %#x", key, p.key)
	}
	if addr < p.base || addr+uint64(n) > p.base+uint64(len(p.data)) {
		return nil, fmt.Errorf("remote access error: address %#x+%d outside the peer's registered region", addr, n)
	}
	return p.data[addr-p.base : addr-p.base+uint64(n)], nil
}

func (m *MemConn) rdma(op Op, slot, n int, raddr uint64, rkey uint32) error {
	if err := m.check(slot); err != nil {
		return err
	}
	if slot >= m.cfg.dataSlots() || n < 1 || n > m.cfg.DataSize {
		return fmt.Errorf("rdma: %v of %d bytes from data slot %d, want 1..%d bytes and a slot below %d", op, n, slot, m.cfg.DataSize, m.cfg.dataSlots())
	}
	r, err := m.remote(raddr, n, rkey)
	if err != nil {
		m.fail(op, slot, err)
		return nil
	}
	if op == OpRDMARead {
		copy(m.Data(slot), r)
	} else {
		copy(r, m.Data(slot)[:n])
	}
	m.push(Completion{Op: op, Slot: slot})
	return nil
}

// RDMARead copies n bytes of the peer's memory at (raddr, rkey) into slot's
// data buffer.
func (m *MemConn) RDMARead(slot, n int, raddr uint64, rkey uint32) error {
	return m.rdma(OpRDMARead, slot, n, raddr, rkey)
}

// RDMAWrite copies the first n bytes of slot's data buffer to the peer's
// memory at (raddr, rkey).
func (m *MemConn) RDMAWrite(slot, n int, raddr uint64, rkey uint32) error {
	return m.rdma(OpRDMAWrite, slot, n, raddr, rkey)
}

// fail completes a work request with an error: the queue pair is in the
// error state (no more posts), and the peer sees the disconnect.
func (m *MemConn) fail(op Op, slot int, err error) {
	m.gone.Store(true)
	m.push(Completion{Op: op, Slot: slot, Err: fmt.Errorf("rdma: %v on slot %d failed: %w", op, slot, err)})
	m.peer.disconnected()
}

func (m *MemConn) disconnected() {
	if !m.gone.Swap(true) {
		m.push(Completion{Err: fmt.Errorf("%w (DISCONNECTED)", ErrDisconnected)})
	}
}

// Data is slot's data buffer.
func (m *MemConn) Data(slot int) []byte {
	return m.data[slot*m.cfg.DataSize : (slot+1)*m.cfg.DataSize : (slot+1)*m.cfg.DataSize]
}

// Key is the keyed address of slot's data buffer.
func (m *MemConn) Key(slot int) (uint64, uint32) {
	return m.base + uint64(slot*m.cfg.DataSize), m.key
}

// Stop disconnects and waits until the handler is no longer called.
func (m *MemConn) Stop() {
	m.stopO.Do(func() {
		m.gone.Store(true)
		m.peer.disconnected()
		m.mu.Lock()
		m.dead = true
		m.cond.Signal()
		m.mu.Unlock()
		<-m.done
	})
}

// Close is Stop, and then the end of the registered memory: its data
// buffers are zeroed (as unmapping would make them unreadable), so that a
// test sees data used after Close.
func (m *MemConn) Close() error {
	m.Stop()
	m.mu.Lock()
	clear(m.data)
	m.mu.Unlock()
	return nil
}

// Remote names the in-process peer.
func (m *MemConn) Remote() string { return fmt.Sprintf("mem:%#x", m.peer.key) }
