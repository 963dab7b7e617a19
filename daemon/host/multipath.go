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
	"tier0/daemon/clock"
	"tier0/daemon/nvme"
)

// PathSpec names one path of a multipath device: a controller address and
// the connection options (SubNQN, HostID... normally the same on every
// path).
type PathSpec struct {
	Addr    string
	Options Options
}

// MPOptions configure a Multipath device.
type MPOptions struct {
	NSID uint32 // namespace ID (default 1)
	// HoldTimeout: while no path is usable, I/O waits this long for one
	// (like Linux's queue_if_no_path, bounded) and then fails with
	// blockdev.ErrNoPath (default 30 s; negative: fail at once).
	HoldTimeout time.Duration
	// Logger (default: discard).
	Logger *slog.Logger
	// Clock for the hold timeout (default clock.Real).
	Clock clock.Clock
}

// PathState describes one path.
type PathState struct {
	Addr      string
	CntlID    uint16
	Connected bool
	ANAGroup  uint32
	ANA       ANAState
	Usable    bool // optimized or non-optimized and connected
	IOs       int64
	Errors    int64
}

type mpath struct {
	addr string
	ctrl *Controller
	ns   *Namespace
	ios  atomic.Int64
	errs atomic.Int64
}

// Multipath is one namespace reached through the controllers of a
// subsystem on several nodes, a blockdev.Device. I/O goes to an ANA
// optimized path (round robin among them), else a non-optimized one. A path
// error (ANA inaccessible/transition status, lost connection) re-reads that
// controller's ANA log and retries on another path; while no path is
// usable, I/O is held up to HoldTimeout and then fails with
// blockdev.ErrNoPath. A reservation conflict (blockdev.ErrFenced) and every
// other NVMe status are returned as they are, never retried elsewhere.
type Multipath struct {
	opts  MPOptions
	log   *slog.Logger
	paths []*mpath
	bs    int
	size  int64
	rr    atomic.Uint32

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on any path state change
	closed  bool
	closeCh chan struct{}
	wg      sync.WaitGroup
}

var _ blockdev.Device = (*Multipath)(nil)
var _ blockdev.FUAWriter = (*Multipath)(nil)

// NewMultipath connects every path and opens the namespace on each. A path
// that cannot be connected now is left out (and logged); it is an error
// only when no path opens. Connected paths that later lose their
// connection reconnect by themselves.
func NewMultipath(paths []PathSpec, opts MPOptions) (*Multipath, error) {
	if len(paths) == 0 {
		return nil, errors.New("host.NewMultipath: no paths given; list at least one controller address")
	}
	if opts.NSID == 0 {
		opts.NSID = 1
	}
	if opts.HoldTimeout == 0 {
		opts.HoldTimeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Clock = clock.Or(opts.Clock)
	m := &Multipath{opts: opts, log: opts.Logger, changed: make(chan struct{}), closeCh: make(chan struct{})}
	var errs []error
	for _, p := range paths {
		o := p.Options
		if o.Logger == nil {
			o.Logger = opts.Logger
		}
		c, err := Dial(context.Background(), p.Addr, o)
		if err != nil {
			errs = append(errs, err)
			m.log.Warn("multipath: path not connected", "addr", p.Addr, "err", err)
			continue
		}
		ns, err := c.Namespace(opts.NSID)
		if err != nil {
			c.Close()
			errs = append(errs, err)
			continue
		}
		if len(m.paths) > 0 {
			f := m.paths[0].ns
			if ns.bs != f.bs || ns.size != f.size || ns.id.NGUID != f.id.NGUID {
				c.Close()
				errs = append(errs, fmt.Errorf("path %s: namespace %d differs from path %s (size %d/%d, block %d/%d, NGUID %x/%x); not the same namespace",
					p.Addr, opts.NSID, m.paths[0].addr, ns.size, f.size, ns.bs, f.bs, ns.id.NGUID, f.id.NGUID))
				continue
			}
		}
		// make sure the ANA state is known before the first I/O
		if c.Identify().ANACAP != 0 {
			if err := c.RefreshANA(context.Background()); err != nil {
				m.log.Warn("multipath: reading the ANA log failed", "addr", p.Addr, "err", err)
			}
		}
		ns.flags = ioFailFast
		m.paths = append(m.paths, &mpath{addr: p.Addr, ctrl: c, ns: ns})
	}
	if len(m.paths) == 0 {
		return nil, fmt.Errorf("multipath: no path could be opened: %w", errors.Join(errs...))
	}
	m.bs, m.size = m.paths[0].ns.bs, m.paths[0].ns.size
	for _, p := range m.paths {
		ch := p.ctrl.SubscribeANA()
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			for {
				select {
				case <-ch:
					m.bump()
				case <-m.closeCh:
					return
				}
			}
		}()
	}
	return m, nil
}

