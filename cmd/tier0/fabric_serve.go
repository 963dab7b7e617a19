package main

// fabric serve: run an NVMe/TCP target alone, serving files or block
// devices as the namespaces of one subsystem. Usage in docs/FABRIC.md.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/local"
	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
	"tier0/daemon/target"
	"tier0/internal/units"
)

// fabricServeOptions are the flags of fabric serve.
type fabricServeOptions struct {
	listen, discoveryListen, advertise string
	transport                          string // tcp (default) or rdma
	nqn                                string
	ns                                 []string
	size                               string
	blockSize                          int
	anaState                           string
	anaGroup                           uint32
	allowHosts                         []string
	cntlidBase, cntlidCount            uint16
	stateDir                           string
	buffered                           bool
	verbose                            bool
	dhchapSecret, dhchapCtrlSecret     string
	dhchapGroups                       []string
	cpuProfile                         string
	json                               bool // the root's --json, set when the command runs
}

func (o *fabricServeOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", "0.0.0.0:4420", "ADDR:PORT to serve I/O and discovery on")
	f.StringVar(&o.transport, "transport", "tcp", "fabric transport of --listen: tcp or rdma (NVMe/RDMA over rdma_cm, IPv4; needs a binary built with -tags rdma and an RDMA device, see docs/RDMA.md)")
	f.StringVar(&o.discoveryListen, "discovery-listen", "", "optional second ADDR:PORT, e.g. :8009 (the well-known discovery port)")
	f.StringVar(&o.advertise, "advertise", "", "ADDR:PORT written into discovery log entries (default: the listen address)")
	f.StringVar(&o.nqn, "nqn", "", "subsystem NQN (required)")
	f.StringArrayVar(&o.ns, "ns", nil, "file or block device to serve as the next namespace, or mem:SIZE for one in memory (repeatable)")
	f.StringVar(&o.size, "size", "", "create missing --ns files with this size (e.g. 1G)")
	f.IntVar(&o.blockSize, "block-size", 4096, "logical block size of --ns files (512 or 4096)")
	f.StringVar(&o.anaState, "ana-state", "optimized", "ANA state of this node's path: optimized, non-optimized, inaccessible, persistent-loss, change")
	f.Uint32Var(&o.anaGroup, "ana-group", 1, "ANA group of the namespaces (1-32)")
	f.StringArrayVar(&o.allowHosts, "allow-host", nil, "host NQN allowed to connect (repeatable; none: any host)")
	f.Uint16Var(&o.cntlidBase, "cntlid-base", 1, "first controller ID handed out; use disjoint ranges per node")
	f.Uint16Var(&o.cntlidCount, "cntlid-count", 256, "number of controller IDs from --cntlid-base")
	f.StringVar(&o.stateDir, "state-dir", "", "directory for persistent reservation state (default: memory only)")
	f.BoolVar(&o.buffered, "buffered", false, "fall back to buffered I/O where O_DIRECT is refused (tmpfs)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "debug logging")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile (pprof) of the whole run to FILE, for docs/PERFORMANCE.md")
	f.StringVar(&o.dhchapSecret, "dhchap-secret", "", "require DH-HMAC-CHAP: the hosts' secret DHHC-1:..: (or file:PATH); see docs/SECURITY.md")
	f.StringVar(&o.dhchapCtrlSecret, "dhchap-ctrl-secret", "", "controller secret for bidirectional DH-HMAC-CHAP (or file:PATH)")
	f.StringSliceVar(&o.dhchapGroups, "dhchap-dhgroup", nil, "acceptable DH groups in preference order (default ffdhe2048,ffdhe3072,ffdhe4096,ffdhe6144,ffdhe8192,null)")
}

