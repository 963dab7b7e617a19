package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/blockdev/local"
	"tier0/daemon/config"
	"tier0/daemon/discover"
	"tier0/daemon/target"
)

// driveInfo is what a node publishes about each local drive, so that every
// node can size the arrays' frontend namespaces before any is assembled.
type driveInfo struct {
	Node      string `json:"node"`
	Size      int64  `json:"size"`
	BlockSize int    `json:"block_size"`
}

// openDrives opens every local drive of this node with O_DIRECT. File
// drives with a configured size are created when missing.
func (n *Node) openDrives() error {
	for _, d := range n.me.Drives {
		path := d.Path
		if path == "" {
			r, err := discover.Resolve(discover.Options{}, nil, "", d.ByID, d.Serial)
			if err != nil {
				return fmt.Errorf("drive %s: %w", d.Name, err)
			}
			path = r.Path
		}
		o := local.Options{Logger: n.log.With("drive", d.Name), AllowBuffered: true}
		if d.Size > 0 {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return fmt.Errorf("drive %s: %w", d.Name, err)
			}
			o.Size, o.Create = int64(d.Size), true
		}
		dev, err := local.Open(path, o)
		if err != nil {
			return fmt.Errorf("drive %s (%s): %w; check the path in %s or that the device is present", d.Name, path, err, n.cfg.File)
		}
		n.drives[d.Name] = dev
		if m, link, _, ok := n.cfg.DriveModelOf(d.Name); ok {
			// A local site's performance model (drives[].model, docs/BENCH.md).
			n.drives[d.Name] = blockdev.NewShaped(dev, blockdev.Model(m), nil, blockdev.SharedLink(n.cfg.Cluster+"/"+n.me.Name, link))
		}
		if pc, ctl := os.Getenv("TIER0_NEMESIS_POWERCUT") == "1", os.Getenv("TIER0_NEMESIS_DISKCTL"); pc || ctl != "" {
			// Test-only hooks (reliability/nemesis, docs/RELIABILITY.md):
			// unflushed, non-FUA writes stay in this process's memory, so
			// a kill -9 is a power loss of this node's drives; the file
			// $TIER0_NEMESIS_DISKCTL/<drive> injects delays or errors.
			w := blockdev.NewPowerCut(dev)
			w.WriteThrough = !pc
			if ctl != "" {
				w.Watch(filepath.Join(ctl, d.Name))
			}
			n.drives[d.Name] = w
		}
	}
	return nil
}

// backendBootID is the boot id the backend target reports as this node's
// incarnation: "" (the kernel's boot id) but under the nemesis's power-cut
// hook (TIER0_NEMESIS_POWERCUT=1, openDrives), where every kill -9 loses
// the drives' unflushed writes as a power cut would: each start of the
// process is then a new boot, so that the arrays' owners catch the
// members up as after a real one (daemon/raid incarnation.go).
func backendBootID() string {
	if os.Getenv("TIER0_NEMESIS_POWERCUT") != "1" {
		return ""
	}
	return fmt.Sprintf("nemesis-power-cut-%d-%d", os.Getpid(), time.Now().UnixNano())
}

// startBackend exports every local drive as its own subsystem on the
// backend fabric. A drive shared by k arrays is split into k namespaces.
// Only the cluster's own nodes may connect.
func (n *Node) startBackend() error {
	idx := n.nodeIndex()
	cntlBase, cntlCount := config.CntlIDRange(idx)
	t, err := target.New(target.Config{
		Listen:      n.me.ListenAddr(n.me.Backend),
		RDMAListen:  n.rdmaListen(n.cfg.Fabrics.Backend, n.me.Backend),
		Advertise:   n.me.AdvertiseAddr(n.me.Backend),
		CntlIDBase:  cntlBase,
		CntlIDCount: cntlCount,
		StateDir:    n.stateDir("backend-resv"),
		BootID:      backendBootID(),
		Logger:      n.log.With("layer", "backend"),
		// Connect and authentication, accept to finish (0: the default)
		ConnectTimeout: n.cfg.Fabrics.Backend.ConnectTimeout.D(),
	})
	if err != nil {
		return fmt.Errorf("backend target: %w", err)
	}
	var hosts []string
	for _, o := range n.cfg.Nodes {
		hosts = append(hosts, hostNQN(n.cfg, o.Name))
	}
	hosts = append(hosts, n.cfg.Fabrics.Backend.AllowHosts...)
	auth, err := dhchap(n.cfg.Fabrics.Backend)
	if err != nil {
		return fmt.Errorf("fabrics.backend: %w", err)
	}
	for _, d := range n.me.Drives {
		dev := n.drives[d.Name]
		nqn := n.cfg.DriveNQN(d.Name)
		// EpochFencing: the reservation key is the ownership epoch, and the
		// target refuses a preempt (or clear, or key lowering) against an
		// equal or newer key, so a stale owner can never take a member
		// back, whatever its node-side checks saw.
		if err := t.AddSubsystem(target.SubsystemConfig{NQN: nqn, Model: "tier0 drive " + d.Name, AllowedHosts: hosts, DHCHAP: auth, EpochFencing: true}); err != nil {
			return fmt.Errorf("backend subsystem %s: %w", nqn, err)
		}
		shares := max(1, len(n.cfg.DriveShares(d.Name)))
		for i := 0; i < shares; i++ {
			part := slice(dev, i, shares)
			err := t.AddNamespace(nqn, target.NamespaceConfig{
				NSID:   uint32(i + 1),
				Device: part,
				NGUID:  derive16("drive", n.cfg.Cluster, d.Name, fmt.Sprint(i)),
				UUID:   derive16("drive-uuid", n.cfg.Cluster, d.Name, fmt.Sprint(i)),
			})
			if err != nil {
				return fmt.Errorf("backend namespace %s/%d: %w", nqn, i+1, err)
			}
		}
	}
	if err := os.MkdirAll(n.stateDir("backend-resv"), 0o755); err != nil {
		return err
	}
	if err := t.Start(); err != nil {
		return fmt.Errorf("backend target on %s: %w", n.me.ListenAddr(n.me.Backend), err)
	}
	n.backend = t
	return nil
}

