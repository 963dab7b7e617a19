package node

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/config"
	"tier0/daemon/nvme"
	"tier0/daemon/raid"
	"tier0/daemon/store"
	"tier0/daemon/target"
)

// anaGroup is the ANA group of every array subsystem: one namespace, one
// group per subsystem.
const anaGroup = 1

// frontendNSID is the namespace ID of an array's frontend namespace.
const frontendNSID = 1

// served is one configured array as this node sees it: the frontend
// namespace (always present), and, while this node owns the array, the
// imported members and the running RAID.
type served struct {
	n    *Node
	cfg  *config.Array
	nqn  string
	gate *gate

	mu        sync.Mutex // serializes tasks on this array
	epoch     uint64     // ownership epoch the array runs under (0: not owned)
	array     *raid.Array
	members   []Member // by role; nil where not imported
	ctrls     []MemberConn
	pending   map[int]string // role -> "resync" or "rebuild" running
	readd     *readdTries    // the owner's re-add tries of its members (repair.go)
	lastScrub time.Time      // when the periodic scrub last started (or the array started here)
	// anaPending is the epoch of an optimized ANA order kept for retryANA
	// (0: none; owner.go optimizeLocked).
	anaPending uint64

	// Read without mu (self-fencing, RAID events, status):
	runEpoch  atomic.Uint64          // epoch of the running array (0: none)
	openLease uint64                 // lease generation the array was assembled under (mu)
	failure   atomic.Pointer[string] // why the array failed here; nil while it has not
	scrub     atomic.Pointer[scrubRecord]

	// anaMu orders ANA changes; it is never held across I/O, dials or
	// assembly, so that self-fencing can always take it at once.
	anaMu sync.Mutex
	ana   nvme.ANAState

	// resv stores the hosts' reservations of the frontend namespace: the
	// cluster store (resvstate.go); nil without a store (the target's own).
	resv target.ReservationBackend

	// volMu serializes the reconcile passes of the array's volumes
	// (volumes.go), which may zero extents for a long time; volIDs guards
	// what they serve, changed under both: implicit is whether NSID 1
	// spanning the whole array is served (the pool has no volume records),
	// vols the carved volumes' windows by NSID.
	volMu    sync.Mutex
	volIDs   sync.Mutex
	implicit bool
	vols     map[uint32]*window
}

// markFailed records that the array lost more members than its parity and
// stops the frontend serving it, with the reason (the gate's error names
// the array and why; ANA inaccessible). It takes no lock the array's
// actions hold.
func (s *served) markFailed(reason string) {
	s.failure.Store(&reason)
	s.gate.block(fmt.Errorf("array %s failed on node %s: %s; it is served again once enough members return: %w", s.cfg.Name, s.n.me.Name, reason, blockdev.ErrNoPath))
	if err := s.setANA(nvme.ANAInaccessible); err != nil {
		s.n.log.Warn("ANA change failed", "array", s.cfg.Name, "err", err)
	}
}

func (s *served) clearFailed() { s.failure.Store(nil) }

// arrayFailed reports whether the array has failed here.
func (s *served) arrayFailed() bool { return s.failure.Load() != nil }

// failReason is why the array failed here ("" while it has not).
func (s *served) failReason() string {
	if p := s.failure.Load(); p != nil {
		return *p
	}
	return ""
}

// gate is the frontend namespace's device: it forwards to the RAID array
// while this node owns it and refuses I/O otherwise (the target answers
// with the ANA inaccessible path status before it gets here; the gate is
// the second line). Swapping the array waits for I/O in flight.
//
// refuse, when set, fails every request with its error before and after
// the array call: it is an atomic checked per request, so self-fencing and
// a failed array stop reads and writes at once, whatever lock an action or
// a request in flight holds. A read whose data came back after the gate
// closed is answered with the error, not the data.
type gate struct {
	mu     sync.RWMutex
	array  *raid.Array
	size   int64
	bs     int
	refuse atomic.Pointer[error]
	// held, when set, says whether the node's lease is still sure to be
	// held; checked per request (after a pause of the whole process the
	// timer that fences the node may not have run yet).
	held func() error
}

// block makes every request fail with err (wrapping blockdev.ErrNoPath, so
// that the target answers ANA inaccessible and hosts try another path).
func (g *gate) block(err error) { g.refuse.Store(&err) }

func (g *gate) unblock() { g.refuse.Store(nil) }

// refused is the error requests fail with now (nil: open).
func (g *gate) refused() error {
	if p := g.refuse.Load(); p != nil {
		return *p
	}
	if g.held != nil {
		return g.held()
	}
	return nil
}

// after turns a completed request into the gate's error when the gate
// closed while it ran.
func (g *gate) after(err error) error {
	if rerr := g.refused(); rerr != nil {
		return rerr
	}
	return err
}

func (g *gate) current() (*raid.Array, func(), error) {
	if err := g.refused(); err != nil {
		return nil, nil, err
	}
	g.mu.RLock()
	if g.array == nil {
		g.mu.RUnlock()
		return nil, nil, fmt.Errorf("array not served by this node: %w", blockdev.ErrNoPath)
	}
	return g.array, g.mu.RUnlock, nil
}

