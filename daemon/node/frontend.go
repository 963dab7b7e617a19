package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/raid"
	"tier0/daemon/target"
)

// anaGroup is the ANA group of every array subsystem: one namespace, one
// group per subsystem.
const anaGroup = 1

// served is one configured array as this node sees it: the frontend
// namespace (always present), and, while this node owns the array, the
// imported members and the running RAID.
type served struct {
	n    *Node
	cfg  *config.Array
	nqn  string
	gate *gate

	mu      sync.Mutex // serializes tasks on this array
	epoch   uint64     // ownership epoch the array runs under (0: not owned)
	array   *raid.Array
	members []*host.Namespace // by role; nil where not imported
	ctrls   []*host.Controller
	ana     nvme.ANAState
	pending map[int]string // role -> "resync" or "rebuild" running
}

// gate is the frontend namespace's device: it forwards to the RAID array
// while this node owns it and refuses I/O otherwise (the target answers
// with the ANA inaccessible path status before it gets here; the gate is
// the second line). Swapping the array waits for I/O in flight.
type gate struct {
	mu    sync.RWMutex
	array *raid.Array
	size  int64
	bs    int
}

func (g *gate) current() (*raid.Array, func(), error) {
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
	return a.ReadAt(p, off)
}

func (g *gate) WriteAt(p []byte, off int64) (int, error) {
	a, done, err := g.current()
	if err != nil {
		return 0, err
	}
	defer done()
	return a.WriteAt(p, off)
}

func (g *gate) WriteAtFUA(p []byte, off int64) (int, error) {
	a, done, err := g.current()
	if err != nil {
		return 0, err
	}
	defer done()
	return a.WriteAtFUA(p, off)
}

func (g *gate) Flush() error {
	a, done, err := g.current()
	if err != nil {
		return err
	}
	defer done()
	return a.Flush()
}

func (g *gate) WriteZeroes(off, length int64) error {
	a, done, err := g.current()
	if err != nil {
		return err
	}
	defer done()
	return a.WriteZeroes(off, length)
}

func (g *gate) Discard(off, length int64) error {
	a, done, err := g.current()
	if err != nil {
		return err
	}
	defer done()
	return a.Discard(off, length)
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
	t, err := target.New(target.Config{
		Listen:      n.me.ListenAddr(n.me.Frontend),
		Advertise:   n.me.AdvertiseAddr(n.me.Frontend),
		CntlIDBase:  uint16(1 + idx*256),
		CntlIDCount: 256,
		PortID:      uint16(idx + 1),
		StateDir:    n.stateDir("frontend-resv"),
		Logger:      n.log.With("layer", "frontend"),
	})
	if err != nil {
		return fmt.Errorf("frontend target: %w", err)
	}
	auth, err := dhchap(n.cfg.Fabrics.Frontend)
	if err != nil {
		return fmt.Errorf("fabrics.frontend: %w", err)
	}
	for i := range n.cfg.Arrays {
		a := &n.cfg.Arrays[i]
		size, bs, err := n.plannedSize(a)
		for wait := time.Now(); err != nil && time.Since(wait) < time.Minute; size, bs, err = n.plannedSize(a) {
			// Sizes of remote drives arrive as their nodes start.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
		if err != nil {
			return err
		}
		s := &served{n: n, cfg: a, nqn: n.cfg.SubsystemNQN(a.Name), gate: &gate{size: size, bs: bs}, ana: nvme.ANAInaccessible, pending: map[int]string{}}
		sc := target.SubsystemConfig{
			NQN:       s.nqn,
			Model:     "tier0 array " + a.Name,
			ANAStates: map[uint32]nvme.ANAState{anaGroup: nvme.ANAInaccessible},
			DHCHAP:    auth,
		}
		if len(n.cfg.Fabrics.Frontend.AllowHosts) > 0 {
			sc.AllowedHosts = n.cfg.Fabrics.Frontend.AllowHosts
		} else {
			sc.AllowAnyHost = true
		}
		if err := t.AddSubsystem(sc); err != nil {
			return fmt.Errorf("frontend subsystem %s: %w", s.nqn, err)
		}
		if err := t.AddNamespace(s.nqn, target.NamespaceConfig{
			NSID:     1,
			Device:   s.gate,
			NGUID:    derive16("array", n.cfg.Cluster, a.Name),
			UUID:     derive16("array-uuid", n.cfg.Cluster, a.Name),
			ANAGroup: anaGroup,
		}); err != nil {
			return fmt.Errorf("frontend namespace of array %s: %w", a.Name, err)
		}
		n.arrays[a.Name] = s
	}
	if err := t.Start(); err != nil {
		return fmt.Errorf("frontend target on %s: %w", n.me.ListenAddr(n.me.Frontend), err)
	}
	n.frontend = t
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
// change event to connected hosts).
func (s *served) setANA(st nvme.ANAState) error {
	if s.ana == st {
		return nil
	}
	if err := s.n.frontend.SetANAState(s.nqn, anaGroup, st); err != nil {
		return fmt.Errorf("array %s: ANA state %v: %w", s.cfg.Name, st, err)
	}
	s.ana = st
	return nil
}
