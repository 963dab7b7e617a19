package frontend

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/daemon/target"
	"tier0/reliability/checker"
	"tier0/reliability/history"
)

// Options configure one seed's run.
type Options struct {
	Seed uint64
	// Window is the fault window (default 3 s); the workload runs for
	// Window plus Tail (default 1.5 s) after the last fault ended.
	Window, Tail time.Duration
	// KATO is the host's keep-alive timeout (default 500 ms); with the
	// target's quiesce time it bounds how long the host holds a lost
	// association's writes.
	KATO time.Duration
	// Logger receives the host's and target's logs (default: discard).
	Logger *slog.Logger
}

// Fault is one entry of a schedule.
type Fault struct {
	Kind  string        // "slow" (the device) or "reset" (a path's connections closed)
	Path  int           // the path (0 or 1): its target's device, or its connections
	Start time.Duration // from the start of the workload
	Dur   time.Duration
	// Latency of each write entering the device during a slow fault.
	Latency time.Duration
}

func (f Fault) String() string {
	if f.Kind == "slow" {
		return fmt.Sprintf("slow device of path %d at %v for %v (%v per write)", f.Path, f.Start.Round(time.Millisecond), f.Dur.Round(time.Millisecond), f.Latency.Round(time.Millisecond))
	}
	return fmt.Sprintf("reset path %d at %v for %v", f.Path, f.Start.Round(time.Millisecond), f.Dur.Round(time.Millisecond))
}

// Schedule is what a seed draws: the shape of the host and target and
// the faults.
type Schedule struct {
	Seed    uint64
	Paths   int // 1: one controller; 2: a multipath device over two paths
	Workers int // target workers per I/O queue
	Faults  []Fault
}

func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "frontend seed %d: %d path(s), %d target worker(s) per queue\n", s.Seed, s.Paths, s.Workers)
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	return b.String()
}

// Generate draws seed's schedule: one or two slow periods of the device
// and one to three resets (two in three of them inside a slow period),
// each inside window.
func Generate(seed uint64, window time.Duration) Schedule {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := Schedule{Seed: seed, Paths: 1 + rng.IntN(2), Workers: 1 + rng.IntN(2)}
	dur := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	for range 1 + rng.IntN(2) {
		d := dur(300*time.Millisecond, 1500*time.Millisecond)
		s.Faults = append(s.Faults, Fault{Kind: "slow", Path: rng.IntN(s.Paths), Start: dur(0, window-d), Dur: d, Latency: dur(20*time.Millisecond, 300*time.Millisecond)})
	}
	slows := len(s.Faults)
	for range 1 + rng.IntN(3) {
		d := dur(20*time.Millisecond, 200*time.Millisecond)
		start := dur(0, window-d)
		if rng.IntN(3) > 0 {
			// Most resets fall inside a slow period: commands are then
			// queued behind the device when the connection dies.
			sl := s.Faults[rng.IntN(slows)]
			s.Faults = append(s.Faults, Fault{Kind: "reset", Path: sl.Path, Start: min(sl.Start+dur(0, sl.Dur), window-d), Dur: d})
			continue
		}
		s.Faults = append(s.Faults, Fault{Kind: "reset", Path: rng.IntN(s.Paths), Start: start, Dur: d})
	}
	return s
}

// Result is one seed's outcome.
type Result struct {
	Schedule Schedule
	Progress checker.Progress
	Final    checker.Report
	Online   checker.Report
	History  history.Result
	// Report describes the anomalies (with the fault timeline and the
	// seed); empty when clean.
	Report string
}

// OK reports whether the seed found nothing.
func (r Result) OK() bool { return r.Final.OK() && r.Online.OK() && r.History.OK() }

const (
	nqn       = "nqn.2026-12.io.tier0.frontend:nemesis"
	devSize   = 8 << 20
	units     = 32
	ioWorkers = 8
)

