package validate

import (
	"bytes"
	"fmt"
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

// nodeControl kills and restarts one node's tier0d: the failover story's
// only disruptive actions. localCluster implements it for --local; on an
// existing cluster (--allow-disruptive) it is a clusterControl.
type nodeControl interface {
	// kill stops node's tier0d at once (SIGKILL) and returns the time of
	// the kill once the process is gone.
	kill(node string) (time.Time, error)
	// start starts node's tier0d again.
	start(node string) error
}

// clusterControl kills and restarts tier0d on an existing cluster: with
// the operator's commands (--kill-command, --start-command, run by sh -c
// with TIER0_NODE and TIER0_NODE_ADDR set, for example
// `ssh $TIER0_NODE_ADDR systemctl kill -s KILL tier0d`), or, without
// them, when node's tier0d runs on this machine: found in /proc by its
// `--node NAME` argument, killed by PID and restarted detached with the
// command line, environment and working directory it had.
type clusterControl struct {
	cfg      *config.Config
	killCmd  string
	startCmd string
	logDir   string // where a restarted process's output goes
	mu       sync.Mutex
	killed   map[string]procImage
	procRoot string // "/proc"
	// match, when set, narrows the processes considered (tests: their
	// own fakes only).
	match     func(argv []string) bool
	sigkill   func(pid int) error
	waitGone  time.Duration
	startProc func(img procImage, log *os.File) error
}

// procImage is what is needed to start a process again as it was.
type procImage struct {
	pid  int
	exe  string // the executable, from /proc/PID/exe (argv[0] may be a bare name)
	argv []string
	env  []string
	cwd  string
}

func newClusterControl(cfg *config.Config, killCmd, startCmd, logDir string) *clusterControl {
	return &clusterControl{
		cfg: cfg, killCmd: killCmd, startCmd: startCmd, logDir: logDir,
		killed: map[string]procImage{}, procRoot: "/proc", waitGone: 10 * time.Second,
		sigkill:   func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) },
		startProc: startDetached,
	}
}

func (c *clusterControl) nodeEnv(node string) []string {
	env := append(os.Environ(), "TIER0_NODE="+node)
	if n, ok := c.cfg.Node(node); ok {
		env = append(env, "TIER0_NODE_ADDR="+n.Address)
	}
	return env
}

func (c *clusterControl) run(what, script, node string) error {
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = c.nodeEnv(node)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s for node %s (%q): %v: %s", what, node, script, err, oneLine(string(out), 300))
	}
	return nil
}

func (c *clusterControl) kill(node string) (time.Time, error) {
	if c.killCmd != "" {
		at := time.Now()
		return at, c.run("--kill-command", c.killCmd, node)
	}
	img, err := findTier0dProcMatching(c.procRoot, node, c.match)
	if err != nil {
		return time.Time{}, err
	}
	if err := c.sigkill(img.pid); err != nil {
		return time.Time{}, fmt.Errorf("kill -9 tier0d of node %s (pid %d): %w", node, img.pid, err)
	}
	at := time.Now()
	deadline := at.Add(c.waitGone)
	for procAlive(c.procRoot, img.pid) {
		if time.Now().After(deadline) {
			return at, fmt.Errorf("tier0d of node %s (pid %d) still runs %s after SIGKILL", node, img.pid, c.waitGone)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.mu.Lock()
	c.killed[node] = img
	c.mu.Unlock()
	return at, nil
}

func (c *clusterControl) start(node string) error {
	if c.startCmd != "" {
		return c.run("--start-command", c.startCmd, node)
	}
	c.mu.Lock()
	img, ok := c.killed[node]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("node %s: no --start-command given and its tier0d was not killed on this machine; pass --start-command (for example 'ssh $TIER0_NODE_ADDR systemctl start tier0d')", node)
	}
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(filepath.Join(c.logDir, node+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := c.startProc(img, lf); err != nil {
		return fmt.Errorf("restart tier0d of node %s (%s): %w", node, strings.Join(img.argv, " "), err)
	}
	return nil
}

// startDetached starts img in its own session, not as our child to keep:
// it outlives this process like the one it replaces.
func startDetached(img procImage, log *os.File) error {
	cmd := exec.Command(img.exe, img.argv[1:]...)
	cmd.Args[0] = img.argv[0]
	cmd.Env, cmd.Dir = img.env, img.cwd
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	return nil
}

// findTier0dProc finds the running tier0d of node under procRoot: a
// process whose executable is named tier0d and whose arguments include
// `--node NODE` (or --node=NODE).
func findTier0dProc(procRoot, node string) (procImage, error) {
	return findTier0dProcMatching(procRoot, node, nil)
}

func findTier0dProcMatching(procRoot, node string, match func([]string) bool) (procImage, error) {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return procImage{}, err
	}
	var found []procImage
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasSuffix(filepath.Base(argv[0]), "tier0d") || argNode(argv) != node || !procAlive(procRoot, pid) || (match != nil && !match(argv)) {
			continue
		}
		img := procImage{pid: pid, argv: argv}
		if env, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ")); err == nil {
			img.env = strings.Split(strings.TrimRight(string(env), "\x00"), "\x00")
		}
		img.cwd, _ = os.Readlink(filepath.Join(procRoot, e.Name(), "cwd"))
		img.exe, _ = os.Readlink(filepath.Join(procRoot, e.Name(), "exe"))
		if img.exe == "" || strings.HasSuffix(img.exe, " (deleted)") {
			img.exe = argv[0]
		}
		found = append(found, img)
	}
	switch len(found) {
	case 0:
		return procImage{}, fmt.Errorf("no tier0d with --node %s runs on this machine; pass --kill-command and --start-command to stop and start it where it runs (for example 'ssh $TIER0_NODE_ADDR systemctl kill -s KILL tier0d')", node)
	case 1:
		return found[0], nil
	}
	var pids []string
	for _, f := range found {
		pids = append(pids, strconv.Itoa(f.pid))
	}
	return procImage{}, fmt.Errorf("%d tier0d processes run with --node %s here (pids %s); pass --kill-command to say which to kill", len(found), node, strings.Join(pids, ", "))
}

func argNode(argv []string) string {
	for i, a := range argv {
		switch {
		case (a == "--node" || a == "-node") && i+1 < len(argv):
			return argv[i+1]
		case strings.HasPrefix(a, "--node="):
			return strings.TrimPrefix(a, "--node=")
		}
	}
	return ""
}

// procAlive: pid exists and is not a zombie.
func procAlive(procRoot string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}