// bump wakes I/O waiting for a usable path.
func (m *Multipath) bump() {
	m.mu.Lock()
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

// Paths reports the state of every path.
func (m *Multipath) Paths() []PathState {
	out := make([]PathState, 0, len(m.paths))
	for _, p := range m.paths {
		st := p.ns.ANAState()
		out = append(out, PathState{Addr: p.addr, CntlID: p.ctrl.CntlID(), Connected: p.ctrl.Connected(), ANAGroup: p.ns.ANAGroup(),
			ANA: st, Usable: usable(st), IOs: p.ios.Load(), Errors: p.errs.Load()})
	}
	return out
}

func usable(s ANAState) bool { return s == nvme.ANAOptimized || s == nvme.ANANonOptimized }

// pick returns a usable path, preferring optimized ones, skipping those in
// avoid (tried already for this I/O).
func (m *Multipath) pick(avoid uint64) *mpath {
	n := len(m.paths)
	start := int(m.rr.Add(1))
	var nonopt *mpath
	for i := 0; i < n; i++ {
		k := (start + i) % n
		if avoid&(1<<uint(k%64)) != 0 {
			continue
		}
		p := m.paths[k]
		switch p.ns.ANAState() {
		case nvme.ANAOptimized:
			return p
		case nvme.ANANonOptimized:
			if nonopt == nil {
				nonopt = p
			}
		}
	}
	return nonopt
}

func (m *Multipath) index(p *mpath) int {
	for i, q := range m.paths {
		if q == p {
			return i
		}
	}
	return -1
}

// do runs f on a usable path, retrying path errors on other paths and
// holding while none is usable.
func (m *Multipath) do(f func(ns *Namespace) error) error {
	var deadline time.Time
	var avoid uint64
	var last error
	for {
		m.mu.Lock()
		closed, changed := m.closed, m.changed
		m.mu.Unlock()
		if closed {
			return fmt.Errorf("multipath: %w", blockdev.ErrClosed)
		}
		p := m.pick(avoid)
		if p == nil && avoid != 0 {
			// every usable path failed once for this I/O: start over, the
			// states may have changed meanwhile
			avoid = 0
			p = m.pick(0)
		}
		if p != nil {
			p.ios.Add(1)
			err := f(p.ns)
			if err == nil || !IsPathError(err) || errors.Is(err, blockdev.ErrFenced) || errors.Is(err, blockdev.ErrClosed) {
				if err != nil {
					p.errs.Add(1)
				}
				return err
			}
			p.errs.Add(1)
			last = err
			var lost *lostError
			if errors.As(err, &lost) {
				// a write of that path may still execute on its
				// controller: another path only once it is quiesced
				if werr := lost.wait(m.closeCh); werr != nil {
					return fmt.Errorf("multipath: %w (while waiting for path %s to quiesce: %w)", err, p.addr, werr)
				}
			}
			m.log.Debug("multipath: path error, trying another path", "addr", p.addr, "err", err)
			avoid |= 1 << uint(m.index(p)%64)
			// the controller's view changed; re-read its ANA log in the
			// background (an AEN usually does this too)
			p.ctrl.refreshANAAsync()
			if m.pick(avoid) != nil {
				continue
			}
		}
		// no usable path: hold
		now := m.opts.Clock.Now()
		if deadline.IsZero() {
			if m.opts.HoldTimeout < 0 {
				return m.noPath(last)
			}
			deadline = now.Add(m.opts.HoldTimeout)
		}
		wait := deadline.Sub(now)
		if wait <= 0 {
			return m.noPath(last)
		}
		// poll at least every 250 ms: a path can become usable without an
		// event we see (a reconnect's first ANA read)
		select {
		case <-changed:
		case <-m.opts.Clock.After(min(wait, 250*time.Millisecond)):
		case <-m.closeCh:
		}
		avoid = 0
	}
}

func (m *Multipath) noPath(last error) error {
	var states []string
	for _, p := range m.Paths() {
		states = append(states, fmt.Sprintf("%s=%v(connected=%v)", p.Addr, p.ANA, p.Connected))
	}
	if last != nil {
		return fmt.Errorf("multipath: no usable path after %v (paths %v; last error: %v): %w", m.opts.HoldTimeout, states, last, blockdev.ErrNoPath)
	}
	return fmt.Errorf("multipath: no usable path after %v (paths %v): %w", m.opts.HoldTimeout, states, blockdev.ErrNoPath)
}

func (m *Multipath) check(off, length int64) error {
	return blockdev.CheckRange(off, length, m.size, m.bs)
}

// ReadAt reads through a usable path.
func (m *Multipath) ReadAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	err := m.do(func(ns *Namespace) error { _, err := ns.ReadAt(p, off); return err })
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAt writes through a usable path.
func (m *Multipath) WriteAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	err := m.do(func(ns *Namespace) error { _, err := ns.WriteAt(p, off); return err })
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteAtFUA writes with Force Unit Access through a usable path.
func (m *Multipath) WriteAtFUA(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	err := m.do(func(ns *Namespace) error { _, err := ns.WriteAtFUA(p, off); return err })
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush flushes through a usable path.
func (m *Multipath) Flush() error { return m.do(func(ns *Namespace) error { return ns.Flush() }) }

// WriteZeroes zeroes through a usable path.
func (m *Multipath) WriteZeroes(off, length int64) error {
	if err := m.check(off, length); err != nil {
		return err
	}
	return m.do(func(ns *Namespace) error { return ns.WriteZeroes(off, length) })
}

// Discard deallocates through a usable path.
func (m *Multipath) Discard(off, length int64) error {
	if err := m.check(off, length); err != nil {
		return err
	}
	return m.do(func(ns *Namespace) error { return ns.Discard(off, length) })
}

// Size is the capacity in bytes.
func (m *Multipath) Size() int64 { return m.size }

// BlockSize is the logical block size.
func (m *Multipath) BlockSize() int { return m.bs }

// Namespace returns the namespace behind path i (for reservations, which
// are per host and so may go through any path).
func (m *Multipath) Namespace(i int) *Namespace { return m.paths[i].ns }

// Register, Acquire, Release and Report run the reservation commands of
// Namespace through a usable path (reservations belong to the host ID, the
// same on every path). A reservation conflict is ErrFenced and is not
// retried on another path; a path error is.
func (m *Multipath) Register(action uint8, crkey, nrkey uint64, iekey bool) error {
	return m.do(func(ns *Namespace) error { return ns.Register(action, crkey, nrkey, iekey) })
}

// Acquire: see Register.
func (m *Multipath) Acquire(action uint8, t nvme.ResvType, crkey, prkey uint64) error {
	return m.do(func(ns *Namespace) error { return ns.Acquire(action, t, crkey, prkey) })
}

// Release: see Register.
func (m *Multipath) Release(action uint8, t nvme.ResvType, crkey uint64) error {
	return m.do(func(ns *Namespace) error { return ns.Release(action, t, crkey) })
}

// Report: see Register.
func (m *Multipath) Report() (nvme.ResvStatus, error) {
	var st nvme.ResvStatus
	err := m.do(func(ns *Namespace) error {
		var err error
		st, err = ns.Report()
		return err
	})
	return st, err
}

// Close disconnects every path.
func (m *Multipath) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.closeCh)
	m.mu.Unlock()
	for _, p := range m.paths {
		p.ctrl.Close()
	}
	m.wg.Wait()
	return nil
}