func (g *gate) set(a *raid.Array) {
	g.mu.Lock()
	g.array = a
	g.mu.Unlock()
}

func (g *gate) ReadAt(p []byte, off int64) (int, error) {
	a, done, err := g.current()
	if err != nil {
		return 0, err
	}
	defer done()
	n, err := a.ReadAt(p, off)
	if err = g.after(err); err != nil {
		return 0, err
	}
	return n, nil
}

func (g *gate) WriteAt(p []byte, off int64) (int, error) {
	a, done, err := g.current()
	if err != nil {
		return 0, err
	}
	defer done()
	n, err := a.WriteAt(p, off)
	if err = g.after(err); err != nil {
		return 0, err
	}
	return n, nil
}

func (g *gate) WriteAtFUA(p []byte, off int64) (int, error) {
	a, done, err := g.current()
	if err != nil {
		return 0, err
	}
	defer done()
	n, err := a.WriteAtFUA(p, off)
	if err = g.after(err); err != nil {
		return 0, err
	}
	return n, nil
}

func (g *gate) Flush() error {
	a, done, err := g.current()
	if err != nil {
		return err
	}
	defer done()
	return g.after(a.Flush())
}

func (g *gate) WriteZeroes(off, length int64) error {
	a, done, err := g.current()
	if err != nil {
		return err
	}
	defer done()
	return g.after(a.WriteZeroes(off, length))
}

func (g *gate) Discard(off, length int64) error {
	a, done, err := g.current()
	if err != nil {
		return err
	}
	defer done()
	return g.after(a.Discard(off, length))
}

func (g *gate) Size() int64    { return g.size }
func (g *gate) BlockSize() int { return g.bs }
func (g *gate) Close() error   { return nil }

// startFrontend serves every configured array's namespace, inaccessible
// until this node owns it. The namespace size comes from the RAID geometry
// planned over the configured member sizes, so that it is the same on
// every node.
func (n *Node) startFrontend(ctx context.Context) error {
	idx := n.nodeIndex()
	cntlBase, cntlCount := config.CntlIDRange(idx)
	t, err := target.New(target.Config{
		Listen:      n.me.ListenAddr(n.me.Frontend),
		RDMAListen:  n.rdmaListen(n.cfg.Fabrics.Frontend, n.me.Frontend),
		Advertise:   n.me.AdvertiseAddr(n.me.Frontend),
		CntlIDBase:  cntlBase,
		CntlIDCount: cntlCount,
		PortID:      uint16(idx + 1),
		StateDir:    n.stateDir("frontend-resv"),
		Logger:      n.log.With("layer", "frontend"),
		// Connect and authentication, accept to finish (0: the default)
		ConnectTimeout: n.cfg.Fabrics.Frontend.ConnectTimeout.D(),
	})
	if err != nil {
		return fmt.Errorf("frontend target: %w", err)
	}
	auth, err := dhchap(n.cfg.Fabrics.Frontend)
	if err != nil {
		return fmt.Errorf("fabrics.frontend: %w", err)
	}
	for i := range n.cfg.Arrays {
		if _, err := n.serveArray(ctx, t, auth, &n.cfg.Arrays[i]); err != nil {
			return err
		}
	}
	if err := t.Start(); err != nil {
		return fmt.Errorf("frontend target on %s: %w", n.me.ListenAddr(n.me.Frontend), err)
	}
	n.frontend = t
	if n.st != nil {
		go n.watchReservations(ctx, store.NewReservations(n.st.Client(), n.key()))
		go n.watchVolumes(ctx)
		n.startOnline(ctx, auth) // arrays_online.go
	}
	return nil
}

// serveArray adds array a's frontend subsystem to t (its namespace
// inaccessible until this node owns it) and to the served arrays.
func (n *Node) serveArray(ctx context.Context, t *target.Target, auth target.DHCHAPConfig, a *config.Array) (*served, error) {
	size, bs, err := n.plannedSize(a)
	for wait := n.clk().Now(); err != nil && n.clk().Since(wait) < time.Minute; size, bs, err = n.plannedSize(a) {
		// Sizes of remote drives arrive as their nodes start.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-n.clk().After(time.Second):
		}
	}
	if err != nil {
		return nil, err
	}
	s := &served{n: n, cfg: a, nqn: n.cfg.SubsystemNQN(a.Name), gate: &gate{size: size, bs: bs, held: n.leaseHeld}, ana: nvme.ANAInaccessible, pending: map[int]string{}}
	sc := target.SubsystemConfig{
		NQN:       s.nqn,
		Model:     "tier0 array " + a.Name,
		ANAStates: map[uint32]nvme.ANAState{anaGroup: nvme.ANAInaccessible},
		DHCHAP:    auth,
	}
	if n.st != nil {
		s.resv = &clusterResv{s: s, rs: store.NewReservations(n.st.Client(), n.key())}
		sc.Reservations = s.resv
	}
	if len(n.cfg.Fabrics.Frontend.AllowHosts) > 0 {
		sc.AllowedHosts = n.cfg.Fabrics.Frontend.AllowHosts
	} else {
		sc.AllowAnyHost = true
	}
	if err := t.AddSubsystem(sc); err != nil {
		return nil, fmt.Errorf("frontend subsystem %s: %w", s.nqn, err)
	}
	// A pool with volume records serves its carved volumes (added by
	// the first reconcile, volumes.go), never the implicit one again.
	pool, err := n.poolRecord(ctx, a)
	if err != nil {
		return nil, err
	}
	if pool.Revision == 0 {
		if err := t.AddNamespace(s.nqn, target.NamespaceConfig{
			NSID: frontendNSID,
			// Under a local site's link model the frontend's bytes are
			// charged to the node's link, like its drives' (docs/BENCH.md).
			Device:   blockdev.LinkCharged(s.gate, nil, blockdev.SharedLink(n.cfg.Cluster+"/"+n.me.Name, n.cfg.LinkOf(n.me.Name))),
			NGUID:    derive16("array", n.cfg.Cluster, a.Name),
			UUID:     derive16("array-uuid", n.cfg.Cluster, a.Name),
			ANAGroup: anaGroup,
		}); err != nil {
			return nil, fmt.Errorf("frontend namespace of array %s: %w", a.Name, err)
		}
		s.implicit = true
	}
	n.addServed(s)
	return s, nil
}

