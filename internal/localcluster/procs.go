package localcluster

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options say how Procs starts each node's tier0d.
type Options struct {
	// Binary is the tier0d executable.
	Binary string
	// Site is the site file the processes run with (--site).
	Site string
	// Workdir is the processes' TIER0_WORK (absolute).
	Workdir string
	// LogDir receives one log per node, NODE.log, appended across
	// restarts (default: Workdir).
	LogDir string
	// Args come after `--site SITE --node NODE` (e.g. --log-level info).
	Args []string
	// Netns, when set, names the network namespace node runs in ("" for
	// none): the command becomes `ip netns exec NS tier0d ...`, which
	// execs tier0d in place, so the PID stays the daemon's.
	Netns func(node string) string
	// PIDFile, when set, lists the PID and node of every process started,
	// rewritten at each start and removed by Stop (StopStale reads it).
	PIDFile string
	// Logger (default: discard).
	Logger *slog.Logger
}

// Procs is the set of tier0d processes of one local cluster.
type Procs struct {
	o       Options
	mu      sync.Mutex
	env     []string
	procs   map[string]*proc
	started []int // every PID ever started
	onStart func(node string, pid int)
}

type proc struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process has been reaped
	frozen bool
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// New returns the processes of o's site, none started. Their environment
// is this process's with TIER0_WORK set to o.Workdir.
func New(o Options) *Procs {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.LogDir == "" {
		o.LogDir = o.Workdir
	}
	env := append(os.Environ(), "TIER0_WORK="+o.Workdir)
	return &Procs{o: o, env: env, procs: map[string]*proc{}}
}

// SetEnv sets key=value in the environment of every tier0d started from
// now on.
func (ps *Procs) SetEnv(key, value string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	env := make([]string, 0, len(ps.env)+1)
	for _, kv := range ps.env {
		if !strings.HasPrefix(kv, key+"=") {
			env = append(env, kv)
		}
	}
	ps.env = append(env, key+"="+value)
}

// Env is the environment the next tier0d starts with.
func (ps *Procs) Env() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return append([]string(nil), ps.env...)
}

// OnStart makes f (nil: nothing) be told of every tier0d started from now
// on, under Procs' lock; it returns the one it replaces.
func (ps *Procs) OnStart(f func(node string, pid int)) (old func(node string, pid int)) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	old, ps.onStart = ps.onStart, f
	return old
}

// LogDir is the folder of the node logs.
func (ps *Procs) LogDir() string { return ps.o.LogDir }

// LogPath is node's log file.
func (ps *Procs) LogPath(node string) string { return filepath.Join(ps.o.LogDir, node+".log") }

