package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/daemon/rdma"
	"tier0/internal/units"
)

// fabric io: read, write and verify a range of an NVMe/TCP namespace with
// tier0's own initiator (package daemon/host).

// fabricIOOptions are the flags of fabric io.
type fabricIOOptions struct {
	connect, nqn, hostNQN, hostID string
	transport                     string // tcp (default) or rdma
	nsid                          uint32
	write, read, verify           bool
	offset, length, block         string
	seed                          uint64
	queues, depth, parallel       int
	hdgst, ddgst                  bool
	timeout                       time.Duration
	dhchapSecret, dhchapCtrl      string
	json                          bool // the root's --json, set when the command runs
}

func (o *fabricIOOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.connect, "connect", "", "controller address HOST:PORT (required)")
	f.StringVar(&o.nqn, "nqn", "", "subsystem NQN (required)")
	f.StringVar(&o.transport, "transport", "tcp", "fabric transport: tcp or rdma (rdma needs a binary built with -tags rdma, see docs/RDMA.md)")
	f.Uint32Var(&o.nsid, "nsid", 1, "namespace ID")
	f.BoolVar(&o.write, "write", false, "write the pattern to the range")
	f.BoolVar(&o.read, "read", false, "read the range")
	f.StringVar(&o.dhchapSecret, "dhchap-secret", "", "this host's DH-HMAC-CHAP secret DHHC-1:..: (or file:PATH), used when the target asks")
	f.StringVar(&o.dhchapCtrl, "dhchap-ctrl-secret", "", "the controller's secret, to authenticate the target too (bidirectional)")
	f.BoolVar(&o.verify, "verify", false, "read the range and compare it with the pattern")
	f.StringVar(&o.offset, "offset", "0", "start byte offset (K/M/G suffixes)")
	f.StringVar(&o.length, "length", "1M", "bytes to transfer (K/M/G suffixes; 0 = to the end of the namespace)")
	f.StringVar(&o.block, "block", "1M", "bytes per I/O")
	f.Uint64Var(&o.seed, "pattern", 1, "pattern seed for --write and --verify")
	f.IntVar(&o.queues, "queues", 2, "I/O queues (connections)")
	f.IntVar(&o.depth, "depth", 64, "queue depth per I/O queue")
	f.IntVar(&o.parallel, "parallel", 8, "I/Os in flight")
	f.BoolVar(&o.hdgst, "hdgst", false, "enable header digests")
	f.BoolVar(&o.ddgst, "ddgst", false, "enable data digests")
	f.StringVar(&o.hostNQN, "hostnqn", "", "host NQN (default derived from the host ID)")
	f.StringVar(&o.hostID, "hostid", "", "host ID, a UUID (default random; reservations are keyed by it)")
	f.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
}

