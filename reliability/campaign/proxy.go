package campaign

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// frontProxy forwards the host's TCP connections to one node's frontend,
// so that a fault can reset them (RST, as a flapping link or a crashed
// switch port would) while both ends keep running.
type frontProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	pairs map[*proxyPair]struct{}
	done  bool
}

type proxyPair struct{ client, server net.Conn }

func newFrontProxy(target string) (*frontProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &frontProxy{ln: ln, target: target, pairs: map[*proxyPair]struct{}{}}
	go p.serve()
	return p, nil
}

// Addr is where the host connects instead of the frontend.
func (p *frontProxy) Addr() string { return p.ln.Addr().String() }

func (p *frontProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *frontProxy) forward(c net.Conn) {
	s, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		c.Close()
		return
	}
	pair := &proxyPair{client: c, server: s}
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	p.pairs[pair] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		// One direction ended: end both (a half-open NVMe/TCP connection
		// is of no use to either side).
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Add(2)
	go pipe(s, c)
	go pipe(c, s)
	wg.Wait()
	p.mu.Lock()
	delete(p.pairs, pair)
	p.mu.Unlock()
}

// Reset aborts every forwarded connection with a TCP RST on both sides and
// returns how many there were.
func (p *frontProxy) Reset() int {
	p.mu.Lock()
	pairs := make([]*proxyPair, 0, len(p.pairs))
	for pr := range p.pairs {
		pairs = append(pairs, pr)
	}
	p.mu.Unlock()
	for _, pr := range pairs {
		for _, c := range []net.Conn{pr.client, pr.server} {
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close sends RST, drops what is unsent
			}
			_ = c.Close()
		}
	}
	return len(pairs)
}

// Close stops accepting and resets what is left.
func (p *frontProxy) Close() error {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Reset()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
