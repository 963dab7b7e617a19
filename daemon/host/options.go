package host

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"time"

	"tier0/daemon/clock"
	"tier0/daemon/transport"
)

// Options configure a controller connection. Zero values take the defaults
// named on each field.
type Options struct {
	SubNQN  string   // subsystem to connect to (required)
	HostNQN string   // this host's NQN (default: derived from HostID)
	HostID  [16]byte // this host's ID; reservations are keyed by it (default: random)
	// IOQueues is the number of I/O queues (connections), default
	// min(4, GOMAXPROCS); 0 I/O queues is allowed only for discovery.
	IOQueues int
	// QueueDepth is the number of commands in flight per I/O queue
	// (default 128).
	QueueDepth   int
	HeaderDigest bool // CRC32C header digests
	DataDigest   bool // CRC32C data digests
	// KATO is the keep-alive timeout given to the controller (default 10 s);
	// the host sends Keep Alive every KATO/2. Negative disables keep-alive.
	KATO time.Duration
	// IOTimeout: a command outstanding longer than this tears the
	// connection down and the command fails with blockdev.ErrTimeout
	// (default 30 s).
	IOTimeout time.Duration
	// DialTimeout bounds one connection attempt (default 5 s).
	DialTimeout time.Duration
	// ReconnectDelay is the first delay between reconnection attempts after
	// a lost connection; it doubles up to maxReconnectDelay, 5 s (default
	// 100 ms). The delays run on Clock.
	ReconnectDelay time.Duration
	// CtrlLossTimeout: after a connection loss, I/O waits for a reconnect
	// this long, then fails; the controller keeps trying to reconnect in
	// the background (default 10 s). Negative: fail at once.
	CtrlLossTimeout time.Duration
	// FailFast is for callers with redundancy of their own (a RAID
	// array's members): the I/O of its namespaces never waits for a
	// reconnect. While the controller is down a command fails at once,
	// and a write whose connection was lost under it fails at once too
	// instead of being resubmitted after the lost association quiesced;
	// both errors are path errors (IsPathError), so the array writes
	// degraded and resyncs the member later. The controller then installs
	// its next association only after the lost one is quiesced (KATO +
	// CQT, see waitQuiesced), so nothing written on the new one can be
	// overtaken by an abandoned write of the old.
	FailFast bool
	// OneIncarnation is for a RAID array's members too: a reconnect that
	// finds the target's node restarted (its boot incarnation in Identify
	// Controller changed, both known: nvme.IncarnationOff) is not taken.
	// The drive's volatile cache may have been lost with the node, so
	// writes completed on the earlier connection may be gone, and a
	// connection made to one incarnation does not go on in the next
	// (raid.Incarnated). The controller then stops reconnecting and its
	// I/O fails as a path error: the array takes the member as missing,
	// and the owner's re-add imports it afresh and catches it up.
	OneIncarnation bool
	// Logger receives connection events (default: discard).
	Logger *slog.Logger
	// Dialer opens TCP connections (default net.Dialer).
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// Transport connects the queues of every association; nil is NVMe/TCP
	// over Dialer (with HeaderDigest and DataDigest). NVMe/RDMA is
	// rdma.Transport (daemon/rdma, built with the rdma tag). The Fabrics
	// Connect, DH-HMAC-CHAP, keep-alive, events, the I/O timeout,
	// reconnect and the incarnation check are the same over each.
	Transport transport.Transport
	// DHCHAPSecret is this host's DH-HMAC-CHAP secret (DHHC-1:..., see
	// auth.go); used on every queue whose Connect response asks for
	// authentication. DHCHAPCtrlSecret, when set, makes the controller
	// prove its own secret too (bidirectional).
	DHCHAPSecret     string
	DHCHAPCtrlSecret string
	// OnAEN is called (from the controller's event goroutine) for every
	// asynchronous event, after the host handled it itself (e.g. re-read the
	// ANA log).
	OnAEN func(AEN)
	// Clock is the controller's time: the command quiesce wait (see
	// docs/FABRIC.md, "Command lifetime"), the reconnect backoff, the
	// keep-alive ticker and the controller-loss wait (CtrlLossTimeout);
	// default clock.Real. Tests inject a fake. The per-command I/O timeout
	// and its supervisor, and socket deadlines, stay on the wall clock
	// (docs/ARCHITECTURE.md, "Time").
	Clock clock.Clock
}

// maxReconnectDelay bounds the doubling of ReconnectDelay.
const maxReconnectDelay = 5 * time.Second

func (o *Options) setDefaults() {
	if o.HostID == ([16]byte{}) {
		o.HostID = randomUUID()
	}
	if o.HostNQN == "" {
		o.HostNQN = "nqn.2014-08.org.nvmexpress:uuid:" + uuidString(o.HostID)
	}
	if o.IOQueues == 0 {
		o.IOQueues = min(4, runtime.GOMAXPROCS(0))
	}
	if o.IOQueues < 0 {
		o.IOQueues = 0
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = 128
	}
	if o.QueueDepth > 1024 {
		o.QueueDepth = 1024
	}
	if o.KATO == 0 {
		o.KATO = 10 * time.Second
	}
	if o.IOTimeout <= 0 {
		o.IOTimeout = 30 * time.Second
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.ReconnectDelay <= 0 {
		o.ReconnectDelay = 100 * time.Millisecond
	}
	if o.CtrlLossTimeout == 0 {
		o.CtrlLossTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Dialer == nil {
		d := &net.Dialer{}
		o.Dialer = d.DialContext
	}
	o.Clock = clock.Or(o.Clock)
}
