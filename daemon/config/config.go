package config

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Config is a whole site configuration.
type Config struct {
	// File is the path the configuration was loaded from (set by Load and
	// used as the prefix of validation problems); not part of the YAML.
	File string `mapstructure:"-" json:"-"`

	// Cluster is the cluster's name; it appears in NQNs and etcd keys.
	Cluster string `mapstructure:"cluster" json:"cluster"`
	// Workdir is a directory for state and, on test sites, drive files.
	// ${VAR} references are expanded from the environment; drive paths
	// may refer to it as ${workdir}.
	Workdir string `mapstructure:"workdir" json:"workdir,omitempty"`

	Nodes  []Node  `mapstructure:"nodes" json:"nodes"`
	Arrays []Array `mapstructure:"arrays" json:"arrays"`
	// Volumes are the volumes carved from the arrays, as exported from a
	// live cluster (volumes.go); none: each array serves one volume
	// spanning it until volumes are created online.
	Volumes      []Volume     `mapstructure:"volumes" json:"volumes,omitempty"`
	Placement    Placement    `mapstructure:"placement" json:"placement"`
	Fabrics      Fabrics      `mapstructure:"fabrics" json:"fabrics"`
	ControlPlane ControlPlane `mapstructure:"control_plane" json:"control_plane"`
	Policies     Policies     `mapstructure:"policies" json:"policies"`
	Slurm        Slurm        `mapstructure:"slurm" json:"slurm"`
	GDS          GDS          `mapstructure:"gds" json:"gds"`
	// Model is the performance model of a local site (model.go).
	Model PerfModel `mapstructure:"model" json:"model,omitempty"`
}

// Node is one machine running tier0d.
type Node struct {
	// Name is the node's short name (A, B, ...; unique).
	Name string `mapstructure:"name" json:"name"`
	// Domain is the failure domain (rack, PDU, switch) for placement.
	Domain string `mapstructure:"domain" json:"domain,omitempty"`
	// Address is the default host address of every listener below that
	// does not set its own.
	Address string `mapstructure:"address" json:"address,omitempty"`
	// Backend is where the node exports its local drives to the others.
	Backend Endpoint `mapstructure:"backend" json:"backend"`
	// Frontend is where the node serves arrays to hosts.
	Frontend Endpoint `mapstructure:"frontend" json:"frontend"`
	// API is the management HTTP API (and metrics).
	API Endpoint `mapstructure:"api" json:"api"`
	// Etcd holds this node's embedded etcd ports, used when the node is
	// one of control_plane.etcd.peers; zero ports take the cluster-wide
	// defaults.
	Etcd EtcdPorts `mapstructure:"etcd" json:"etcd"`
	// Drives are the node's local NVMe drives.
	Drives []Drive `mapstructure:"drives" json:"drives"`
	// Link is the node's modelled network link (model.go; nil: none).
	Link *Link `mapstructure:"link" json:"link,omitempty"`
}

// Endpoint is one listener.
type Endpoint struct {
	// Addr is the address to listen on; empty means the node's Address.
	Addr string `mapstructure:"addr" json:"addr,omitempty"`
	// Port is the TCP port.
	Port int `mapstructure:"port" json:"port"`
	// Advertise is the address others should connect to; empty means
	// Addr (which then must not be a wildcard address).
	Advertise string `mapstructure:"advertise" json:"advertise,omitempty"`
}

// EtcdPorts are one node's embedded etcd ports.
type EtcdPorts struct {
	ClientPort int `mapstructure:"client_port" json:"client_port,omitempty"`
	PeerPort   int `mapstructure:"peer_port" json:"peer_port,omitempty"`
}

// Drive is a local drive reference. Exactly one of Path, ByID and Serial
// identifies it (package discover resolves ByID and Serial on the node).
type Drive struct {
	// Name is the drive's cluster-wide unique name (B1, ...).
	Name string `mapstructure:"name" json:"name"`
	// Path is a device node, a /dev/disk/by-id link, or a regular file.
	Path string `mapstructure:"path" json:"path,omitempty"`
	// ByID is a /dev/disk/by-id name (with or without the directory).
	ByID string `mapstructure:"by_id" json:"by_id,omitempty"`
	// Serial is the NVMe controller's serial number.
	Serial string `mapstructure:"serial" json:"serial,omitempty"`
	// Size is the size of a file-backed drive, created if missing
	// ("64MiB", "1GiB" or a byte count); 0 for real devices.
	Size Size `mapstructure:"size" json:"size,omitempty"`
	// Model is the drive's performance model (model.go; nil: none).
	Model *DriveModel `mapstructure:"model" json:"model,omitempty"`
}

