package target

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"tier0/daemon/clock"
)

// Sentinel errors of the runtime API.
var (
	// ErrNotFound: the named subsystem or namespace is not served.
	ErrNotFound = errors.New("not found")
	// ErrExists: a subsystem or namespace with that name/ID is already served.
	ErrExists = errors.New("already exists")
	// ErrInvalid: a configuration value is out of range; the message names it.
	ErrInvalid = errors.New("invalid configuration")
	// ErrClosed: the target was closed.
	ErrClosed = errors.New("target closed")
)

// Defaults.
const (
	DefaultIOPort        = 4420
	DefaultDiscoveryPort = 8009
	defaultMaxIOQueues   = 8
	defaultQueueDepth    = 128
	defaultWorkers       = 4
	defaultMaxTransfer   = 1 << 20
	defaultInline        = 16 << 10
	adminInline          = 8 << 10 // the Linux host's admin queue in-capsule size
	adminQueueDepth      = 32
	defaultQuiesceTime   = 2 * time.Second
	maxAERs              = 4
	maxNamespaces        = 1024
	maxANAGroups         = 32
	cntlIDMax            = 0xFFEF
)

// cqtMillis is the Command Quiesce Time advertised in Identify Controller:
// the drain bound plus the keep-alive sweep's lag in noticing a loss.
// It saturates at 65535 ms (a test's hour-long sweep).
func (t *Target) cqtMillis() uint16 {
	return uint16(min((t.cfg.CommandQuiesceTime+t.cfg.KeepAliveSweep+time.Millisecond-1)/time.Millisecond, 0xFFFF))
}

// Config configures a Target. Zero values take the documented defaults.
type Config struct {
	// Listen is the TCP address to serve, e.g. "10.0.0.1:4420" (a bare
	// host gets port 4420). Required unless the caller only uses
	// Serve/ServeConn.
	Listen string
	// DiscoveryListen is an optional second address, e.g. "10.0.0.1" or
	// ":8009" (a bare host gets the discovery port 8009). It serves
	// exactly what Listen serves.
	DiscoveryListen string
	// RDMAListen is an optional IPv4 address served over NVMe/RDMA, e.g.
	// "10.0.0.1:4420" (a bare host gets port 4420): the same subsystems,
	// discovery included; see ListenRDMA and docs/RDMA.md.
	RDMAListen string
	// Advertise is the host:port written into discovery log entries;
	// default: the address Listen is bound to.
	Advertise string
	// PortID is the NVMe port ID reported in discovery entries (default 1).
	PortID uint16
	// CntlIDBase and CntlIDCount give the controller IDs this target hands
	// out: [CntlIDBase, CntlIDBase+CntlIDCount). Nodes serving the same
	// subsystem must use disjoint ranges. Defaults 1 and 256.
	CntlIDBase  uint16
	CntlIDCount uint16
	// StateDir holds persistent reservation state; empty keeps it in memory.
	StateDir string
	// MaxIOQueues is the most I/O queues granted per controller (default 8).
	MaxIOQueues int
	// MaxQueueDepth is the largest I/O queue size accepted in Connect
	// (default 128).
	MaxQueueDepth int
	// WorkersPerQueue bounds the goroutines executing one I/O queue's
	// commands (default 4).
	WorkersPerQueue int
	// MaxDataTransfer is the largest data transfer of one command in bytes,
	// a power of two from 4096 (default 1 MiB); it sets MDTS.
	MaxDataTransfer int
	// InlineDataSize is the I/O queue in-capsule data size (default 16 KiB).
	InlineDataSize int
	// KeepAliveSweep is how often controllers are checked for an expired
	// keep-alive timeout (default 250 ms).
	KeepAliveSweep time.Duration
	// CommandQuiesceTime is the longest a command already executing on a
	// device is expected to take after its controller was torn down
	// (keep-alive timeout or closed connection); queued commands are
	// dropped at once. Advertised, plus KeepAliveSweep, as Identify
	// Controller CQT: a host waits KATO + CQT after losing an association
	// before it resubmits that association's writes anywhere else
	// (docs/FABRIC.md, "Command lifetime"). An I/O queue Connect of a host
	// whose dead queues are still draining waits up to this long for them,
	// then is refused (retryable). Default 2 s; at most 60 s. A drain that
	// takes longer is logged as a warning.
	CommandQuiesceTime time.Duration
	// ConnectTimeout bounds the time from a connection's accept to its
	// finished Connect (and authentication); a host that takes longer is
	// disconnected (default 10 s).
	ConnectTimeout time.Duration
	// Logger receives the target's logs (default: discard).
	Logger *slog.Logger
	// Clock is the target's time for keep-alive accounting and log rate
	// limits (default clock.Real; tests inject a clock.Fake). Socket and
	// RDMA deadlines, the command-quiesce wait, latency figures and
	// accept pauses bound real I/O and stay on the wall clock.
	Clock clock.Clock
	// BootID is the identity of this node's boot that Identify Controller
	// reports, hashed, as the node's incarnation (identify.go, docs/FABRIC.md
	// "Identify Controller: boot incarnation"); empty: the kernel's
	// /proc/sys/kernel/random/boot_id, read once by New (none reported
	// where it cannot be read). Tests and the nemesis's power cuts give
	// their own.
	BootID string
}