// addServed makes s one of the served arrays.
func (n *Node) addServed(s *served) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.arrays[s.cfg.Name] = s
	var l []*served
	if p := n.arrayList.Load(); p != nil {
		l = append(l, *p...)
	}
	l = append(l, s)
	n.arrayList.Store(&l)
}

// servedAll is every served array (site file's first, in config order).
func (n *Node) servedAll() []*served {
	if p := n.arrayList.Load(); p != nil {
		return *p
	}
	return nil
}

// plannedSize is the capacity of array a: its RAID geometry over the
// smallest configured member (or share of a member).
func (n *Node) plannedSize(a *config.Array) (int64, int, error) {
	lvl, err := raid.ParseLevel(a.Level)
	if err != nil {
		return 0, 0, err
	}
	minSize := int64(-1)
	bs := 4096
	for _, m := range a.Members {
		size := int64(0)
		if dev, ok := n.drives[m]; ok {
			size, bs = dev.Size(), max(bs, dev.BlockSize())
		} else if _, d, ok := n.cfg.Drive(m); ok && d.Size > 0 {
			size = int64(d.Size)
		} else {
			size = n.remoteDriveSize(m)
		}
		if size <= 0 {
			return 0, 0, fmt.Errorf("array %s: size of member drive %s is unknown: give it a size in %s or start its node first", a.Name, m, n.cfg.File)
		}
		if k := len(n.cfg.DriveShares(m)); k > 1 {
			size = size / int64(k) / int64(bs) * int64(bs)
		}
		if minSize < 0 || size < minSize {
			minSize = size
		}
	}
	g, err := raid.Plan(raid.Config{Level: lvl, ChunkSize: a.ChunkKiB << 10}, len(a.Members), minSize, bs)
	if err != nil {
		return 0, 0, fmt.Errorf("array %s: %w", a.Name, err)
	}
	return g.Capacity, bs, nil
}

// remoteDriveSize is a drive's size as published in the store by its node
// (0 when unknown). The store may not be open yet at frontend start; then
// the size must come from the configuration.
func (n *Node) remoteDriveSize(drive string) int64 {
	if n.st == nil {
		return 0
	}
	var di driveInfo
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := n.st.Get(ctx, "observed", "drives", drive, &di); err != nil {
		return 0
	}
	return di.Size
}

// setANA changes the array's frontend ANA state (the target raises the ANA
// change event to connected hosts). It takes only anaMu: never the array's
// task lock. Optimized is refused while the node is fenced or the array
// has failed here, so that no action racing with self-fencing can turn a
// fenced path back on.
func (s *served) setANA(st nvme.ANAState) error {
	if st == nvme.ANAOptimized {
		// The hosts' reservations as the store has them, before the first
		// command through this path; outside anaMu (a store read).
		if err := s.syncReservations(); err != nil {
			return fmt.Errorf("array %s: ANA optimized refused: %w", s.cfg.Name, err)
		}
	}
	s.anaMu.Lock()
	defer s.anaMu.Unlock()
	if st == nvme.ANAOptimized {
		if s.n.isFenced() {
			return fmt.Errorf("array %s: ANA optimized refused: node %s has fenced itself", s.cfg.Name, s.n.me.Name)
		}
		if r := s.failReason(); r != "" {
			return fmt.Errorf("array %s: ANA optimized refused: the array failed (%s)", s.cfg.Name, r)
		}
	}
	if s.ana == st {
		return nil
	}
	if err := s.n.setANAState(s.nqn, st); err != nil {
		return fmt.Errorf("array %s: ANA state %v: %w", s.cfg.Name, st, err)
	}
	s.ana = st
	return nil
}

// anaState is the array's current frontend ANA state here.
func (s *served) anaState() nvme.ANAState {
	s.anaMu.Lock()
	defer s.anaMu.Unlock()
	return s.ana
}
