package sim

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/blockdev"
	"tier0/daemon/clock"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/node"
	"tier0/daemon/store"
	"tier0/daemon/store/memstore"
	"tier0/reliability/history"
)

// Options configure one run.
type Options struct {
	// Seed draws the schedule and every order the simulation chooses.
	Seed uint64
	// Faults, when set, is the schedule to run instead of a drawn one
	// (Schedule.String's format, one fault per line).
	Faults string
	// Ticks of faults and workload (default 60), each Tick of cluster time.
	Ticks int
	// Settle ticks after the last fault has ended (default 40).
	Settle int
	// Legacy runs with the pre-bd91d05 repair and fence rule and without
	// the targets' epoch fencing (the proof that the simulation finds
	// issue 12, hole 1). It sets a process-wide knob: runs with Legacy
	// must not overlap with others.
	Legacy bool
	// Power draws power cuts of drive nodes too (kind power,
	// docs/RELIABILITY.md known problem 8; TestSimSeeds sets it unless
	// -sim.power=false).
	Power bool
	// Logger for the nodes (default: discard).
	Logger *slog.Logger
}

// Tick is the simulation's step of cluster time (the coordinator's tick).
const Tick = 500 * time.Millisecond

// leaseTTL is the site's lease TTL: 10 ticks.
const leaseTTL = 5 * time.Second

// Result is what a run found.
type Result struct {
	Seed     uint64
	Schedule Schedule
	// Violations of the reservation invariant and of the workload's
	// history, with the simulation time.
	Violations []string
	History    history.Result
	Ops        int
	// Unserved: no node served the array once every fault had ended and
	// the cluster had Settle ticks to recover (a liveness problem).
	Unserved bool
	// Timeline is what happened, for a failing seed's report.
	Timeline []string
}

// OK reports whether the run found nothing.
func (r Result) OK() bool { return len(r.Violations) == 0 && r.History.OK() && !r.Unserved }