// Target is an NVMe/TCP target. Its methods are safe for concurrent use.
type Target struct {
	cfg   Config
	log   *slog.Logger
	rl    *rateLimiter
	mdts  uint8
	pools *bufPools

	mu        sync.Mutex
	subsys    map[string]*subsystem
	disc      *subsystem
	ctrls     map[uint16]*controller
	nextCntl  uint16
	conns     map[*conn]struct{}
	listeners []net.Listener
	rdmaPorts []*rdmaPort
	discGen   uint64
	closed    bool
	advertise string
	inc       uint64 // the node's boot incarnation (Config.BootID), 0: none

	wg     sync.WaitGroup
	stopKA chan struct{}
}

// New validates cfg and returns a Target that serves nothing yet; call
// Start (or Serve) and AddSubsystem.
func New(cfg Config) (*Target, error) {
	if cfg.PortID == 0 {
		cfg.PortID = 1
	}
	if cfg.CntlIDBase == 0 {
		cfg.CntlIDBase = 1
	}
	if cfg.CntlIDCount == 0 {
		cfg.CntlIDCount = 256
	}
	if int(cfg.CntlIDBase)+int(cfg.CntlIDCount)-1 > cntlIDMax {
		return nil, fmt.Errorf("controller ID range [%d, %d) passes %#x, the largest valid ID; lower CntlIDBase or CntlIDCount: %w",
			cfg.CntlIDBase, int(cfg.CntlIDBase)+int(cfg.CntlIDCount), cntlIDMax, ErrInvalid)
	}
	if cfg.MaxIOQueues <= 0 {
		cfg.MaxIOQueues = defaultMaxIOQueues
	}
	if cfg.MaxIOQueues > 0xFFFF {
		return nil, fmt.Errorf("MaxIOQueues %d exceeds 65535: %w", cfg.MaxIOQueues, ErrInvalid)
	}
	if cfg.MaxQueueDepth <= 0 {
		cfg.MaxQueueDepth = defaultQueueDepth
	}
	if cfg.MaxQueueDepth < 2 || cfg.MaxQueueDepth > 1024 {
		return nil, fmt.Errorf("MaxQueueDepth %d outside [2, 1024]: %w", cfg.MaxQueueDepth, ErrInvalid)
	}
	if cfg.WorkersPerQueue <= 0 {
		cfg.WorkersPerQueue = defaultWorkers
	}
	if cfg.MaxDataTransfer == 0 {
		cfg.MaxDataTransfer = defaultMaxTransfer
	}
	mdts := uint8(0)
	for n := cfg.MaxDataTransfer / 4096; n > 1; n >>= 1 {
		mdts++
	}
	if cfg.MaxDataTransfer < 4096 || 4096<<mdts != cfg.MaxDataTransfer || cfg.MaxDataTransfer > 16<<20 {
		return nil, fmt.Errorf("MaxDataTransfer %d must be a power of two in [4096, 16 MiB]: %w", cfg.MaxDataTransfer, ErrInvalid)
	}
	if cfg.InlineDataSize == 0 {
		cfg.InlineDataSize = defaultInline
	}
	if cfg.InlineDataSize < 1024 || cfg.InlineDataSize%16 != 0 || cfg.InlineDataSize > cfg.MaxDataTransfer {
		return nil, fmt.Errorf("InlineDataSize %d must be a multiple of 16 in [1024, MaxDataTransfer %d]: %w", cfg.InlineDataSize, cfg.MaxDataTransfer, ErrInvalid)
	}
	if cfg.KeepAliveSweep <= 0 {
		cfg.KeepAliveSweep = 250 * time.Millisecond
	}
	if cfg.CommandQuiesceTime <= 0 {
		cfg.CommandQuiesceTime = defaultQuiesceTime
	}
	if cfg.CommandQuiesceTime > 60*time.Second {
		return nil, fmt.Errorf("CommandQuiesceTime %v: at most 60 s (Identify Controller CQT is 16 bits of milliseconds): %w",
			cfg.CommandQuiesceTime, ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Clock = clock.Or(cfg.Clock)
	t := &Target{
		cfg: cfg, log: cfg.Logger, rl: newRateLimiter(cfg.Clock, time.Second), mdts: mdts, pools: newBufPools(cfg.MaxDataTransfer),
		subsys: map[string]*subsystem{}, ctrls: map[uint16]*controller{}, nextCntl: cfg.CntlIDBase,
		conns: map[*conn]struct{}{}, advertise: cfg.Advertise, stopKA: make(chan struct{}),
	}
	t.inc = t.bootIncarnation()
	t.wg.Add(1)
	go t.keepAliveLoop()
	return t, nil
}

// Start listens on Config.Listen (and DiscoveryListen) and serves in the
// background until Close.
func (t *Target) Start() error {
	if t.cfg.Listen == "" {
		return fmt.Errorf("target: Config.Listen is empty; give an address such as 127.0.0.1:4420: %w", ErrInvalid)
	}
	addrs := []string{withPort(t.cfg.Listen, DefaultIOPort)}
	if t.cfg.DiscoveryListen != "" {
		addrs = append(addrs, withPort(t.cfg.DiscoveryListen, DefaultDiscoveryPort))
	}
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Close()
			return fmt.Errorf("target: listen on %s: %w", a, err)
		}
		if err := t.register(l); err != nil {
			return err
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			if err := t.acceptLoop(l); err != nil {
				t.log.Error("listener failed", "addr", l.Addr(), "err", err)
			}
		}()

	}
	if t.cfg.RDMAListen != "" {
		if err := t.ListenRDMA(t.cfg.RDMAListen); err != nil {
			t.Close()
			return err
		}
	}
	return nil
}