func newFabricIOCmd(root *rootOptions) *cobra.Command {
	o := &fabricIOOptions{}
	cmd := &cobra.Command{
		Use:   "io --connect ADDR:PORT --nqn NQN (--write|--read|--verify) [--offset N] [--length N] [--pattern SEED]",
		Short: "Read, write or verify a range of an NVMe/TCP namespace with tier0's initiator",
		Long: `Connects to an NVMe/TCP controller with tier0's own initiator and reads,
writes or verifies a byte range of one namespace.

--write fills the range with a pattern derived from --pattern SEED and the
absolute byte offset, so any sub-range can be verified later with the same
seed; --verify reads the range and compares it with that pattern; --read only
reads (and reports the throughput). Sizes accept K, M, G suffixes (powers of
1024). Exit status: 0 success, 1 error, 2 verify mismatch.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.json = root.json
			return runFabricIO(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// fillPattern fills p with the pattern of seed at absolute byte offset off
// (a multiple of 8): each 8-byte word is splitmix64(seed, word index).
func fillPattern(p []byte, off int64, seed uint64) {
	w := uint64(off / 8)
	for i := 0; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], mix64(seed*0x9E3779B97F4A7C15+w))
		w++
	}
}

func mix64(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

type verifyError struct {
	off int64
}

func (e *verifyError) Error() string {
	return fmt.Sprintf("verify failed: first differing byte at offset %d (wrong --pattern seed, or the data changed)", e.off)
}
func (e *verifyError) ExitCode() int { return 2 }

type fabricIOResult struct {
	Op       string  `json:"op"`
	Addr     string  `json:"addr"`
	NQN      string  `json:"nqn"`
	NSID     uint32  `json:"nsid"`
	Offset   int64   `json:"offset"`
	Length   int64   `json:"length"`
	Seconds  float64 `json:"seconds"`
	MiBps    float64 `json:"mib_per_s"`
	Verified bool    `json:"verified"`
}

func runFabricIO(ctx context.Context, o *fabricIOOptions, stdout io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if o.connect == "" || o.nqn == "" {
		return errors.New("fabric io: --connect HOST:PORT and --nqn NQN are required")
	}
	n := 0
	op := ""
	for name, on := range map[string]bool{"write": o.write, "read": o.read, "verify": o.verify} {
		if on {
			n++
			op = name
		}
	}
	if n != 1 {
		return errors.New("fabric io: give exactly one of --write, --read, --verify")
	}
	off, err := units.ParseBytes(o.offset)
	if err != nil {
		return fmt.Errorf("--offset: %w", err)
	}
	length, err := units.ParseBytes(o.length)
	if err != nil {
		return fmt.Errorf("--length: %w", err)
	}
	bsz, err := units.ParseBytes(o.block)
	if err != nil || bsz == 0 {
		return fmt.Errorf("--block %q: want a positive size such as 128K", o.block)
	}
	if o.parallel < 1 {
		o.parallel = 1
	}
	hopts := host.Options{SubNQN: o.nqn, HostNQN: o.hostNQN, IOQueues: o.queues, QueueDepth: o.depth,
		HeaderDigest: o.hdgst, DataDigest: o.ddgst, CtrlLossTimeout: -1}
	if hopts.DHCHAPSecret, err = dhchapSecretArg("dhchap-secret", o.dhchapSecret); err != nil {
		return err
	}
	if hopts.DHCHAPCtrlSecret, err = dhchapSecretArg("dhchap-ctrl-secret", o.dhchapCtrl); err != nil {
		return err
	}
	if o.hostID != "" {
		u, err := uuid.Parse(o.hostID)
		if err != nil {
			return fmt.Errorf("--hostid %q: want a UUID: %w", o.hostID, err)
		}
		hopts.HostID = u
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var ns blockdev.Device
	switch o.transport {
	case "", "tcp":
		c, err := host.Dial(ctx, o.connect, hopts)
		if err != nil {
			return err
		}
		defer c.Close()
		if ns, err = c.Namespace(o.nsid); err != nil {
			return err
		}
	case "rdma":
		if o.hdgst || o.ddgst || hopts.DHCHAPSecret != "" {
			return errors.New("fabric io: --hdgst, --ddgst and --dhchap-secret are NVMe/TCP options; the RDMA transport has no digests and no in-band authentication yet")
		}
		c, err := rdma.Connect(ctx, o.connect, rdma.Options{SubNQN: o.nqn, HostNQN: o.hostNQN, HostID: hopts.HostID, IOQueues: o.queues, QueueDepth: o.depth})
		if err != nil {
			return err
		}
		defer c.Close()
		if ns, err = c.Namespace(o.nsid); err != nil {
			return err
		}
	default:
		return fmt.Errorf("fabric io: --transport %q: want tcp or rdma", o.transport)
	}
	if length == 0 {
		length = ns.Size() - off
	}
	if err := blockdev.CheckRange(off, length, ns.Size(), ns.BlockSize()); err != nil {
		return fmt.Errorf("range --offset %d --length %d on a %d-byte namespace with %d-byte blocks: %w", off, length, ns.Size(), ns.BlockSize(), err)
	}
	bsz = max(bsz/int64(ns.BlockSize())*int64(ns.BlockSize()), int64(ns.BlockSize()))

	start := time.Now()
	type chunk struct{ off, n int64 }
	work := make(chan chunk)
	var mu sync.Mutex
	var firstErr error
	mismatch := int64(-1)
	var wg sync.WaitGroup
	for i := 0; i < o.parallel; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := blockdev.AlignedBuffer(int(bsz))
			want := make([]byte, bsz)
			for ch := range work {
				p := buf[:ch.n]
				var err error
				switch op {
				case "write":
					fillPattern(p, ch.off, o.seed)
					_, err = ns.WriteAt(p, ch.off)
				default:
					_, err = ns.ReadAt(p, ch.off)
					if err == nil && op == "verify" {
						w := want[:ch.n]
						fillPattern(w, ch.off, o.seed)
						for k := range p {
							if p[k] != w[k] {
								mu.Lock()
								if mismatch < 0 || ch.off+int64(k) < mismatch {
									mismatch = ch.off + int64(k)
								}
								mu.Unlock()
								break
							}
						}
					}
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for p := off; p < off+length; p += bsz {
		select {
		case work <- chunk{p, min(bsz, off+length-p)}:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = fmt.Errorf("fabric io: stopped after --timeout %v: %w", o.timeout, ctx.Err())
	}
	if firstErr == nil && op == "write" {
		firstErr = ns.Flush()
	}
	if firstErr != nil {
		return firstErr
	}
	el := time.Since(start).Seconds()
	res := fabricIOResult{Op: op, Addr: o.connect, NQN: o.nqn, NSID: o.nsid, Offset: off, Length: length, Seconds: el,
		MiBps: float64(length) / (1 << 20) / el, Verified: op == "verify" && mismatch < 0}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "%s %d bytes at offset %d of %s nsid %d (%s): %.3f s, %.1f MiB/s", op, length, off, o.nqn, o.nsid, o.connect, el, res.MiBps)
		if op == "verify" && mismatch < 0 {
			fmt.Fprint(stdout, ", verified")
		}
		fmt.Fprintln(stdout)
	}
	if mismatch >= 0 {
		return &verifyError{off: mismatch}
	}
	return nil
}
