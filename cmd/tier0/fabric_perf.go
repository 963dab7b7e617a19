package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/bench/perf"
	"tier0/daemon/host"
	"tier0/internal/units"
)

// fabric perf: a closed-loop benchmark of one NVMe/TCP namespace with
// tier0's own initiator (package bench/perf over daemon/host), for any
// target: tier0's, Linux nvmet, SPDK. Usage in docs/PERFORMANCE.md.

// fabricPerfOptions are the flags of fabric perf.
type fabricPerfOptions struct {
	connect, nqn, hostNQN    string
	nsid                     uint32
	workload, bs, region     string
	qd, cores, queues        int
	duration                 time.Duration
	dhchapSecret, dhchapCtrl string
	cpuProfile               string
	hdgst, ddgst             bool
	json                     bool // the root's --json, set when the command runs
}

// fabricPerfResult is what --json prints.
type fabricPerfResult struct {
	Addr   string `json:"addr"`
	NQN    string `json:"nqn"`
	NSID   uint32 `json:"nsid"`
	Cores  int    `json:"cores"`
	Queues int    `json:"io_queues"`
	perf.Result
}

func (o *fabricPerfOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.connect, "connect", "", "controller address HOST:PORT (required)")
	f.StringVar(&o.nqn, "nqn", "", "subsystem NQN (required)")
	f.Uint32Var(&o.nsid, "nsid", 1, "namespace ID")
	f.StringVar(&o.workload, "workload", "randread", "randread, randwrite, read or write")
	f.StringVar(&o.bs, "bs", "4k", "bytes per I/O (K/M suffixes)")
	f.IntVar(&o.qd, "qd", 32, "I/Os in flight in total")
	f.DurationVar(&o.duration, "time", 10*time.Second, "how long to run")
	f.StringVar(&o.region, "region", "0", "use only the first SIZE bytes of the namespace (0: all of it)")
	f.IntVar(&o.cores, "cores", 1, "cores for the client (GOMAXPROCS) and I/O queues (connections)")
	f.IntVar(&o.queues, "queues", 0, "I/O queues, if not one per core")
	f.BoolVar(&o.hdgst, "hdgst", false, "enable header digests")
	f.BoolVar(&o.ddgst, "ddgst", false, "enable data digests")
	f.StringVar(&o.hostNQN, "hostnqn", "", "host NQN (default derived from a random host ID)")
	f.StringVar(&o.dhchapSecret, "dhchap-secret", "", "this host's DH-HMAC-CHAP secret DHHC-1:..: (or file:PATH), used when the target asks")
	f.StringVar(&o.dhchapCtrl, "dhchap-ctrl-secret", "", "the controller's secret, to authenticate the target too (bidirectional)")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile (pprof) of the measured run to FILE")
}

