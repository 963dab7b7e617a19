package validate

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"tier0/daemon/config"
)

// ErrPortBusy: a port the local cluster needs is taken by another program.
var ErrPortBusy = errors.New("port in use")

// pidFile is where a local run records the PIDs of the tier0d processes it
// started, so that a later run can stop them if this one was killed before
// it could clean up.
const pidFile = "validate.pids"

// localCluster runs one tier0d process per node of the site on this
// machine, as children of this process.
type localCluster struct {
	cfg     *config.Config
	bin     string // tier0d
	site    string // absolute path of the site config
	work    string // absolute work directory
	env     []string
	logDir  string
	tick    time.Duration
	log     *slog.Logger
	mu      sync.Mutex
	procs   map[string]*proc
	started []int // every PID ever started, for the PID file
	// onStart, when set, is told of every tier0d started (under mu).
	onStart func(node string, pid int)
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been reaped
	log  *os.File
}

func newLocalCluster(cfg *config.Config, bin, site, work string, log *slog.Logger) *localCluster {
	env := append(os.Environ(), "TIER0_WORK="+work)
	return &localCluster{
		cfg: cfg, bin: bin, site: site, work: work, env: env,
		logDir: filepath.Join(work, "logs"), log: log, procs: map[string]*proc{},
	}
}

// setEnv sets key=value in the environment of every tier0d started from
// now on.
func (lc *localCluster) setEnv(key, value string) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	env := make([]string, 0, len(lc.env)+1)
	for _, kv := range lc.env {
		if !strings.HasPrefix(kv, key+"=") {
			env = append(env, kv)
		}
	}
	lc.env = append(env, key+"="+value)
}

// workPaths are the files and folders a local run of cfg creates under its
// work directory: drive files, the etcd data, node state and logs. Only
// these are removed, never the whole work directory, so that a work
// directory given by mistake (a home folder) loses nothing else.
func workPaths(cfg *config.Config, work string) []string {
	var out []string
	for _, n := range cfg.Nodes {
		for _, d := range n.Drives {
			if d.Path != "" && d.Size > 0 {
				out = append(out, absIn(d.Path))
			}
		}
	}
	dd := cfg.ControlPlane.Etcd.DataDir
	if dd == "" {
		dd = "etcd"
	}
	if !filepath.IsAbs(dd) {
		dd = filepath.Join(work, dd)
	}
	for _, n := range cfg.Nodes {
		out = append(out, filepath.Join(dd, n.Name))
	}
	out = append(out, dd, filepath.Join(work, "state"), filepath.Join(work, "logs"), filepath.Join(work, pidFile))
	return out
}

func absIn(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// cleanWork removes what workPaths names, then every folder left empty
// below work (the per-node drive folders) and work itself if empty.
func cleanWork(cfg *config.Config, work string) error {
	var errs []error
	dirs := map[string]bool{}
	for _, p := range workPaths(cfg, work) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
		dirs[filepath.Dir(p)] = true
	}
	for d := range dirs {
		for d != work && strings.HasPrefix(d, work+string(filepath.Separator)) {
			if os.Remove(d) != nil {
				break
			}
			d = filepath.Dir(d)
		}
	}
	_ = os.Remove(work)
	return errors.Join(errs...)
}

