package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"tier0/daemon/clock"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrConflict: a compare-and-swap lost; the error (a *ConflictError)
	// carries what the store holds now.
	ErrConflict = errors.New("store: compare-and-swap conflict")
	// ErrNotFound: the key does not exist.
	ErrNotFound = errors.New("store: key not found")
	// ErrNotAlive: a node tried to claim ownership without a live lease.
	ErrNotAlive = errors.New("store: node has no live lease")
	// ErrBadOptions: Options are inconsistent (the message says which).
	ErrBadOptions = errors.New("store: invalid options")
	// ErrStart: the embedded member did not become ready.
	ErrStart = errors.New("store: embedded etcd did not start")
)

// Peer is one voting embedded member.
type Peer struct {
	Name       string // node name; also the etcd member name
	ClientURL  string // advertised client URL, http://host:port
	PeerURL    string // advertised peer URL, http://host:port
	ListenHost string // host to bind; empty = the URL's host
}

// Options configure Open.
type Options struct {
	// Name is this node. When it is one of Peers, Open runs an embedded
	// member; otherwise it is only a client.
	Name string
	// Peers are the voting members (1, 3 or 5) for the embedded mode.
	Peers []Peer
	// Endpoints are client URLs of an existing etcd cluster; when set,
	// nothing is embedded and Peers must be empty.
	Endpoints []string
	// DataDir holds the embedded member's data (created if missing).
	DataDir string
	// JoinExisting starts a member with an empty data directory as a new
	// member of a running cluster (after `member add`; see the docs)
	// instead of bootstrapping a new cluster.
	JoinExisting bool
	// ClusterToken distinguishes clusters sharing a network
	// (default "tier0").
	ClusterToken string
	// Prefix is prepended to every key (default "/tier0/").
	Prefix string
	// TickMs and ElectionMs tune the embedded raft (default 50 / 500:
	// etcd's ratio of 10 ticks, at half its period). A lost raft leader
	// costs a randomized election timeout of ElectionMs to 2×ElectionMs,
	// and every lease must outlast that between two renewals: with 500 ms
	// a frozen leader costs at most ~1.5 s of renewals, inside the 2.4 s a
	// 3 s lease leaves (docs/CONTROL-PLANE.md, "Leases").
	TickMs, ElectionMs uint
	// StartTimeout bounds waiting for the member and the client
	// (default 30s).
	StartTimeout time.Duration
	// Logger receives tier0's own messages (default: discard).
	Logger *slog.Logger
	// EtcdLogLevel is the lowest level of etcd's internal logs passed to
	// Logger (tagged component=etcd): debug, info, warn, error (default
	// warn).
	EtcdLogLevel string
	// Clock is the store's time: lease deadlines and their local timers,
	// WatchNodes' grace, retry pauses (default clock.Real).
	Clock clock.Clock
}

// Store is an open connection to the cluster store. Methods are safe for
// concurrent use.
type Store struct {
	opts   Options
	etcd   *embed.Etcd
	cli    *clientv3.Client
	prefix string
	log    *slog.Logger
	clk    clock.Clock
	now    func() time.Time // clk.Now
	ep     endpoints        // one connection per member, for lease renewals (renew.go)
	// nodeTTL is the TTL of the last liveness lease registered here
	// (WatchNodes' grace is derived from it).
	nodeTTL atomic.Int64
}

func (o *Options) fill() error {
	if o.Prefix == "" {
		o.Prefix = "/tier0/"
	}
	if !strings.HasSuffix(o.Prefix, "/") {
		o.Prefix += "/"
	}
	if o.ClusterToken == "" {
		o.ClusterToken = "tier0"
	}
	if o.TickMs == 0 {
		o.TickMs = 50
	}
	if o.ElectionMs == 0 {
		o.ElectionMs = 10 * o.TickMs
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Clock = clock.Or(o.Clock)
	if o.EtcdLogLevel == "" {
		o.EtcdLogLevel = "warn"
	}
	switch {
	case len(o.Endpoints) > 0 && len(o.Peers) > 0:
		return fmt.Errorf("both endpoints %v and embedded peers given; use one: %w", o.Endpoints, ErrBadOptions)
	case len(o.Endpoints) == 0 && len(o.Peers) == 0:
		return fmt.Errorf("neither endpoints nor embedded peers given: %w", ErrBadOptions)
	case len(o.Peers) > 0 && len(o.Peers)%2 == 0:
		return fmt.Errorf("%d voting peers: use an odd number (1, 3 or 5) so that a majority survives: %w", len(o.Peers), ErrBadOptions)
	}
	return nil
}

// Open starts the embedded member if this node is a peer, then connects a
// client. It blocks until the member has joined a quorum (or StartTimeout).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	s := &Store{opts: opts, prefix: opts.Prefix, log: opts.Logger, clk: opts.Clock, now: opts.Clock.Now}
	endpoints := opts.Endpoints
	if len(opts.Peers) > 0 {
		var self *Peer
		for i := range opts.Peers {
			p := &opts.Peers[i]
			if p.Name == opts.Name {
				self = p
				endpoints = append([]string{p.ClientURL}, endpoints...)
			} else {
				endpoints = append(endpoints, p.ClientURL)
			}
		}
		if self != nil {
			if err := s.startMember(ctx, *self); err != nil {
				return nil, err
			}
		}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: opts.StartTimeout,
		// gRPC keep-alive closes a connection to a silently partitioned
		// or frozen endpoint (no RST) so that the balancer stops using
		// it. grpc-go pings at most every 10 s, whatever is asked, so
		// this alone is far too slow for a lease: renewals go through
		// connections of their own with per-call deadlines (renew.go).
		// Both grow with the election timeout (patient): an emulated
		// member may take seconds to answer a ping.
		DialKeepAliveTime:    s.patient(10 * time.Second),
		DialKeepAliveTimeout: s.patient(2 * time.Second),
		Logger:               zap.NewNop(),
		Context:              context.WithoutCancel(ctx),
	})
	if err != nil {
		s.closeMember()
		return nil, fmt.Errorf("store: connect to %v: %w", endpoints, err)
	}
	s.cli = cli
	if err := s.dialEndpoints(endpoints); err != nil {
		cli.Close()
		s.closeMember()
		return nil, err
	}
	cli.Lease = &failoverLease{Lease: cli.Lease, s: s, grants: map[clientv3.LeaseID]renewal{}, keepers: map[*keeper]struct{}{}}
	cli.KV = &failoverKV{KV: cli.KV, s: s}
	cli.Watcher = &failoverWatcher{Watcher: cli.Watcher, s: s}
	return s, nil
}