func newFabricPerfCmd(root *rootOptions) *cobra.Command {
	o := &fabricPerfOptions{}
	cmd := &cobra.Command{
		Use:   "perf --connect ADDR:PORT --nqn NQN --workload randread|randwrite|read|write [--bs 4k] [--qd 32] [--time 10s]",
		Short: "Benchmark an NVMe/TCP namespace with tier0's initiator: IOPS, bandwidth, latency, CPU per I/O",
		Long: `Connects to an NVMe/TCP controller (tier0's target, Linux nvmet, SPDK) with
tier0's own initiator and keeps --qd I/Os of --bs bytes in flight on one
namespace for --time: random or sequential, reads or writes. Prints IOPS,
bandwidth, latency percentiles (p50, p99, p99.9, max) and this client's CPU
time per I/O (getrusage), the figure that stays comparable on a loaded
machine. --cores N runs the client on N cores (GOMAXPROCS) with N I/O
queues (connections). Write workloads overwrite the namespace.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.json = root.json
			return runFabricPerf(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runFabricPerf(ctx context.Context, o *fabricPerfOptions, stdout io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if o.connect == "" || o.nqn == "" {
		return errors.New("fabric perf: --connect HOST:PORT and --nqn NQN are required")
	}
	bs, err := units.ParseBytes(o.bs)
	if err != nil {
		return fmt.Errorf("fabric perf: --bs: %w", err)
	}
	region, err := units.ParseBytes(o.region)
	if err != nil {
		return fmt.Errorf("fabric perf: --region: %w", err)
	}
	if o.cores < 1 || o.cores > runtime.NumCPU() {
		return fmt.Errorf("fabric perf: --cores %d: expected 1 to %d (this machine's CPUs)", o.cores, runtime.NumCPU())
	}
	if o.duration <= 0 {
		return fmt.Errorf("fabric perf: --time %v: expected a positive duration such as 10s", o.duration)
	}
	cfg := perf.Config{Workload: o.workload, BlockSize: int(bs), QueueDepth: o.qd, Duration: o.duration, Region: region}
	// Check what needs no connection first (the device's block size is
	// checked again once it is known).
	if err := (&perf.Config{Workload: cfg.Workload, BlockSize: cfg.BlockSize, QueueDepth: cfg.QueueDepth, Duration: cfg.Duration}).Validate(1<<62, 1); err != nil {
		return fmt.Errorf("fabric perf: %w", err)
	}
	queues := o.queues
	if queues <= 0 {
		queues = o.cores
	}
	prev := runtime.GOMAXPROCS(o.cores)
	defer runtime.GOMAXPROCS(prev)
	hopts := host.Options{SubNQN: o.nqn, HostNQN: o.hostNQN, IOQueues: queues, QueueDepth: max(o.qd, 2),
		HeaderDigest: o.hdgst, DataDigest: o.ddgst, CtrlLossTimeout: -1}
	if hopts.DHCHAPSecret, err = dhchapSecretArg("dhchap-secret", o.dhchapSecret); err != nil {
		return err
	}
	if hopts.DHCHAPCtrlSecret, err = dhchapSecretArg("dhchap-ctrl-secret", o.dhchapCtrl); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := host.Dial(dctx, o.connect, hopts)
	if err != nil {
		return fmt.Errorf("fabric perf: %w", err)
	}
	defer c.Close()
	ns, err := c.Namespace(o.nsid)
	if err != nil {
		return fmt.Errorf("fabric perf: %w", err)
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("fabric perf: --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("fabric perf: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	r, err := perf.Run(ctx, ns, cfg)
	if err != nil && r.IOs == 0 {
		return fmt.Errorf("fabric perf: %s nsid %d on %s: %w", o.nqn, o.nsid, o.connect, err)
	}
	res := fabricPerfResult{Addr: o.connect, NQN: o.nqn, NSID: o.nsid, Cores: o.cores, Queues: queues, Result: r}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if e := enc.Encode(res); e != nil {
			return e
		}
	} else {
		fmt.Fprintf(stdout, "%s nsid %d on %s, %d core(s), %d I/O queue(s)\n", o.nqn, o.nsid, o.connect, o.cores, queues)
		fmt.Fprintf(stdout, "  %-10s %d bytes, QD %d, %.2f s: %.0f IOPS, %.1f MiB/s\n", r.Workload, r.BlockSize, r.QueueDepth, r.Seconds, r.IOPS, r.MiBps)
		fmt.Fprintf(stdout, "  latency us: mean %.1f  p50 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n", r.Latency.Mean, r.Latency.P50, r.Latency.P99, r.Latency.P999, r.Latency.Max)
		fmt.Fprintf(stdout, "  client CPU: %.2f us per I/O, %.1f us per MiB (user %.2f s, sys %.2f s)\n", r.CPUPerIO, r.CPUPerMiB, r.CPUUser, r.CPUSys)
	}
	if err != nil {
		return fmt.Errorf("fabric perf: stopped after %d I/Os: %w", r.IOs, err)
	}
	return nil
}
