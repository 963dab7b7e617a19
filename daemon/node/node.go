package node

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
	"tier0/daemon/config"
	"tier0/daemon/slurm/drain"
	"tier0/daemon/store"
	"tier0/daemon/target"
)

// Options configure a node daemon.
type Options struct {
	// Config is the loaded site configuration.
	Config *config.Config
	// Name is this node's name in Config.
	Name string
	// Logger (default: discard).
	Logger *slog.Logger
	// Tick is the coordinator's state machine tick (default 500 ms).
	Tick time.Duration
	// Token authorizes mutating API calls; empty disables them.
	Token string
	// TLS, when set, serves the management API over HTTPS (mTLS when it
	// requires client certificates).
	TLS *tls.Config
	// JoinExisting starts this node's embedded etcd member as a new
	// member of a running cluster (replacing a dead voting member).
	JoinExisting bool
	// Clock is the node's time (default the wall clock); the simulation
	// gives a fake one.
	Clock clock.Clock
	// Store, when set, is the control plane to use instead of opening
	// etcd per the site configuration (the simulation's in-memory store).
	Store Store
	// Fabric, when set, imports member drives instead of the backend
	// NVMe/TCP fabric (the simulation's in-memory fabric).
	Fabric Fabric
}

// Node is one running tier0d.
type Node struct {
	opts Options
	cfg  *config.Config
	me   *config.Node
	log  *slog.Logger

	drives   map[string]blockdev.Device // local drives by name
	backend  *target.Target
	frontend *target.Target
	st       Store
	live     Lease
	api      *api.Server
	metrics  *api.Metrics
	drainer  *drain.Drainer

	mu     sync.Mutex
	arrays map[string]*served // every configured array, by name
	// fenced is set while the node has fenced itself (lease lost); an
	// atomic so that self-fencing and every check of it take no lock.
	fenced   atomic.Bool
	fenceWhy atomic.Pointer[string]
	leaseGen atomic.Uint64 // counts lease registrations
	// fences counts this process's self-fences: with started it names the
	// registration that publishes the arrays' observed records.
	fences atomic.Uint64
	lease  leaseSlot // the current lease, for the per-request check
	bg     bgGroup   // background reports and records (goBG)
	out    outbox    // reports not yet in the store (outbox.go)
	// arrayList is every served array, site file's first in config order,
	// then the online ones as they were added (arrays_online.go); replaced
	// whole (copy on write) under mu, read without a lock (servedAll).
	arrayList atomic.Pointer[[]*served]
	online    *onlineArrays // the arrays created online (arrays_online.go)
	started   time.Time
	coord     bool   // this node is the coordinator now
	lastView  string // last published cluster view, without its time
}