func parseURL(field, raw string) (url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return url.URL{}, fmt.Errorf("%s %q is not a URL like http://host:port: %w", field, raw, ErrBadOptions)
	}
	return *u, nil
}

func (s *Store) startMember(ctx context.Context, self Peer) error {
	o := s.opts
	if o.DataDir == "" {
		return fmt.Errorf("embedded member %q needs a DataDir: %w", self.Name, ErrBadOptions)
	}
	cfg := embed.NewConfig()
	cfg.Name = self.Name
	cfg.Dir = o.DataDir
	cfg.TickMs, cfg.ElectionMs = o.TickMs, o.ElectionMs
	cfg.InitialClusterToken = o.ClusterToken
	cfg.Logger, cfg.LogLevel = "zap", o.EtcdLogLevel
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newEtcdLogger(o.Logger, o.EtcdLogLevel))
	cfg.AutoCompactionMode, cfg.AutoCompactionRetention = "periodic", "1h"
	peerURL, err := parseURL("peer URL of "+self.Name, self.PeerURL)
	if err != nil {
		return err
	}
	clientURL, err := parseURL("client URL of "+self.Name, self.ClientURL)
	if err != nil {
		return err
	}
	listenPeer, listenClient := peerURL, clientURL
	if self.ListenHost != "" {
		listenPeer.Host = replaceHost(peerURL.Host, self.ListenHost)
		listenClient.Host = replaceHost(clientURL.Host, self.ListenHost)
	}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{listenPeer}, []url.URL{peerURL}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{listenClient}, []url.URL{clientURL}
	var ic []string
	for _, p := range o.Peers {
		ic = append(ic, p.Name+"="+p.PeerURL)
	}
	cfg.InitialCluster = strings.Join(ic, ",")
	cfg.ClusterState = embed.ClusterStateFlagNew
	if o.JoinExisting {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	rejoin := false
	if _, err := os.Stat(filepath.Join(o.DataDir, "member")); err == nil {
		rejoin = true // etcd restarts from its WAL; the flags above are ignored
	}
	start := s.now()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start embedded etcd member %q in %s: %w (%w)", self.Name, o.DataDir, err, ErrStart)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("embedded etcd member %q failed: %w (%w)", self.Name, err, ErrStart)
	case <-s.clk.After(o.StartTimeout):
		e.Close()
		return fmt.Errorf("embedded etcd member %q not ready after %s: is a majority of peers %v up and reachable? %w", self.Name, o.StartTimeout, ic, ErrStart)
	case <-ctx.Done():
		e.Close()
		return ctx.Err()
	}
	s.etcd = e
	s.log.Info("etcd member ready", "member", self.Name, "rejoined", rejoin, "took", s.now().Sub(start))
	return nil
}

func replaceHost(hostport, host string) string {
	if i := strings.LastIndex(hostport, ":"); i >= 0 {
		if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
			host = "[" + host + "]"
		}
		return host + hostport[i:]
	}
	return host
}

func (s *Store) closeMember() {
	if s.etcd != nil {
		s.etcd.Close()
		s.etcd = nil
	}
}

// Close closes the client and stops the embedded member, if any.
func (s *Store) Close() error {
	var err error
	if s.cli != nil {
		err = s.cli.Close()
	}
	s.closeEndpoints()
	s.closeMember()
	return err
}

// Client is the underlying etcd client, for callers that need more.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Embedded reports whether this Store runs an etcd member.
func (s *Store) Embedded() bool { return s.etcd != nil }

func (s *Store) key(parts ...string) string { return s.prefix + strings.Join(parts, "/") }
