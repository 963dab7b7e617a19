//go:build !(rdma && linux && cgo)

package rdma

import "context"

// Built reports whether this binary has the RDMA transport.
const Built = false

// Conn is one connected queue pair; in this build every method fails with
// ErrNotBuilt.
type Conn struct{}

// Dial fails with ErrNotBuilt: this binary was built without the rdma tag.
func Dial(ctx context.Context, addr string, pd PrivateData, cfg Config) (*Conn, error) {
	return nil, ErrNotBuilt
}

func (c *Conn) Send(slot int, msg []byte) error                        { return ErrNotBuilt }
func (c *Conn) RDMARead(slot, n int, raddr uint64, rkey uint32) error  { return ErrNotBuilt }
func (c *Conn) RDMAWrite(slot, n int, raddr uint64, rkey uint32) error { return ErrNotBuilt }
func (c *Conn) Data(slot int) []byte                                   { return nil }
func (c *Conn) Key(slot int) (uint64, uint32)                          { return 0, 0 }
func (c *Conn) Peer() PrivateData                                      { return PrivateData{} }
func (c *Conn) Accepted() AcceptData                                   { return AcceptData{} }
func (c *Conn) Close() error                                           { return nil }

// Listener accepts queue connections; in this build it cannot exist.
type Listener struct{}

// Listen fails with ErrNotBuilt.
func Listen(addr string) (*Listener, error) { return nil, ErrNotBuilt }

func (l *Listener) Port() int { return 0 }
func (l *Listener) Accept(ctx context.Context, cfg Config, decide func(PrivateData) (AcceptData, uint16)) (*Conn, error) {
	return nil, ErrNotBuilt
}
func (l *Listener) Close() error { return nil }