// Report is a failing run's account: the seed, the schedule, the
// violations and the timeline.
func (r Result) Report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d violations, history %v (%d ops), unserved at the end %v\nschedule (replay with -sim.seed=%d, or Options.Faults):\n%s", r.Seed, len(r.Violations), r.History.ByKind, r.Ops, r.Unserved, r.Seed, r.Schedule)
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "VIOLATION %s\n", v)
	}
	for _, a := range r.History.Anomalies {
		fmt.Fprintf(&b, "ANOMALY %s unit %d: %s\n", a.Kind, a.Unit, a.Detail)
	}
	b.WriteString("timeline:\n")
	for _, l := range r.Timeline {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// The site: owners A and B (no drives), drive nodes C, D, E, one raid5
// array x over C1, D1, E1 with home A.
var (
	nodeNames  = []string{"A", "B", "C", "D", "E"}
	driveSize  = int64(4 << 20)
	arrayName  = "x"
	units      = 16 // 4 KiB units of the workload
	opsPerTick = 3
)

func siteConfig() (*config.Config, error) {
	var b strings.Builder
	b.WriteString("cluster: sim\nworkdir: /nonexistent/tier0-sim\nnodes:\n")
	for i, name := range nodeNames {
		drives := "[]"
		if name >= "C" {
			drives = fmt.Sprintf("[{name: %s1, path: /nonexistent/%s1.img, size: %d}]", name, name, driveSize)
		}
		fmt.Fprintf(&b, "  - {name: %s, address: 127.0.0.1, backend: {port: %d}, frontend: {port: %d}, api: {port: %d}, drives: %s}\n",
			name, 20000+i, 21000+i, 22000+i, drives)
	}
	b.WriteString("control_plane:\n  etcd: {peers: [A], client_port: 23000, peer_port: 23001}\n")
	fmt.Fprintf(&b, "policies: {lease_ttl: %s, member_io_timeout: 3s, rebuild_rate_mibs: 100000, rebuild_adaptive: false}\n", leaseTTL)
	fmt.Fprintf(&b, "arrays: [{name: %s, level: raid5, chunk_kib: 16, home: A, members: [C1, D1, E1]}]\n", arrayName)
	return config.Parse("sim-site.yaml", []byte(b.String()))
}

// simNode is one node of the simulated cluster.
type simNode struct {
	name   string
	sn     *node.SimNode
	view   *memstore.View
	lease  *memstore.Lease
	dead   bool
	frozen int // nesting: overlapping freezes
	// queue holds the tasks addressed to the node and not performed yet
	// (they wait in the store while it is frozen or dead).
	queue []cluster.Action
}

func (n *simNode) running() bool { return !n.dead && n.frozen == 0 }

// storeView is a memstore view that registers leases the node can use.
type storeView struct {
	*memstore.View
	w    *world
	name string
}

func (v storeView) RegisterLease(ctx context.Context, info store.NodeInfo, ttl, margin time.Duration) (node.Lease, error) {
	l, err := v.Register(ctx, info, ttl, margin)
	if err != nil {
		return nil, err
	}
	v.w.nodes[v.name].lease = l
	return l, nil
}

type world struct {
	o       Options
	rng     *rand.Rand
	clk     *clock.Fake
	st      *memstore.Store
	coord   *memstore.View
	fab     *Fabric
	cfg     *config.Config
	m       *cluster.Machine
	nodes   map[string]*simNode
	live    map[string]bool      // the coordinator's view of live leases
	started map[string]time.Time // NodeInfo.Started of each live registration
	tick    int

	stCut     map[string]int // store partitions per node (overlapping faults nest)
	fabIso    map[string]int // backend isolations per node
	oneWay    map[string]int // one-way cuts per node
	inCut     map[string]int // freezes per node: commands to its drives fail
	driveFail map[string]int // failures per drive node

	ops      []history.Op
	seq      int64
	gen      uint64
	timeline []string
	viol     []string
	// lastView is the machine's view last published (publishView).
	lastView string
}

func (w *world) now() string { return fmt.Sprintf("t=%d(%s)", w.tick, time.Duration(w.tick)*Tick) }

func (w *world) note(format string, args ...any) {
	w.timeline = append(w.timeline, w.now()+" "+fmt.Sprintf(format, args...))
}

func (w *world) violate(format string, args ...any) {
	v := w.now() + " " + fmt.Sprintf(format, args...)
	w.viol = append(w.viol, v)
	w.timeline = append(w.timeline, "VIOLATION "+v)
}

// Run runs one seed.
func Run(o Options) (Result, error) {
	if o.Ticks == 0 {
		o.Ticks = 60
	}
	if o.Settle == 0 {
		o.Settle = 40
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := siteConfig()
	if err != nil {
		return Result{}, fmt.Errorf("simulation site: %w", err)
	}
	w := &world{o: o, rng: rand.New(rand.NewPCG(o.Seed, 0x5eed)), clk: clock.NewFake(time.Time{}), cfg: cfg, nodes: map[string]*simNode{}, live: map[string]bool{}, started: map[string]time.Time{},
		stCut: map[string]int{}, fabIso: map[string]int{}, oneWay: map[string]int{}, inCut: map[string]int{}, driveFail: map[string]int{}}
	w.st = memstore.New(w.clk, "/tier0/"+cfg.Cluster+"/")
	w.coord = w.st.View("coordinator")
	w.fab = newFabric(cfg, driveSize, !o.Legacy, w.now)
	var sched Schedule
	if o.Faults != "" {
		if sched, err = ParseSchedule(o.Faults); err != nil {
			return Result{}, err
		}
	} else {
		sched = drawSchedule(w.rng, o.Ticks, o.Power)
	}
	if o.Legacy {
		node.SetLegacyStaleRepair(true)
		defer node.SetLegacyStaleRepair(false)
	}
	if err := w.start(); err != nil {
		return Result{}, err
	}
	defer w.stopAll()
	// The cluster settles for Settle ticks after the last fault ends.
	end := o.Ticks
	for _, f := range sched {
		end = max(end, f.Start+f.Len)
	}
	for w.tick = 1; w.tick <= end+o.Settle; w.tick++ {
		for _, f := range sched {
			if f.Start == w.tick {
				w.apply(f, true)
			}
			if f.Start+f.Len == w.tick {
				w.apply(f, false)
			}
		}
		w.step(w.tick <= end+o.Settle-5)
	}
	served := w.finalRead()
	res := Result{Seed: o.Seed, Schedule: sched, Ops: len(w.ops), Timeline: w.timeline, Unserved: !served}
	res.Violations = append(w.fab.Violations(), w.viol...)
	res.History = history.Check(w.ops, []string{arrayName}, history.Options{Timeout: 30 * time.Second})
	return res, nil
}

func (w *world) start() error {
	lvl, err := cluster.ParseLevel("raid5")
	if err != nil {
		return err
	}
	w.m, err = cluster.New(cluster.Config{ReleaseTimeoutTicks: int64(10 * time.Second / Tick), BackoffMaxTicks: int64(30 * time.Second / Tick), Failback: cluster.FailbackAuto}, nil)
	if err != nil {
		return err
	}
	for _, c := range w.cfg.Nodes {
		var drives []string
		for _, d := range c.Drives {
			drives = append(drives, d.Name)
		}
		if err := w.m.Step(cluster.NodeJoined{Node: c.Name, Domain: c.Domain, Drives: drives}); err != nil {
			return err
		}
	}
	a := w.cfg.Arrays[0]
	var ms []cluster.MemberSpec
	for _, d := range a.Members {
		n, _, _ := w.cfg.Drive(d)
		ms = append(ms, cluster.MemberSpec{Drive: d, Node: n.Name})
	}
	if err := w.m.Step(cluster.ArrayDefined{Name: a.Name, Level: lvl, Home: a.Home, Members: ms}); err != nil {
		return err
	}
	for _, name := range nodeNames {
		if err := w.boot(name); err != nil {
			return err
		}
		// Up from the start, as a coordinator that restores its machine
		// finds them: not a return.
		w.live[name] = true
	}
	alive, err := w.coord.Nodes(context.Background())
	if err != nil {
		return err
	}
	for name, info := range alive {
		w.started[name] = info.Started // each registration of the simulation is stamped anew
	}
	return nil
}

// boot starts (or restarts) a node and registers its lease.
func (w *world) boot(name string) error {
	old := w.nodes[name]
	v := storeView{View: w.st.View(name), w: w, name: name}
	sn, err := node.NewSimNode(node.Options{Config: w.cfg, Name: name, Logger: w.o.Logger, Tick: Tick, Clock: w.clk, Store: v, Fabric: w.fab.For(name)})
	if err != nil {
		return err
	}
	n := &simNode{name: name, sn: sn, view: v.View}
	if old != nil {
		n.queue = old.queue // tasks wait in the store for the restarted node
		n.frozen = old.frozen
	}
	w.nodes[name] = n
	w.register(n)
	return nil
}

func (w *world) register(n *simNode) {
	l, err := storeView{View: n.view, w: w, name: n.name}.RegisterLease(context.Background(), store.NodeInfo{Node: n.name}, leaseTTL, leaseTTL/5)
	if err != nil {
		return // retried at the next tick, as livenessLoop does
	}
	n.sn.Registered(l)
}

func (w *world) stopAll() {
	for _, name := range nodeNames {
		if n := w.nodes[name]; n != nil && !n.dead {
			w.fab.isolate(name, true)
			n.sn.Stop()
		}
	}
}

// step is one tick: the clock, the nodes (keep-alive, self-fencing, their
// tasks, in an order drawn per node), the coordinator, the workload.
func (w *world) step(workload bool) {
	w.clk.Advance(Tick)
	w.st.Expire()
	ctx := context.Background()
	for _, name := range w.order() {
		n := w.nodes[name]
		if !n.running() {
			continue
		}
		// A node that thaws races its lease watchdog with its queued
		// tasks: the seed decides which runs first.
		if w.rng.IntN(2) == 0 {
			w.keepAlive(n)
			w.perform(ctx, n)
		} else {
			w.perform(ctx, n)
			w.keepAlive(n)
		}
		n.sn.FlushReports()
		n.sn.RetryANA(ctx)
		if w.tick%5 == 0 {
			n.sn.RetryFailed(ctx)
		}
	}
	w.waitNodes()
	w.coordinate(ctx)
	for round := 0; round < 3; round++ {
		any := false
		for _, name := range w.order() {
			if n := w.nodes[name]; n.running() && len(n.queue) > 0 {
				w.perform(ctx, n)
				any = true
			}
		}
		if !any {
			break
		}
		w.waitNodes()
		w.coordinateReports()
	}
	w.checkServing()
	if workload {
		for range opsPerTick {
			w.op()
		}
		for _, name := range nodeNames {
			w.nodes[name].sn.Wait()
		}
	}
}

func (w *world) order() []string {
	o := append([]string(nil), nodeNames...)
	w.rng.Shuffle(len(o), func(i, j int) { o[i], o[j] = o[j], o[i] })
	return o
}

// quiesceBound is how long, in real time, a step waits for the nodes' RAID
// background tasks.
const quiesceBound = 2 * time.Second

// waitNodes lets the nodes' own goroutines (RAID background tasks, their
// reports) finish before the coordinator looks: in real time, bounded.
func (w *world) waitNodes() {
	for _, name := range nodeNames {
		if n := w.nodes[name]; n != nil {
			if !n.sn.Quiesce(quiesceBound) {
				w.note("%s: background tasks still running after %s of real time", name, quiesceBound)
			}
		}
	}
}

func (w *world) keepAlive(n *simNode) {
	if n.lease == nil {
		w.register(n)
		return
	}
	n.lease.Renew()
	if err := n.lease.Err(); err != nil {
		w.note("%s: lease lost (%v): self-fences", n.name, err)
		n.sn.LeaseLost(err.Error())
		n.sn.Wait() // the arrays' stop, before anything else runs: one order, replayable
		n.lease = nil
		w.register(n)
	}
}

func (w *world) perform(ctx context.Context, n *simNode) {
	q := n.queue
	n.queue = nil
	for _, a := range q {
		w.note("%s performs %s", n.name, a)
		n.sn.Perform(ctx, a)
	}
}

// coordinate is daemon/node's coordinate loop for one tick: lease changes
// and reports become events, the machine ticks, its actions go to the
// nodes' queues.
func (w *world) coordinate(ctx context.Context) {
	alive, err := w.coord.Nodes(ctx)
	if err != nil {
		panic(err) // the coordinator's view is never cut
	}
	for _, name := range nodeNames {
		info, up := alive[name]
		// A new registration (a restart, or a node back from fencing
		// itself) is a Put of the liveness key, which WatchNodes reports
		// as alive: the machine hears NodeReturned even when the old
		// lease had not expired yet.
		again := up && w.live[name] && !info.Started.Equal(w.started[name])
		if up {
			w.started[name] = info.Started
		}
		switch {
		case up && (!w.live[name] || again):
			w.live[name] = true
			w.stepEv(cluster.NodeReturned{Node: name})
		case !up && w.live[name]:
			delete(w.live, name)
			w.note("coordinator: lease of %s expired", name)
			w.stepEv(cluster.LeaseExpired{Node: name})
		}
	}
	w.coordinateReports()
	w.m.Tick()
	for _, name := range nodeNames {
		if w.live[name] {
			w.stepEv(cluster.Heartbeat{Node: name})
		}
	}
	w.dispatch()
	w.publishView(ctx)
}

// publishView writes the machine's view where the nodes read it, as
// daemon/node's coordinator does when its decisions change: an owner
// leaves out of its re-adds the drives the coordinator holds failed.
func (w *world) publishView(ctx context.Context) {
	v := struct {
		Coordinator string              `json:"coordinator"`
		Time        time.Time           `json:"time"`
		Nodes       []cluster.NodeView  `json:"nodes"`
		Arrays      []cluster.ArrayView `json:"arrays"`
	}{Coordinator: "coordinator", Time: w.clk.Now(), Nodes: w.m.Nodes(), Arrays: w.m.Arrays()}
	b, _ := json.Marshal([]any{v.Nodes, v.Arrays})
	if string(b) == w.lastView {
		return
	}
	if _, err := w.coord.Put(ctx, store.Observed, "cluster", "view", v); err != nil {
		panic(err) // the coordinator's view is never cut
	}
	w.lastView = string(b)
}

func (w *world) coordinateReports() {
	ctx := context.Background()
	cli := w.coord.Client()
	prefix := "/tier0/" + w.cfg.Cluster + "/reports/"
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		panic(err)
	}
	for _, kv := range resp.Kvs {
		_, _ = cli.Delete(ctx, string(kv.Key))
		ev, from, err := node.DecodeReport(kv.Value)
		if err != nil {
			w.note("bad report: %v", err)
			continue
		}
		w.note("report from %s: %T %+v", from, ev, ev)
		w.stepEv(ev)
	}
	w.dispatch()
}

func (w *world) stepEv(ev cluster.Event) {
	if err := w.m.Step(ev); err != nil {
		w.note("machine refused %T: %v", ev, err)
	}
}

func (w *world) dispatch() {
	for round := 0; round < 8; round++ {
		acts := w.m.Ready()
		if len(acts) == 0 {
			return
		}
		for _, a := range acts {
			p := a.Performer()
			if p == "" {
				continue // events and Slurm: the coordinator's own
			}
			if n := w.nodes[p]; n != nil {
				n.queue = append(n.queue, a)
			}
		}
	}
}

// checkServing: two nodes must never both accept I/O for the array.
func (w *world) checkServing() {
	var serving []string
	for _, name := range nodeNames {
		n := w.nodes[name]
		if !n.running() || n.sn.Fenced() {
			continue
		}
		if e, opt := n.sn.Serving(arrayName); opt && n.lease != nil && n.lease.Held() {
			serving = append(serving, fmt.Sprintf("%s@%d", name, e))
		}
	}
	if len(serving) > 1 {
		w.violate("array %s is served optimized by %s at once", arrayName, strings.Join(serving, " and "))
	}
}

// paths are the nodes a host would send I/O to: ANA optimized ones that
// answer (running).
func (w *world) paths() []*simNode {
	var out []*simNode
	for _, name := range nodeNames {
		n := w.nodes[name]
		if n.running() {
			if _, opt := n.sn.Serving(arrayName); opt {
				out = append(out, n)
			}
		}
	}
	return out
}

func (w *world) op() {
	ps := w.paths()
	if len(ps) == 0 {
		return
	}
	n := ps[w.rng.IntN(len(ps))]
	unit := w.rng.IntN(units)
	dev := n.sn.Device(arrayName)
	if w.rng.IntN(2) == 0 {
		w.write(n.name, dev, unit)
	} else {
		w.read(n.name, dev, unit, 0)
	}
}

func (w *world) write(via string, dev blockdev.Device, unit int) {
	w.gen++
	g := w.gen
	buf := block(unit, g)
	w.seq++
	call := w.seq
	_, err := dev.WriteAt(buf, int64(unit)*4096)
	w.seq++
	op := history.Op{Unit: int32(unit), Kind: history.Write, Value: g, Call: call, Return: w.seq}
	if err != nil {
		op.Outcome = history.Unknown
	}
	w.ops = append(w.ops, op)
	w.note("write unit %d gen %d via %s: %v", unit, g, via, err)
}

func (w *world) read(via string, dev blockdev.Device, unit int, client int32) {
	buf := make([]byte, 4096)
	w.seq++
	call := w.seq
	_, err := dev.ReadAt(buf, int64(unit)*4096)
	w.seq++
	if err != nil {
		w.note("read unit %d via %s: %v", unit, via, err)
		return
	}
	v := value(unit, buf)
	w.ops = append(w.ops, history.Op{Unit: int32(unit), Kind: history.Read, Value: v, Client: client, Call: call, Return: w.seq})
	if v == history.Foreign {
		// Name the block's own unit and generation: which write landed here.
		w.note("read unit %d via %s: foreign block of unit %d gen %d", unit, via, binary.LittleEndian.Uint64(buf[8:]), binary.LittleEndian.Uint64(buf[16:]))
		return
	}
	w.note("read unit %d via %s: gen %d", unit, via, v)
}

// finalRead reads every unit through a path, once the faults are over;
// it reports whether a node served the array.
func (w *world) finalRead() bool {
	ps := w.paths()
	if len(ps) == 0 {
		w.note("final read: no node serves the array after the faults ended")
		return false
	}
	for u := range units {
		w.read(ps[0].name, ps[0].sn.Device(arrayName), u, -1)
	}
	return true
}

// A workload block: magic, unit, generation, CRC, then the generation's
// low byte.
const magic = "T0SIMBLK"

func block(unit int, gen uint64) []byte {
	b := make([]byte, 4096)
	copy(b, magic)
	binary.LittleEndian.PutUint64(b[8:], uint64(unit))
	binary.LittleEndian.PutUint64(b[16:], gen)
	for i := 28; i < len(b); i++ {
		b[i] = byte(gen)
	}
	binary.LittleEndian.PutUint32(b[24:], crc32.ChecksumIEEE(append(b[:24:24], b[28:]...)))
	return b
}

func value(unit int, b []byte) uint64 {
	zero := true
	for _, c := range b {
		if c != 0 {
			zero = false
			break
		}
	}
	if zero {
		return history.Unwritten
	}
	if string(b[:8]) != magic || binary.LittleEndian.Uint32(b[24:]) != crc32.ChecksumIEEE(append(b[:24:24], b[28:]...)) {
		return history.Torn
	}
	if int(binary.LittleEndian.Uint64(b[8:])) != unit {
		return history.Foreign
	}
	return binary.LittleEndian.Uint64(b[16:])
}

// isolate cuts (or restores) every link to and from a node.
func (f *Fabric) isolate(name string, cut bool) {
	for _, o := range nodeNames {
		if o != name {
			f.Cut(name, o, cut)
			f.Cut(o, name, cut)
		}
	}
}