// Array is one RAID array served as a cluster-wide namespace.
type Array struct {
	Name string `mapstructure:"name" json:"name"`
	// Level is raid5 or raid6 (raid0 and raid1 are refused: the failover
	// machine does not run them).
	Level string `mapstructure:"level" json:"level"`
	// ChunkKiB is the chunk (strip) size in KiB: a power of two from 4
	// to 4096. Default 128.
	ChunkKiB int `mapstructure:"chunk_kib" json:"chunk_kib"`
	// Home is the node that owns the array when it is healthy.
	Home string `mapstructure:"home" json:"home"`
	// Members lists drive names in RAID order, or is the single word
	// "auto" in the YAML (then Auto is true and Load fills Members in).
	Members []string `mapstructure:"-" json:"members"`
	// Auto is true when the members were placed automatically.
	Auto bool `mapstructure:"-" json:"auto"`
	// Width is the member count for auto placement; it defaults to
	// nodes-1. For explicit members it must be 0 or len(Members).
	Width int `mapstructure:"width" json:"width"`
	// RawMembers is the members value as written (string or list).
	RawMembers any `mapstructure:"members" json:"-"`
	// HomeMember allows one explicit member on the home node (default
	// false): the array then needs one node fewer, but the loss of its
	// home node leaves it degraded where it is taken over, not complete.
	// For clusters too small for the rule (three nodes and a RAID-5), such
	// as test/rdma's guest cluster.
	HomeMember bool `mapstructure:"home_member" json:"home_member,omitempty"`
}

// Placement tunes automatic placement.
type Placement struct {
	// Domains is "none" (default; failure domains are ignored), "distinct"
	// (an array's members sit in distinct domains) or "survive" (at most
	// as many members per domain as the level's parity count, so that
	// losing a whole domain leaves every array readable).
	Domains string `mapstructure:"domains" json:"domains"`
}

// Fabrics configures both fabrics (NVMe/TCP or NVMe/RDMA each).
type Fabrics struct {
	// NQNPrefix is the prefix of every subsystem NQN tier0 creates,
	// e.g. nqn.2026-11.io.tier0 (then nqn.2026-11.io.tier0:CLUSTER:array-a).
	NQNPrefix string `mapstructure:"nqn_prefix" json:"nqn_prefix"`
	Backend   Fabric `mapstructure:"backend" json:"backend"`
	Frontend  Fabric `mapstructure:"frontend" json:"frontend"`
}

// Fabric is the NVMe-oF settings of one fabric.
type Fabric struct {
	// Transport is "tcp" (default) or "rdma": the fabric's targets serve
	// NVMe/RDMA on the fabric's address and port (beside NVMe/TCP, which
	// has its own port space), and on the backend the nodes import
	// members over it. rdma needs a tier0d built with -tags rdma
	// (docs/RDMA.md).
	Transport string `mapstructure:"transport" json:"transport"`
	// HeaderDigest and DataDigest enable CRC32C digests (NVMe/TCP only).
	HeaderDigest bool `mapstructure:"header_digest" json:"header_digest"`
	DataDigest   bool `mapstructure:"data_digest" json:"data_digest"`
	// Queues is the number of I/O queues per connection (default 4).
	Queues int `mapstructure:"queues" json:"queues"`
	// QueueDepth is the depth of each I/O queue (default 128).
	QueueDepth int `mapstructure:"queue_depth" json:"queue_depth"`
	// AllowHosts lists host NQNs allowed to connect; empty allows any
	// (on the backend, the cluster's own nodes are always allowed).
	AllowHosts []string `mapstructure:"allow_hosts" json:"allow_hosts,omitempty"`
	// DHCHAPSecret turns on NVMe in-band authentication (DH-HMAC-CHAP):
	// every host must prove it knows this secret ("DHHC-1:..:" as
	// `nvme gen-dhchap-key` prints it, or "file:PATH" to a file holding
	// it). On the backend the nodes themselves use it as hosts.
	DHCHAPSecret string `mapstructure:"dhchap_secret" json:"-"`
	// DHCHAPCtrlSecret makes the authentication bidirectional: the
	// controller proves it knows this secret too.
	DHCHAPCtrlSecret string `mapstructure:"dhchap_ctrl_secret" json:"-"`
	// ConnectTimeout bounds the fabric's targets' wait from a host's
	// connection to its finished Connect (and authentication); a host
	// that takes longer is disconnected (default 10s). Raised for
	// emulated machines, where a Connect can take seconds.
	ConnectTimeout Duration `mapstructure:"connect_timeout" json:"connect_timeout"`
}