// stopStale stops tier0d processes a previous, killed run left behind: the
// PIDs in the work directory's PID file that still run tier0d. It returns
// the PIDs it stopped.
func stopStale(work string) []int {
	f, err := os.Open(filepath.Join(work, pidFile))
	if err != nil {
		return nil
	}
	defer f.Close()
	var stopped []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pid, err := strconv.Atoi(strings.Fields(sc.Text() + " x")[0])
		if err != nil || pid <= 1 || !isTier0d(pid) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			stopped = append(stopped, pid)
		}
	}
	// Wait until they are gone (they are not our children: poll /proc).
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range stopped {
		for isTier0d(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return stopped
}

// isTier0d reports whether pid is a running (not zombie) tier0d.
func isTier0d(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return strings.HasSuffix(filepath.Base(args[0]), "tier0d") && strings.Contains(string(b), "--node")
}

// listenPort is one TCP port a node listens on.
type listenPort struct {
	Node, What, Addr string
}

// ports lists every TCP listener of the site's nodes.
func ports(cfg *config.Config) []listenPort {
	var out []listenPort
	for i := range cfg.Nodes {
		n := &cfg.Nodes[i]
		out = append(out,
			listenPort{n.Name, "backend", n.ListenAddr(n.Backend)},
			listenPort{n.Name, "frontend", n.ListenAddr(n.Frontend)},
			listenPort{n.Name, "api", n.ListenAddr(n.API)})
	}
	if len(cfg.ControlPlane.Etcd.Endpoints) == 0 {
		for _, p := range cfg.EtcdPeers() {
			for what, u := range map[string]string{"etcd client": p.ClientURL, "etcd peer": p.PeerURL} {
				_, port, err := net.SplitHostPort(strings.TrimPrefix(u, "http://"))
				if err == nil {
					out = append(out, listenPort{p.Node, what, net.JoinHostPort(p.ListenHost, port)})
				}
			}
		}
	}
	return out
}

// checkPorts tries to listen on every port; the error names each busy one
// and what to do.
func checkPorts(cfg *config.Config) error {
	var busy, more []string
	all := ports(cfg)
	for _, p := range all {
		l, err := net.Listen("tcp", p.Addr)
		if err != nil {
			_, port, _ := net.SplitHostPort(p.Addr)
			if len(busy) < 3 {
				busy = append(busy, fmt.Sprintf("%s (node %s %s): %v; find the holder with `ss -ltnp 'sport = :%s'` and stop it, or change the port in %s",
					p.Addr, p.Node, p.What, errors.Unwrap(err), port, cfg.File))
			} else {
				more = append(more, port)
			}
			continue
		}
		l.Close()
	}
	if len(busy) == 0 {
		return nil
	}
	msg := strings.Join(busy, "; ")
	if len(more) > 0 {
		msg += fmt.Sprintf("; and %d more: %s", len(more), strings.Join(more, ", "))
	}
	if len(busy)+len(more) == len(all) {
		msg += ". Every port of the site is taken: a cluster of this site seems to be running already (an earlier run with --keep, or one started by hand); stop its tier0d processes, or validate it without --local"
	}
	return fmt.Errorf("%w: %s", ErrPortBusy, msg)
}

// start launches node's tier0d, its output appended to logs/NODE.log.
func (lc *localCluster) start(node string) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if p := lc.procs[node]; p != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("tier0d for node %s is already running (pid %d)", node, p.cmd.Process.Pid)
		}
	}
	if err := os.MkdirAll(lc.logDir, 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(filepath.Join(lc.logDir, node+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := []string{"--site", lc.site, "--node", node, "--log-level", "info"}
	if lc.tick > 0 {
		args = append(args, "--tick", lc.tick.String())
	}
	cmd := exec.Command(lc.bin, args...)
	cmd.Env = lc.env
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group (a Ctrl-C on the terminal reaches only us; we
	// stop the children in order), and killed with us if we die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("start tier0d for node %s (%s): %w", node, lc.bin, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), log: lf}
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	lc.procs[node] = p
	lc.started = append(lc.started, cmd.Process.Pid)
	if lc.onStart != nil {
		lc.onStart(node, cmd.Process.Pid)
	}
	lc.log.Info("tier0d started", "node", node, "pid", cmd.Process.Pid)
	return lc.writePIDs()
}

func (lc *localCluster) writePIDs() error {
	var b strings.Builder
	for n, p := range lc.procs {
		fmt.Fprintf(&b, "%d %s\n", p.cmd.Process.Pid, n)
	}
	return os.WriteFile(filepath.Join(lc.work, pidFile), []byte(b.String()), 0o644)
}

// kill sends SIGKILL to node's tier0d and waits until it is reaped.
func (lc *localCluster) kill(node string) (time.Time, error) {
	lc.mu.Lock()
	p := lc.procs[node]
	lc.mu.Unlock()
	if p == nil {
		return time.Time{}, fmt.Errorf("no tier0d was started for node %s", node)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return time.Time{}, fmt.Errorf("kill -9 tier0d of node %s (pid %d): %w", node, p.cmd.Process.Pid, err)
	}
	at := time.Now()
	<-p.done
	return at, nil
}

// exited reports the nodes whose tier0d has exited (not killed by us).
func (lc *localCluster) exited() []string {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var out []string
	for n, p := range lc.procs {
		select {
		case <-p.done:
			out = append(out, fmt.Sprintf("%s (%v)", n, p.cmd.ProcessState))
		default:
		}
	}
	return out
}

// stopAll stops every process: SIGTERM, then SIGKILL after grace.
func (lc *localCluster) stopAll(grace time.Duration) {
	lc.mu.Lock()
	procs := lc.procs
	lc.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(grace)
	for n, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			lc.log.Warn("tier0d did not stop in time; killing it", "node", n, "pid", p.cmd.Process.Pid)
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	_ = os.Remove(filepath.Join(lc.work, pidFile))
}

// pids returns the PID of every process started (running or not).
func (lc *localCluster) pids() []int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return append([]int(nil), lc.started...)
}