// New checks the configuration for this node. Nothing is opened until Run.
func New(opts Options) (*Node, error) {
	if opts.Config == nil {
		return nil, errors.New("node: no site configuration given")
	}
	me, ok := opts.Config.Node(opts.Name)
	if !ok {
		var names []string
		for _, n := range opts.Config.Nodes {
			names = append(names, n.Name)
		}
		return nil, fmt.Errorf("node %q is not in site config %s; expected one of %s", opts.Name, opts.Config.File, strings.Join(names, ", "))
	}
	if opts.Fabric == nil {
		if err := checkTransports(opts.Config); err != nil {
			return nil, err
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Tick == 0 {
		opts.Tick = 500 * time.Millisecond
	}
	return &Node{
		opts:   opts,
		cfg:    opts.Config,
		me:     me,
		log:    opts.Logger.With("node", opts.Name),
		drives: map[string]blockdev.Device{},
		arrays: map[string]*served{},
	}, nil
}

// Run starts every role of the node and blocks until ctx ends or a role
// fails; it then stops everything it started.
func (n *Node) Run(ctx context.Context) error {
	n.started = n.clk().Now()
	defer n.shutdown()
	if err := n.openDrives(); err != nil {
		return err
	}
	if err := n.startBackend(); err != nil {
		return err
	}
	if n.opts.Store != nil {
		n.st = n.opts.Store
	} else {
		st, err := n.openStore(ctx)
		if err != nil {
			return err
		}
		n.st = st
	}
	if err := n.publishDrives(ctx); err != nil {
		return err
	}
	if err := n.startFrontend(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := n.startAPI(ctx); err != nil {
		return err
	}
	n.startSlurm()
	errc := make(chan error, 4)
	go func() { errc <- n.livenessLoop(ctx) }()
	go func() { errc <- n.taskLoop(ctx) }()
	go func() { errc <- n.coordinatorLoop(ctx) }()
	go n.housekeeping(ctx)
	n.log.Info("tier0d running", "backend", n.me.AdvertiseAddr(n.me.Backend), "frontend", n.me.AdvertiseAddr(n.me.Frontend), "api", n.me.AdvertiseAddr(n.me.API))
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
}

func (n *Node) shutdown() {
	n.mu.Lock()
	arrays := n.arrays
	n.mu.Unlock()
	for _, s := range arrays {
		s.stop(false)
	}
	// Reports and records still being written (each bounded by its own
	// timeout) go out before the store closes.
	n.bg.Wait()
	if n.drainer != nil {
		n.drainer.Close()
	}
	if n.live != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = n.live.Close(cctx)
		cancel()
	}
	if n.frontend != nil {
		_ = n.frontend.Close()
	}
	if n.backend != nil {
		_ = n.backend.Close()
	}
	for _, d := range n.drives {
		_ = d.Close()
	}
	if n.st != nil {
		_ = n.st.Close()
	}
}

// stateDir is this node's private state directory.
func (n *Node) stateDir(parts ...string) string {
	base := n.cfg.Workdir
	if base == "" {
		base = "/var/lib/tier0"
	}
	return filepath.Join(append([]string{base, "state", n.me.Name}, parts...)...)
}

func (n *Node) openStore(ctx context.Context) (*store.Store, error) {
	ec := n.cfg.ControlPlane.Etcd
	o := store.Options{
		Name:         n.me.Name,
		Endpoints:    ec.Endpoints,
		ClusterToken: "tier0-" + n.cfg.Cluster,
		Prefix:       "/tier0/" + n.cfg.Cluster + "/",
		Logger:       n.log.With("layer", "store"),
		StartTimeout: 60 * time.Second,
		JoinExisting: n.opts.JoinExisting,
		TickMs:       uint(ec.Tick.D().Milliseconds()),
		ElectionMs:   uint(ec.Election.D().Milliseconds()),
	}
	if len(ec.Endpoints) == 0 {
		for _, p := range n.cfg.EtcdPeers() {
			o.Peers = append(o.Peers, store.Peer{Name: p.Node, ClientURL: p.ClientURL, PeerURL: p.PeerURL, ListenHost: p.ListenHost})
		}
		dd := ec.DataDir
		if dd == "" {
			dd = "etcd"
		}
		if !filepath.IsAbs(dd) {
			dd = filepath.Join(n.cfg.Workdir, dd)
		}
		o.DataDir = filepath.Join(dd, n.me.Name)
		if err := os.MkdirAll(filepath.Dir(o.DataDir), 0o755); err != nil {
			return nil, fmt.Errorf("etcd data directory %s: %w", o.DataDir, err)
		}
	}
	st, err := store.Open(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	return st, nil
}

// hostNQN is the NQN this node uses as an NVMe host on the backend.
func hostNQN(cfg *config.Config, node string) string {
	return fmt.Sprintf("%s:%s:node-%s", cfg.Fabrics.NQNPrefix, cfg.Cluster, strings.ToLower(node))
}

// hostID is this node's NVMe host ID; reservations are keyed by it.
func hostID(cfg *config.Config, node string) [16]byte {
	return derive16("hostid", cfg.Cluster, node)
}

// derive16 returns 16 stable bytes for a name (NGUID, UUID, host ID),
// formatted as an RFC 4122 version-5-like UUID.
func derive16(parts ...string) [16]byte {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	var u [16]byte
	copy(u[:], h[:16])
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	return u
}

// nodeIndex is the node's position in the config (for disjoint controller
// ID ranges).
func (n *Node) nodeIndex() int {
	for i := range n.cfg.Nodes {
		if n.cfg.Nodes[i].Name == n.me.Name {
			return i
		}
	}
	return 0
}