func newFabricServeCmd(root *rootOptions) *cobra.Command {
	o := &fabricServeOptions{}
	cmd := &cobra.Command{
		Use:   "serve --nqn NQN --ns PATH|mem:SIZE [--ns ...]",
		Short: "Serve files or block devices as an NVMe/TCP subsystem (a standalone target)",
		Long: `Serve files or block devices as the namespaces (1, 2, ...) of one NVMe/TCP
subsystem until interrupted. The same port answers discovery; --discovery-listen
adds a second port such as :8009. Namespace NGUID/UUID are derived from the
NQN and namespace ID, so two nodes serving the same NQN present one multipath
namespace; give each node its own --cntlid-base range. --ns mem:512M serves
512 MiB of this process's memory (gone when serve exits): the target's own
cost, apart from any file system, for benchmarks such as tier0 fabric perf.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o.json = root.json
			return runFabricServe(ctx, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// positiveBytes is units.ParseBytes (the one size parser) for a size that
// must be more than 0: a memory namespace's, --size.
func positiveBytes(s string) (int64, error) {
	n, err := units.ParseBytes(s)
	if err == nil && n <= 0 {
		err = fmt.Errorf("size %q: want a positive size such as 512M", s)
	}
	return n, err
}

// memNamespace reports whether --ns names a memory namespace, "mem:SIZE".
func memNamespace(ns string) (size string, ok bool) { return strings.CutPrefix(ns, "mem:") }

// openNamespace opens one --ns: a file or block device, or "mem:SIZE", a
// namespace in this process's memory (for benchmarks: the target's own
// cost apart from any file system; its data is gone when serve exits).
func openNamespace(p string, o *fabricServeOptions, size int64, log *slog.Logger) (blockdev.Device, error) {
	if ms, ok := memNamespace(p); ok {
		n, err := positiveBytes(ms)
		if err != nil {
			return nil, fmt.Errorf("fabric serve: --ns %s: %w (e.g. --ns mem:512M)", p, err)
		}
		d, err := local.NewMemory(n, o.blockSize)
		if err != nil {
			return nil, fmt.Errorf("fabric serve: --ns %s: %w", p, err)
		}
		return d, nil
	}
	opts := local.Options{BlockSize: o.blockSize, AllowBuffered: o.buffered, Logger: log}
	if size > 0 {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			opts.Create, opts.Size = true, size
		}
	}
	d, err := local.Open(p, opts)
	if err != nil {
		return nil, fmt.Errorf("fabric serve: open --ns %s: %w (use --size to create a file, --buffered on tmpfs)", p, err)
	}
	return d, nil
}

// namespaceIDs derives the NGUID and UUID of a namespace from the
// subsystem NQN and the namespace ID, identical on every node.
func namespaceIDs(nqn string, nsid uint32) (nguid, uuid [16]byte) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], nsid)
	h := sha256.Sum256(append([]byte("tier0-ns:"+nqn+":"), b[:]...))
	copy(nguid[:], h[:16])
	copy(uuid[:], h[16:32])
	uuid[6] = uuid[6]&0x0F | 0x80 // version 8 (custom)
	uuid[8] = uuid[8]&0x3F | 0x80 // RFC 4122 variant
	return nguid, uuid
}

// fabricServeInfo is what `fabric serve` prints once it is serving.
type fabricServeInfo struct {
	Listen     string   `json:"listen"`
	Transport  string   `json:"transport"`
	Advertise  string   `json:"advertise,omitempty"`
	NQN        string   `json:"nqn"`
	Namespaces []string `json:"namespaces"`
	ANAState   string   `json:"ana_state"`
	ANAGroup   uint32   `json:"ana_group"`
	CntlIDs    [2]int   `json:"cntlid_range"`
	DHCHAP     bool     `json:"dhchap,omitempty"`
}

// dhchapSecretArg returns a secret flag's value, read from PATH for
// "file:PATH" (keeps the secret out of the process list).
func dhchapSecretArg(flag, v string) (string, error) {
	p, ok := strings.CutPrefix(v, "file:")
	if !ok {
		return v, nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flag, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func serveDHCHAP(o *fabricServeOptions) (target.DHCHAPConfig, error) {
	var dc target.DHCHAPConfig
	var err error
	if dc.HostSecret, err = dhchapSecretArg("dhchap-secret", o.dhchapSecret); err != nil {
		return dc, err
	}
	if dc.CtrlSecret, err = dhchapSecretArg("dhchap-ctrl-secret", o.dhchapCtrlSecret); err != nil {
		return dc, err
	}
	for _, g := range o.dhchapGroups {
		id, err := nvme.ParseDHGroupName(g)
		if err != nil {
			return dc, fmt.Errorf("--dhchap-dhgroup: %w", err)
		}
		dc.DHGroups = append(dc.DHGroups, id)
	}
	return dc, nil
}

func runFabricServe(ctx context.Context, o *fabricServeOptions, stdout, stderr io.Writer) error {
	if o.nqn == "" || len(o.ns) == 0 {
		return errors.New("fabric serve: --nqn NQN and at least one --ns PATH are required")
	}
	switch o.transport {
	case "tcp", "":
		o.transport = "tcp"
	case "rdma":
		if !rdma.Built {
			return fmt.Errorf("fabric serve: --transport rdma: %w", rdma.ErrNotBuilt)
		}
		if o.discoveryListen != "" {
			return errors.New("fabric serve: --discovery-listen is a TCP port; with --transport rdma the --listen port answers discovery too")
		}
	default:
		return fmt.Errorf("fabric serve: --transport %q: want tcp or rdma", o.transport)
	}
	state, err := nvme.ParseANAState(o.anaState)
	if err != nil {
		return fmt.Errorf("fabric serve: --ana-state: %w", err)
	}
	var size int64
	if o.size != "" {
		if size, err = positiveBytes(o.size); err != nil {
			return fmt.Errorf("fabric serve: --size: %w", err)
		}
	}
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var devs []blockdev.Device
	defer func() {
		for _, d := range devs {
			d.Close()
		}
	}()
	for _, p := range o.ns {
		d, err := openNamespace(p, o, size, log)
		if err != nil {
			return err
		}
		devs = append(devs, d)
	}
	tg, err := target.New(target.Config{Listen: o.listen, DiscoveryListen: o.discoveryListen, Advertise: o.advertise,
		CntlIDBase: o.cntlidBase, CntlIDCount: o.cntlidCount, StateDir: o.stateDir, Logger: log})
	if err != nil {
		return fmt.Errorf("fabric serve: %w", err)
	}
	defer tg.Close()
	dc, err := serveDHCHAP(o)
	if err != nil {
		return fmt.Errorf("fabric serve: %w", err)
	}
	sc := target.SubsystemConfig{NQN: o.nqn, AllowAnyHost: len(o.allowHosts) == 0, AllowedHosts: o.allowHosts,
		ANAStates: map[uint32]nvme.ANAState{o.anaGroup: state}, DHCHAP: dc}
	if err := tg.AddSubsystem(sc); err != nil {
		return fmt.Errorf("fabric serve: %w", err)
	}
	for i, d := range devs {
		nsid := uint32(i + 1)
		nguid, uuid := namespaceIDs(o.nqn, nsid)
		if err := tg.AddNamespace(o.nqn, target.NamespaceConfig{NSID: nsid, Device: d, NGUID: nguid, UUID: uuid, ANAGroup: o.anaGroup}); err != nil {
			return fmt.Errorf("fabric serve: namespace %d (%s): %w", nsid, o.ns[i], err)
		}
	}
	var listen string
	if o.transport == "rdma" {
		if err := tg.ListenRDMA(o.listen); err != nil {
			return fmt.Errorf("fabric serve: %w", err)
		}
		listen = tg.RDMAAddr()
	} else {
		if err := tg.Start(); err != nil {
			return fmt.Errorf("fabric serve: %w", err)
		}
		listen = tg.Addr().String()
	}
	info := fabricServeInfo{Listen: listen, Transport: o.transport, Advertise: o.advertise, NQN: o.nqn, Namespaces: o.ns, ANAState: state.String(),
		ANAGroup: o.anaGroup, CntlIDs: [2]int{int(o.cntlidBase), int(o.cntlidBase) + int(o.cntlidCount) - 1}, DHCHAP: dc.HostSecret != ""}
	if o.json {
		if err := json.NewEncoder(stdout).Encode(info); err != nil {
			return err
		}
	} else {
		over := ""
		if info.Transport == "rdma" {
			over = " over NVMe/RDMA"
		}
		fmt.Fprintf(stdout, "serving %s on %s%s: %d namespace(s), ANA group %d %s, controller IDs %d-%d\n",
			info.NQN, info.Listen, over, len(info.Namespaces), info.ANAGroup, info.ANAState, info.CntlIDs[0], info.CntlIDs[1])
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("fabric serve: --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("fabric serve: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	<-ctx.Done()
	log.Info("fabric serve: shutting down", "reason", context.Cause(ctx))
	return nil
}