// withPort returns addr, adding port when addr names only a host.
func withPort(addr string, port int) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	return net.JoinHostPort(strings.Trim(addr, "[]"), strconv.Itoa(port))
}

// Addr returns the address of the first listener, or nil before Start.
func (t *Target) Addr() net.Addr {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.listeners) == 0 {
		return nil
	}
	return t.listeners[0].Addr()
}

// Serve accepts connections on l until l fails or the target is closed.
// It returns nil after Close.
func (t *Target) Serve(l net.Listener) error {
	if err := t.register(l); err != nil {
		return err
	}
	return t.acceptLoop(l)
}

// register records l so that Close closes it; the first listener's
// address is the default advertised address.
func (t *Target) register(l net.Listener) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		l.Close()
		return ErrClosed
	}
	t.listeners = append(t.listeners, l)
	if t.advertise == "" {
		t.advertise = l.Addr().String()
	}
	return nil
}

func (t *Target) acceptLoop(l net.Listener) error {
	for {
		nc, err := l.Accept()
		if err != nil {
			t.mu.Lock()
			closed := t.closed
			t.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("target: accept on %s: %w", l.Addr(), err)
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			t.ServeConn(nc)
		}()
	}
}

// ServeConn serves one already-accepted connection (one NVMe queue) and
// returns when it is closed. It owns nc.
func (t *Target) ServeConn(nc net.Conn) {
	c := newConn(t, nc)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		nc.Close()
		return
	}
	t.conns[c] = struct{}{}
	t.mu.Unlock()
	c.serve()
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// Close stops listening, closes every connection and waits for them.
func (t *Target) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	for _, l := range t.listeners {
		l.Close()
	}
	t.closeRDMALocked()
	for c := range t.conns {
		c.close() // also ends a Connect waiting for a drain
	}
	close(t.stopKA)
	t.mu.Unlock()
	t.wg.Wait()
	return nil
}