// publishDrives records the size of every local drive in the store.
// At start-up the store may still be electing its first leader (the other
// voters are starting too) and each write is bounded by the store's own
// deadline: a write that times out is tried again, with backoff, for up to
// storeStartWait before the node gives up.
func (n *Node) publishDrives(ctx context.Context) error {
	for name, dev := range n.drives {
		info := driveInfo{Node: n.me.Name, Size: dev.Size(), BlockSize: dev.BlockSize()}
		if err := retryStartup(ctx, n, "publish drive "+name, func() error {
			_, err := n.st.Put(ctx, "observed", "drives", name, info)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// storeStartWait bounds how long start-up waits for the store to take a
// write.
const storeStartWait = 2 * time.Minute

// retryStartup runs op until it succeeds, ctx ends or storeStartWait has
// passed, logging each failure.
func retryStartup(ctx context.Context, n *Node, what string, op func() error) error {
	deadline := n.clk().Now().Add(storeStartWait)
	wait := 250 * time.Millisecond
	for {
		err := op()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if n.clk().Now().After(deadline) {
			return fmt.Errorf("%s: the store took no write for %s (last error: %w): is a majority of the etcd voters in control_plane up and reachable from node %s?", what, storeStartWait, err, n.me.Name)
		}
		n.log.Warn("store write failed at start-up; retrying", "what", what, "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-n.clk().After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// slice returns part i of k equal, block-aligned parts of dev (dev itself
// when k is 1).
func slice(dev blockdev.Device, i, k int) blockdev.Device {
	if k <= 1 {
		return dev
	}
	bs := int64(dev.BlockSize())
	per := dev.Size() / int64(k) / bs * bs
	return &part{Device: dev, off: int64(i) * per, size: per}
}

// part is a window [off, off+size) of a device. Close does not close the
// underlying device.
type part struct {
	blockdev.Device
	off, size int64
}

func (p *part) Size() int64 { return p.size }

func (p *part) check(off, n int64) error {
	return blockdev.CheckRange(off, n, p.size, p.BlockSize())
}

func (p *part) ReadAt(b []byte, off int64) (int, error) {
	if err := p.check(off, int64(len(b))); err != nil {
		return 0, err
	}
	return p.Device.ReadAt(b, off+p.off)
}

func (p *part) WriteAt(b []byte, off int64) (int, error) {
	if err := p.check(off, int64(len(b))); err != nil {
		return 0, err
	}
	return p.Device.WriteAt(b, off+p.off)
}

func (p *part) WriteZeroes(off, length int64) error {
	if err := p.check(off, length); err != nil {
		return err
	}
	return p.Device.WriteZeroes(off+p.off, length)
}

func (p *part) Discard(off, length int64) error {
	if err := p.check(off, length); err != nil {
		return err
	}
	return p.Device.Discard(off+p.off, length)
}

func (p *part) Close() error { return nil }

// dhchap is the target's DH-HMAC-CHAP setting for a fabric (zero: off).
func dhchap(f config.Fabric) (target.DHCHAPConfig, error) {
	host, err := config.Secret(f.DHCHAPSecret)
	if err != nil {
		return target.DHCHAPConfig{}, err
	}
	ctrl, err := config.Secret(f.DHCHAPCtrlSecret)
	if err != nil {
		return target.DHCHAPConfig{}, err
	}
	return target.DHCHAPConfig{HostSecret: host, CtrlSecret: ctrl}, nil
}