// Secret resolves a secret setting: "file:PATH" reads the file (trimmed);
// anything else is the secret itself.
func Secret(v string) (string, error) {
	p, ok := strings.CutPrefix(v, "file:")
	if !ok {
		return v, nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("secret file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// ControlPlane says where cluster state lives.
type ControlPlane struct {
	Etcd Etcd `mapstructure:"etcd" json:"etcd"`
}

// Etcd is either embedded (Peers non-empty) or external (Endpoints).
type Etcd struct {
	// Peers are the names of the nodes that run a voting embedded etcd
	// member (an odd number: 1, 3 or 5).
	Peers []string `mapstructure:"peers" json:"peers,omitempty"`
	// ClientPort and PeerPort are the default embedded ports (2379, 2380).
	ClientPort int `mapstructure:"client_port" json:"client_port"`
	PeerPort   int `mapstructure:"peer_port" json:"peer_port"`
	// Endpoints are client URLs of an existing etcd cluster.
	Endpoints []string `mapstructure:"endpoints" json:"endpoints,omitempty"`
	// DataDir is where embedded members keep their data; relative paths
	// are under Workdir. Default "etcd".
	DataDir string `mapstructure:"data_dir" json:"data_dir"`
	// Tick and Election tune the embedded members' raft: the heartbeat
	// interval (default 50ms) and the election timeout (default 10 ×
	// Tick). A lost leader costs up to 2 × Election of renewals, so
	// Election must stay well inside policies.lease_ttl (validated:
	// 3 × Election at most). Raised for emulated machines, where an idle
	// member's heartbeats cost CPU the renewals need.
	Tick     Duration `mapstructure:"tick" json:"tick"`
	Election Duration `mapstructure:"election" json:"election"`
}

// Policies are cluster-wide behaviour settings.
type Policies struct {
	// Failback is "auto" (default) or "manual".
	Failback string `mapstructure:"failback" json:"failback"`
	// RebuildRateMiBs caps rebuild bandwidth per array (default 500).
	RebuildRateMiBs int `mapstructure:"rebuild_rate_mibs" json:"rebuild_rate_mibs"`
	// RebuildAdaptive lowers the rebuild rate while foreground I/O is
	// busy (default true).
	RebuildAdaptive *bool `mapstructure:"rebuild_adaptive" json:"rebuild_adaptive"`
	// LeaseTTL is the node liveness lease (default 5s).
	LeaseTTL Duration `mapstructure:"lease_ttl" json:"lease_ttl"`
	// MemberIOTimeout bounds one member request (default 5s).
	MemberIOTimeout Duration `mapstructure:"member_io_timeout" json:"member_io_timeout"`
	// MemberSlowRead is the deadline after which a RAID-5/6 read of a
	// member that has not answered is served by reconstruction from the
	// other members (raid.Policy.SlowRead; at least 4 × the other
	// members' mean request time). Default 20ms.
	MemberSlowRead Duration `mapstructure:"member_slow_read" json:"member_slow_read"`
	// MemberSlowWrite is the deadline after which a RAID-5/6 member write
	// (or flush) that has not completed is written around: the member is
	// made missing (resynced when it answers) and the write completes
	// degraded, while the array keeps its redundancy without the member
	// (raid.Policy.SlowWrite; at least 4 × the other members' mean
	// request time). Off (0) by default: a false positive under a
	// loaded or deep-queued member makes a healthy member missing (a
	// resync), and a second member hanging then fails a RAID-5 array;
	// set it (e.g. 50ms on flash) where members answer steadily. Below
	// member_io_timeout.
	MemberSlowWrite Duration `mapstructure:"member_slow_write" json:"member_slow_write"`
	// MemberIORetries is how often a failed member request is retried
	// before the member is failed (default 2).
	MemberIORetries *int `mapstructure:"member_io_retries" json:"member_io_retries"`
	// ScrubInterval is how often each array's owner scrubs it (checks
	// every stripe's parity, reporting mismatches); 0 (default) scrubs
	// only on `tier0 array scrub`.
	ScrubInterval Duration `mapstructure:"scrub_interval" json:"scrub_interval,omitempty"`
	// HousekeepingInterval is the period of a node's housekeeping: the
	// delivery of reports the store missed, each owned array's observed
	// state and metrics, the bitmap sweep (every 3rd period) and the
	// retry of failed arrays (every 5th). Default 1s.
	HousekeepingInterval Duration `mapstructure:"housekeeping_interval" json:"housekeeping_interval"`
}

// Slurm configures the Slurm integration.
type Slurm struct {
	Enabled bool `mapstructure:"enabled" json:"enabled"`
	// Scontrol is the scontrol binary (default "scontrol" from PATH).
	Scontrol string `mapstructure:"scontrol" json:"scontrol"`
	// Conf is slurm.conf when it is not in Slurm's default place (passed
	// to scontrol as SLURM_CONF; default: tier0d's own environment).
	Conf string `mapstructure:"conf" json:"conf,omitempty"`
	// Nodes maps tier0 node names to Slurm node names where they differ.
	Nodes []SlurmNode `mapstructure:"nodes" json:"nodes,omitempty"`
}

// SlurmNode maps one tier0 node to its Slurm node name.
type SlurmNode struct {
	Node  string `mapstructure:"node" json:"node"`
	Slurm string `mapstructure:"slurm" json:"slurm"`
}

// GDS configures the GPUDirect Storage validator.
type GDS struct {
	Enabled bool `mapstructure:"enabled" json:"enabled"`
	// CuFileJSON is the cufile.json to use (default: cuFile's own search).
	CuFileJSON string `mapstructure:"cufile_json" json:"cufile_json,omitempty"`
	// Mount is a file system path on a tier0 array used for validation.
	Mount string `mapstructure:"mount" json:"mount,omitempty"`
}

// Levels of Array.Level: a site file's arrays are raid5 or raid6, the
// levels the failover machine runs; raid0 and raid1 (levels of the RAID
// engine) are refused by validation, with that reason.
const (
	RAID0 = "raid0"
	RAID1 = "raid1"
	RAID5 = "raid5"
	RAID6 = "raid6"
)

// Parity is the number of member losses the level survives (raid1: width-1).
func (a *Array) Parity() int {
	switch a.Level {
	case RAID1:
		return max(len(a.Members), a.Width) - 1
	case RAID5:
		return 1
	case RAID6:
		return 2
	}
	return 0
}

// Default values filled in by Load.
const (
	DefaultChunkKiB        = 128
	DefaultEtcdClientPort  = 2379
	DefaultEtcdPeerPort    = 2380
	DefaultQueues          = 4
	DefaultQueueDepth      = 128
	DefaultNQNPrefix       = "nqn.2026-11.io.tier0"
	DefaultRebuildRateMiBs = 500
	DefaultLeaseTTL        = 5 * time.Second
	DefaultMemberIOTimeout = 5 * time.Second
	// DefaultMemberSlowRead: well above a flash read's latency (0.1 ms,
	// a few ms at p99.9 under load), so only a stalled or dead member is
	// read around, and a fifth of issue 15's 100 ms stall goal, which
	// leaves the rest for the reconstruction.
	DefaultMemberSlowRead = 20 * time.Millisecond
	// DefaultMemberSlowWrite: off until the deadline has been proven on
	// loaded machines (docs/RAID.md, "Writes around a member that stops
	// answering"); 50ms is the suggested value on flash members (half of
	// issue 15's 100 ms stall goal).
	DefaultMemberSlowWrite time.Duration = 0
	DefaultMemberIORetries               = 2
	DefaultEtcdTick                      = 50 * time.Millisecond
	DefaultHousekeeping                  = time.Second
	DefaultConnectTimeout                = 10 * time.Second
)

// The fabric transports (Fabric.Transport).
const (
	TransportTCP  = "tcp"
	TransportRDMA = "rdma"
)

// Size is a byte count written as a number or with a unit (KiB, MiB, GiB,
// TiB, or K/M/G/T meaning the same binary units).
type Size int64

// String formats s with the largest binary unit that divides it.
func (s Size) String() string {
	units := []string{"TiB", "GiB", "MiB", "KiB"}
	for i, u := range units {
		m := int64(1) << (10 * (4 - i))
		if s != 0 && int64(s)%m == 0 {
			return strconv.FormatInt(int64(s)/m, 10) + u
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// Duration is a time.Duration written like "5s" or "250ms".
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText lets JSON print "5s" rather than nanoseconds.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// ListenAddr is the host:port the endpoint listens on.
func (n *Node) ListenAddr(e Endpoint) string {
	return net.JoinHostPort(n.hostOf(e), strconv.Itoa(e.Port))
}

// AdvertiseAddr is the host:port others connect to.
func (n *Node) AdvertiseAddr(e Endpoint) string {
	h := e.Advertise
	if h == "" {
		h = n.hostOf(e)
	}
	return net.JoinHostPort(h, strconv.Itoa(e.Port))
}

func (n *Node) hostOf(e Endpoint) string {
	if e.Addr != "" {
		return e.Addr
	}
	return n.Address
}

// Node returns the node with the given name.
func (c *Config) Node(name string) (*Node, bool) {
	for i := range c.Nodes {
		if c.Nodes[i].Name == name {
			return &c.Nodes[i], true
		}
	}
	return nil, false
}

// Drive returns the drive with the given name and the node it is on.
func (c *Config) Drive(name string) (*Node, *Drive, bool) {
	for i := range c.Nodes {
		for j := range c.Nodes[i].Drives {
			if c.Nodes[i].Drives[j].Name == name {
				return &c.Nodes[i], &c.Nodes[i].Drives[j], true
			}
		}
	}
	return nil, nil, false
}

// Array returns the array with the given name.
func (c *Config) Array(name string) (*Array, bool) {
	for i := range c.Arrays {
		if c.Arrays[i].Name == name {
			return &c.Arrays[i], true
		}
	}
	return nil, false
}

// EtcdPeer is one embedded etcd member, resolved.
type EtcdPeer struct {
	Node       string `json:"node"`
	ClientURL  string `json:"client_url"`
	PeerURL    string `json:"peer_url"`
	ListenHost string `json:"listen_host"`
}

// EtcdPeers resolves control_plane.etcd.peers to URLs: each peer node's
// API address (advertised) with its own or the default etcd ports.
func (c *Config) EtcdPeers() []EtcdPeer {
	var out []EtcdPeer
	for _, name := range c.ControlPlane.Etcd.Peers {
		n, ok := c.Node(name)
		if !ok {
			continue
		}
		cp, pp := c.etcdPorts(n)
		adv := n.API.Advertise
		if adv == "" {
			adv = n.hostOf(n.API)
		}
		out = append(out, EtcdPeer{
			Node:       name,
			ClientURL:  "http://" + net.JoinHostPort(adv, strconv.Itoa(cp)),
			PeerURL:    "http://" + net.JoinHostPort(adv, strconv.Itoa(pp)),
			ListenHost: n.hostOf(n.API),
		})
	}
	return out
}

func (c *Config) etcdPorts(n *Node) (client, peer int) {
	client, peer = n.Etcd.ClientPort, n.Etcd.PeerPort
	if client == 0 {
		client = c.ControlPlane.Etcd.ClientPort
	}
	if peer == 0 {
		peer = c.ControlPlane.Etcd.PeerPort
	}
	return client, peer
}

// SlurmName returns the Slurm node name of a tier0 node (its own name
// unless slurm.nodes maps it).
func (c *Config) SlurmName(node string) string {
	for _, m := range c.Slurm.Nodes {
		if m.Node == node {
			return m.Slurm
		}
	}
	return node
}

// SubsystemNQN is the NQN under which the array is served on the frontend.
func (c *Config) SubsystemNQN(array string) string {
	return fmt.Sprintf("%s:%s:array-%s", c.Fabrics.NQNPrefix, c.Cluster, strings.ToLower(array))
}

// DriveNQN is the NQN under which a node exports one local drive on the
// backend fabric.
func (c *Config) DriveNQN(drive string) string {
	return fmt.Sprintf("%s:%s:drive-%s", c.Fabrics.NQNPrefix, c.Cluster, strings.ToLower(drive))
}

// DriveShares returns, in configuration order, the arrays that use the
// drive as a member. A drive used by k arrays is split into k equal
// extents and the i-th array listed here uses extent i. Automatic placement
// shares drives only when the arrays need more member slots than there are
// drives.
func (c *Config) DriveShares(drive string) []string {
	var out []string
	for _, a := range c.Arrays {
		for _, m := range a.Members {
			if m == drive {
				out = append(out, a.Name)
			}
		}
	}
	return out
}

// NVMe controller IDs. Every node's frontend serves every array's
// subsystem, so the controller IDs one node hands out must never collide
// with another's: the node at position i of nodes gets
// [1+i*CntlIDsPerNode, 1+(i+1)*CntlIDsPerNode). A controller ID is 16 bits
// and 0xFFF0-0xFFFF are reserved (0xFFEF is the largest valid one), so a
// site has at most MaxNodes nodes; validation refuses more.
const (
	CntlIDsPerNode = 256
	maxCntlID      = 0xFFEF
	MaxNodes       = maxCntlID / CntlIDsPerNode // 255
)

// CntlIDRange is the controller ID range [base, base+count) of the node at
// position index of nodes (0 <= index < MaxNodes).
func CntlIDRange(index int) (base, count uint16) {
	if index < 0 || index >= MaxNodes {
		panic(fmt.Sprintf("config: node index %d outside 0..%d (validation admits at most %d nodes)", index, MaxNodes-1, MaxNodes))
	}
	return uint16(1 + index*CntlIDsPerNode), CntlIDsPerNode
}