// Run runs one seed.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Window <= 0 {
		o.Window = 3 * time.Second
	}
	if o.Tail <= 0 {
		o.Tail = 1500 * time.Millisecond
	}
	if o.KATO <= 0 {
		o.KATO = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	sch := Generate(o.Seed, o.Window)
	res := Result{Schedule: sch}
	mem := blockdev.NewMem(devSize, 512)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	var devs []*slowDev
	var proxies []*toxiproxy.Proxy
	defer func() {
		for _, p := range proxies {
			p.Stop()
		}
	}()
	for i := range sch.Paths {
		dev := &slowDev{Device: mem}
		addr, stop, err := serve(dev, sch.Workers, o.Logger)
		if err != nil {
			return res, fmt.Errorf("target of path %d: %w", i, err)
		}
		defer stop()
		p := toxiproxy.NewProxy(srv, fmt.Sprintf("path%d", i), "127.0.0.1:0", addr)
		if err := p.Start(); err != nil {
			return res, fmt.Errorf("proxy for path %d: %w", i, err)
		}
		devs = append(devs, dev)
		proxies = append(proxies, p)
	}
	bd, closeDev, err := open(ctx, sch, proxies, o)
	if err != nil {
		return res, err
	}
	defer closeDev()
	chk, err := checker.New([]checker.Target{{Name: "frontend", Dev: bd, Units: units}},
		checker.Options{Workers: ioWorkers, MaxRun: 2, ReadPercent: 30, ReadAny: true, Seed: o.Seed, ErrorBackoff: 5 * time.Millisecond})
	if err != nil {
		return res, err
	}
	rec := chk.History()
	wctx, stop := context.WithTimeout(ctx, o.Window+o.Tail)
	defer stop()
	var wg sync.WaitGroup
	for _, f := range sch.Faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inject(wctx, f, devs, proxies, rec)
		}()
	}
	_ = chk.Run(wctx)
	wg.Wait()
	res.Progress = chk.Progress()
	res.Online = chk.Online()
	if res.Final, err = chk.Verify(ctx, checker.VerifyOptions{ReadRetries: 3, RetryDelay: 200 * time.Millisecond}); err != nil {
		return res, err
	}
	res.History = chk.CheckHistory(history.Options{Timeout: time.Minute})
	if !res.OK() {
		res.Report = sch.String() + res.Final.String() + "\n" + res.History.Report(rec.Events(), o.Seed)
	}
	return res, nil
}

// serve starts a target (one path's controller: an owner of the
// namespace) exporting dev.
func serve(dev blockdev.Device, workers int, log *slog.Logger) (string, func(), error) {
	tg, err := target.New(target.Config{Listen: "127.0.0.1:0", WorkersPerQueue: workers, Logger: log})
	if err != nil {
		return "", nil, err
	}
	if err := tg.Start(); err != nil {
		return "", nil, err
	}
	if err := tg.AddSubsystem(target.SubsystemConfig{NQN: nqn, AllowAnyHost: true}); err != nil {
		tg.Close()
		return "", nil, err
	}
	if err := tg.AddNamespace(nqn, target.NamespaceConfig{NSID: 1, Device: dev}); err != nil {
		tg.Close()
		return "", nil, err
	}
	return tg.Addr().String(), func() { tg.Close() }, nil
}

// open connects the host: one controller on path 0, or a multipath device
// over both paths.
func open(ctx context.Context, sch Schedule, proxies []*toxiproxy.Proxy, o Options) (blockdev.Device, func(), error) {
	ho := host.Options{SubNQN: nqn, IOQueues: 1, QueueDepth: 32, KATO: o.KATO, IOTimeout: 5 * time.Second,
		ReconnectDelay: 20 * time.Millisecond, CtrlLossTimeout: 30 * time.Second, Logger: o.Logger}
	if sch.Paths == 1 {
		c, err := host.Dial(ctx, proxies[0].Listen, ho)
		if err != nil {
			return nil, nil, err
		}
		ns, err := c.Namespace(1)
		if err != nil {
			c.Close()
			return nil, nil, err
		}
		return ns, func() { c.Close() }, nil
	}
	var specs []host.PathSpec
	for _, p := range proxies {
		specs = append(specs, host.PathSpec{Addr: p.Listen, Options: ho})
	}
	mp, err := host.NewMultipath(specs, host.MPOptions{NSID: 1, Logger: o.Logger})
	if err != nil {
		return nil, nil, err
	}
	return mp, func() { mp.Close() }, nil
}

// inject waits for f's start, applies it for its duration and heals it,
// noting both in the history's fault timeline.
func inject(ctx context.Context, f Fault, devs []*slowDev, proxies []*toxiproxy.Proxy, rec *history.Recorder) {
	if !sleep(ctx, f.Start) {
		return
	}
	rec.Note("%s: begins", f)
	switch f.Kind {
	case "slow":
		devs[f.Path].slow(f.Latency)
		sleep(ctx, f.Dur)
		devs[f.Path].slow(-f.Latency)
	case "reset":
		// Stopping the proxy closes every connection through it at once
		// (a reset_peer toxic would wait for data, and a queue blocked
		// behind the slow device sends none) and refuses new ones until
		// it starts again on the same address.
		p := proxies[f.Path]
		p.Stop()
		sleep(ctx, f.Dur)
		if err := p.Start(); err != nil {
			rec.Note("%s: the path's proxy did not start again: %v", f, err)
			return
		}
	}
	rec.Note("%s: healed", f)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// slowDev is the target's device: while slow, every write waits its
// latency before it reaches the memory (a member that answers late: the
// target's workers block on it and later commands queue behind them).
type slowDev struct {
	blockdev.Device
	mu  sync.Mutex
	lat time.Duration
}

func (d *slowDev) slow(delta time.Duration) {
	d.mu.Lock()
	d.lat += delta
	d.mu.Unlock()
}

func (d *slowDev) wait() {
	d.mu.Lock()
	lat := d.lat
	d.mu.Unlock()
	if lat > 0 {
		time.Sleep(lat)
	}
}

func (d *slowDev) WriteAt(p []byte, off int64) (int, error) {
	d.wait()
	return d.Device.WriteAt(p, off)
}