// advertised returns the host and port written into discovery entries.
func (t *Target) advertised() (host, port string) {
	t.mu.Lock()
	a := t.advertise
	t.mu.Unlock()
	h, p, err := net.SplitHostPort(a)
	if err != nil {
		return a, fmt.Sprint(DefaultIOPort)
	}
	return h, p
}

func (t *Target) keepAliveLoop() {
	defer t.wg.Done()
	tk := time.NewTicker(t.cfg.KeepAliveSweep)
	defer tk.Stop()
	for {
		select {
		case <-t.stopKA:
			return
		case <-tk.C:
			t.sweepKeepAlive()
		}
	}
}

// sweepKeepAlive tears down every controller silent for longer than its
// keep-alive timeout.
func (t *Target) sweepKeepAlive() {
	now := t.cfg.Clock.Now()
	t.mu.Lock()
	var dead []*controller
	for _, c := range t.ctrls {
		if c.kaExpired(now) {
			dead = append(dead, c)
		}
	}
	t.mu.Unlock()
	for _, c := range dead {
		t.log.Warn("keep-alive timeout: tearing down controller", "cntlid", c.id, "subnqn", c.sub.nqn, "hostnqn", c.hostNQN, "kato_ms", c.katoMillis())
		c.shutdown()
	}
}

// allocCntlID returns a free controller ID from the configured range.
func (t *Target) allocCntlID() (uint16, bool) {
	n := int(t.cfg.CntlIDCount)
	for i := 0; i < n; i++ {
		id := t.nextCntl
		t.nextCntl++
		if int(t.nextCntl) >= int(t.cfg.CntlIDBase)+n {
			t.nextCntl = t.cfg.CntlIDBase
		}
		if _, used := t.ctrls[id]; !used {
			return id, true
		}
	}
	return 0, false
}

// rateLimiter lets one log line per key through per interval and counts
// the suppressed ones.
type rateLimiter struct {
	clk   clock.Clock
	mu    sync.Mutex
	every time.Duration
	last  map[string]time.Time
	supp  map[string]int
}

func newRateLimiter(clk clock.Clock, every time.Duration) *rateLimiter {
	return &rateLimiter{clk: clk, every: every, last: map[string]time.Time{}, supp: map[string]int{}}
}

// allow reports whether a line for key may be logged now, and how many
// were suppressed since the last one.
func (r *rateLimiter) allow(key string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clk.Now()
	if now.Sub(r.last[key]) < r.every {
		r.supp[key]++
		return false, 0
	}
	if len(r.last) > 1024 {
		clear(r.last)
	}
	r.last[key] = now
	n := r.supp[key]
	delete(r.supp, key)
	return true, n
}

// warnLimited logs a warning at most once a second per key.
func (t *Target) warnLimited(key, msg string, args ...any) {
	if ok, n := t.rl.allow(key); ok {
		if n > 0 {
			args = append(args, "suppressed", n)
		}
		t.log.Warn(msg, args...)
	}
}
