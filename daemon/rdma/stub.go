//go:build !(rdma && linux && cgo)

package rdma

import (
	"context"
	"errors"
)

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
func (c *Conn) Stop()                                                  {}
func (c *Conn) Close() error                                           { return nil }
func (c *Conn) Remote() string                                         { return "?" }

// Listener accepts queue connections; in this build it cannot exist.
type Listener struct{}

// Listen fails with ErrNotBuilt.
func Listen(addr string) (*Listener, error) { return nil, ErrNotBuilt }

func (l *Listener) Port() int { return 0 }

// Decide sees a connecting queue's private data and returns the queue's
// Config and the accept data, or a non-zero NVMe/RDMA reject status.
type Decide func(PrivateData) (Config, AcceptData, uint16)

// ErrAcceptTimeout: no connect request arrived within Accept's time.
var ErrAcceptTimeout = errors.New("rdma: no connect request")

func (l *Listener) Accept(ctx context.Context, decide Decide) (*Conn, error) {
	return nil, ErrNotBuilt
}
func (l *Listener) Close() error { return nil }