// Start starts node's tier0d (it must not be running), its output
// appended to LogPath(node).
func (ps *Procs) Start(node string) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.procs[node]; p != nil && !p.exited() {
		return fmt.Errorf("tier0d for node %s is already running (pid %d); kill or stop it first", node, p.cmd.Process.Pid)
	}
	if err := os.MkdirAll(ps.o.LogDir, 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(ps.LogPath(node), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	argv := append([]string{ps.o.Binary, "--site", ps.o.Site, "--node", node}, ps.o.Args...)
	if ps.o.Netns != nil {
		if ns := ps.o.Netns(node); ns != "" {
			argv = append([]string{"ip", "netns", "exec", ns}, argv...)
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = ps.env
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group (a Ctrl-C on the terminal reaches only us; we
	// stop the children in order), and killed with us if we die rather
	// than linger and hold the ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("start tier0d for node %s (%s): %w", node, ps.o.Binary, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	ps.procs[node] = p
	ps.started = append(ps.started, cmd.Process.Pid)
	if ps.onStart != nil {
		ps.onStart(node, cmd.Process.Pid)
	}
	ps.o.Logger.Info("tier0d started", "node", node, "pid", cmd.Process.Pid)
	return ps.writePIDs()
}

func (ps *Procs) writePIDs() error {
	if ps.o.PIDFile == "" {
		return nil
	}
	var b strings.Builder
	for n, p := range ps.procs {
		fmt.Fprintf(&b, "%d %s\n", p.cmd.Process.Pid, n)
	}
	return os.WriteFile(ps.o.PIDFile, []byte(b.String()), 0o644)
}

// running returns node's process if it runs (frozen counts as running).
func (ps *Procs) running(node string) (*proc, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.procs[node]
	if p == nil {
		return nil, fmt.Errorf("no tier0d was started for node %s", node)
	}
	if p.exited() {
		return nil, fmt.Errorf("tier0d of node %s is not running (it exited: %v)", node, p.cmd.ProcessState)
	}
	return p, nil
}

// Running reports whether node's tier0d runs (frozen counts as running).
func (ps *Procs) Running(node string) bool {
	_, err := ps.running(node)
	return err == nil
}

// Frozen reports whether node's tier0d was stopped by Freeze and not
// thawed.
func (ps *Procs) Frozen(node string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.procs[node]
	return p != nil && p.frozen
}

// Kill sends SIGKILL to node's tier0d and returns when it is reaped, with
// the time of the kill.
func (ps *Procs) Kill(node string) (time.Time, error) {
	p, err := ps.running(node)
	if err != nil {
		return time.Time{}, err
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return time.Time{}, fmt.Errorf("kill -9 tier0d of node %s (pid %d): %w", node, p.cmd.Process.Pid, err)
	}
	at := time.Now()
	<-p.done
	ps.o.Logger.Info("tier0d killed", "node", node)
	return at, nil
}

// Freeze stops node's tier0d with SIGSTOP: it keeps its sockets but does
// nothing, like a node cut off or paused (it cannot renew its lease).
func (ps *Procs) Freeze(node string) error { return ps.pause(node, true) }

// Thaw resumes a frozen node with SIGCONT.
func (ps *Procs) Thaw(node string) error { return ps.pause(node, false) }

func (ps *Procs) pause(node string, stop bool) error {
	p, err := ps.running(node)
	if err != nil {
		return err
	}
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%v to tier0d of node %s (pid %d): %w", sig, node, p.cmd.Process.Pid, err)
	}
	ps.mu.Lock()
	p.frozen = stop
	ps.mu.Unlock()
	return nil
}

// Exited reports the nodes whose tier0d has exited, each with how (as
// "NODE (exit status 1)"); a node Kill killed counts too until restarted.
func (ps *Procs) Exited() []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []string
	for n, p := range ps.procs {
		if p.exited() {
			out = append(out, fmt.Sprintf("%s (%v)", n, p.cmd.ProcessState))
		}
	}
	return out
}

// Stop stops every process: SIGCONT (a frozen one must run to stop) and
// SIGTERM, then SIGKILL for those still running after grace. It removes
// the PID file.
func (ps *Procs) Stop(grace time.Duration) {
	ps.mu.Lock()
	procs := make(map[string]*proc, len(ps.procs))
	for n, p := range ps.procs {
		procs[n] = p
	}
	ps.mu.Unlock()
	for _, p := range procs {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	// closed, not sent on: every process still running at the deadline
	// is killed, not only the first one waited for
	expired := make(chan struct{})
	t := time.AfterFunc(grace, func() { close(expired) })
	defer t.Stop()
	for n, p := range procs {
		select {
		case <-p.done:
		case <-expired:
			ps.o.Logger.Warn("tier0d did not stop in time; killing it", "node", n, "pid", p.cmd.Process.Pid)
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	for _, p := range procs {
		if !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	}
	if ps.o.PIDFile != "" {
		_ = os.Remove(ps.o.PIDFile)
	}
}

// PIDs returns the PID of every process started (running or not).
func (ps *Procs) PIDs() []int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return append([]int(nil), ps.started...)
}
