package localslurm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Bins are the programs a local Slurm runs.
var Bins = []string{"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/scontrol", "/usr/bin/sbatch", "/usr/sbin/munged", "/usr/bin/setpriv"}

// ErrNoPorts: no free range of loopback ports for slurmctld and the
// slurmds was found.
var ErrNoPorts = errors.New("no free ports for a local Slurm")

// Missing says why a local Slurm cannot run here, or "".
func Missing() string {
	if os.Geteuid() != 0 {
		return "a local Slurm needs root (slurmd and slurmctld run as root, munged as munge)"
	}
	for _, b := range Bins {
		if _, err := os.Stat(b); err != nil {
			return fmt.Sprintf("%s is not installed: install slurmctld slurmd slurm-client munge (make deps, scripts/deps.d/slurm.sh)", b)
		}
	}
	if _, err := user.Lookup("munge"); err != nil {
		return fmt.Sprintf("no munge user to run munged (%v): is the munge package installed?", err)
	}
	return ""
}

// Options describe the cluster.
type Options struct {
	Dir   string   // everything lives below it; every folder above it must be searchable by others (munged insists)
	Nodes []string // Slurm node names, one slurmd each

	ClusterName string // [tier0local]
	Partition   string // the one partition, of every node [tier0]
	Comment     string // first line of slurm.conf, after "# "

	// Prolog, Epilog and HealthCheck are the programs slurmd runs (absolute
	// paths: Slurm runs them without PATH); "" leaves one unset.
	Prolog, Epilog, HealthCheck string
	HealthCheckInterval         int // seconds [5]

	// PortBase is slurmctld's first candidate port (and PortBase+1 is kept
	// free); the slurmds take consecutive ports from PortBase+184. Up to
	// 20 ranges 100 apart are tried. [26817]
	PortBase int
	// IdleTimeout bounds the wait for every node to be idle [60 s].
	IdleTimeout time.Duration
}

// Cluster is a local Slurm. Conf is its slurm.conf (SLURM_CONF); logs
// are in Dir/log.
type Cluster struct {
	Dir, Conf string
	Nodes     []string
	o         Options
	procs     []*exec.Cmd
}

// Start is New and then StartSlurm: it returns once every node is idle.
// On an error what it started is stopped.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	c, err := New(ctx, o)
	if err != nil {
		return nil, err
	}
	if err := c.StartSlurm(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// New prepares the folder, starts munged and writes slurm.conf; Slurm's
// own daemons start with StartSlurm. On an error what it started is
// stopped.
func New(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.ClusterName == "" {
		o.ClusterName = "tier0local"
	}
	if o.Partition == "" {
		o.Partition = "tier0"
	}
	if o.HealthCheckInterval == 0 {
		o.HealthCheckInterval = 5
	}
	if o.PortBase == 0 {
		o.PortBase = 26817
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 60 * time.Second
	}
	dir := o.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for p := dir; p != "/" && p != "."; p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o001 == 0 {
			return nil, fmt.Errorf("local Slurm folder %s: %s is not searchable by others, which munged refuses; use a folder below a world-searchable one", dir, p)
		}
	}
	c = &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), Nodes: o.Nodes, o: o}
	defer func() {
		if err != nil {
			c.Stop()
			c = nil
		}
	}()
	for _, d := range []string{"munge", "state", "log", "bin", "spool"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return c, err
		}
	}
	key := make([]byte, 128)
	_, _ = rand.Read(key)
	if err := os.WriteFile(filepath.Join(dir, "munge", "key"), key, 0o400); err != nil {
		return c, err
	}
	if out, err := exec.Command("chown", "-R", "munge:munge", filepath.Join(dir, "munge")).CombinedOutput(); err != nil {
		return c, fmt.Errorf("chown munge:munge %s: %v: %s (is the munge package installed?)", filepath.Join(dir, "munge"), err, bytes.TrimSpace(out))
	}
	sock := filepath.Join(dir, "munge", "sock")
	if err := c.start("munged", "/usr/bin/setpriv", "--reuid=munge", "--regid=munge", "--init-groups", "/usr/sbin/munged", "-F",
		"-S", sock, "--key-file="+filepath.Join(dir, "munge", "key"), "--pid-file="+filepath.Join(dir, "munge", "pid"),
		"--seed-file="+filepath.Join(dir, "munge", "seed"), "--log-file="+filepath.Join(dir, "munge", "log")); err != nil {
		return c, err
	}
	if err := c.WaitFor(ctx, "munged's socket", 15*time.Second, func() (bool, string) {
		_, err := os.Stat(sock)
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		return c, err
	}
	ctld, first, err := ports(o.PortBase, len(o.Nodes))
	if err != nil {
		return c, err
	}
	return c, os.WriteFile(c.Conf, []byte(c.conf(sock, ctld, first)), 0o644)
}

// conf is slurm.conf.
func (c *Cluster) conf(sock string, ctld, first int) string {
	o, dir := c.o, c.Dir
	var b strings.Builder
	if o.Comment != "" {
		fmt.Fprintf(&b, "# %s\n", o.Comment)
	}
	fmt.Fprintf(&b, `ClusterName=%s
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%s
CredType=cred/munge
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool/%%n
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd-%%n.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd-%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
ReturnToService=1
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
PrologFlags=Alloc
`, o.ClusterName, ctld, first, sock, dir)
	if o.Prolog != "" {
		fmt.Fprintf(&b, "Prolog=%s\n", o.Prolog)
	}
	if o.Epilog != "" {
		fmt.Fprintf(&b, "Epilog=%s\n", o.Epilog)
	}
	if o.HealthCheck != "" {
		fmt.Fprintf(&b, "HealthCheckProgram=%s\nHealthCheckInterval=%d\nHealthCheckNodeState=ANY\n", o.HealthCheck, o.HealthCheckInterval)
	}
	for i, n := range o.Nodes {
		fmt.Fprintf(&b, "NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=1 RealMemory=1000\n", n, first+i)
	}
	fmt.Fprintf(&b, "PartitionName=%s Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n", o.Partition)
	return b.String()
}

// ports finds slurmctld's port (and the one above it) and n consecutive
// slurmd ports free on 127.0.0.1.
func ports(base, n int) (ctld, first int, err error) {
	for k := 0; k < 20; k++ {
		ctld, first = base+100*k, base+184+100*k
		ok := true
		for _, p := range append([]int{ctld, ctld + 1}, seq(first, n)...) {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return ctld, first, nil
		}
	}
	return 0, 0, fmt.Errorf("%w (tried slurmctld %d+100k and slurmd %d+100k, k<20, on 127.0.0.1): stop other local Slurms or pick another PortBase", ErrNoPorts, base, base+184)
}

func seq(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

// StartSlurm starts slurmctld and a slurmd for each node, and returns
// once every node is idle.
func (c *Cluster) StartSlurm(ctx context.Context) error {
	if err := c.start("slurmctld", "/usr/sbin/slurmctld", "-D"); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := os.MkdirAll(filepath.Join(c.Dir, "spool", n), 0o755); err != nil {
			return err
		}
		if err := c.start("slurmd-"+n, "/usr/sbin/slurmd", "-D", "-N", n); err != nil {
			return err
		}
	}
	return c.WaitFor(ctx, "every Slurm node idle", c.o.IdleTimeout, func() (bool, string) {
		out, err := c.Scontrol(ctx, "show", "nodes", "-o")
		if err != nil {
			return false, err.Error()
		}
		idle := strings.Count(out, "State=IDLE ")
		return idle == len(c.Nodes), fmt.Sprintf("%d of %d nodes idle: %s", idle, len(c.Nodes), oneLine(out, 300))
	})
}

// start runs a Slurm or munge daemon in the foreground as a child, in its
// own process group, output to log/NAME.out.
func (c *Cluster) start(name string, argv ...string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.Conf)
	out, err := os.Create(filepath.Join(c.Dir, "log", name+".out"))
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s (%s): %v", name, argv[0], err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

// WaitFor polls ok every 200 ms until it holds, for at most d; the error
// names what was awaited, ok's last reason and the log folder.
func (c *Cluster) WaitFor(ctx context.Context, what string, d time.Duration, ok func() (bool, string)) error {
	deadline := time.Now().Add(d)
	for {
		done, why := ok()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("local Slurm: no %s after %v (%s); logs in %s", what, d, why, filepath.Join(c.Dir, "log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Scontrol runs /usr/bin/scontrol against this Slurm.
func (c *Cluster) Scontrol(ctx context.Context, args ...string) (string, error) {
	return c.Run(ctx, "/usr/bin/scontrol", args...)
}

// Run runs a Slurm client program (bin) against this Slurm, in Dir, for
// at most 15 s, and returns its output.
func (c *Cluster) Run(ctx context.Context, bin string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.Conf)
	cmd.Dir = c.Dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, oneLine(string(out), 300))
	}
	return string(out), nil
}

// Job submits a batch job named name that runs `true` on every node
// (sbatch -N) and waits until it has COMPLETED; it returns the job ID.
func (c *Cluster) Job(ctx context.Context, name string, timeout time.Duration) (string, error) {
	out, err := c.Run(ctx, "/usr/bin/sbatch", "--parsable", "-o", "/dev/null", "-N", strconv.Itoa(len(c.Nodes)), "-J", name, "--wrap", "true")
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(strings.Split(strings.TrimSpace(out), ";")[0])
	state := ""
	err = c.WaitFor(ctx, "job "+id+" COMPLETED", timeout, func() (bool, string) {
		j, err := c.Scontrol(ctx, "show", "job", "-o", id)
		if err != nil {
			return false, err.Error()
		}
		for _, f := range strings.Fields(j) {
			if v, ok := strings.CutPrefix(f, "JobState="); ok {
				state = v
			}
		}
		return state == "COMPLETED", "JobState=" + state + " " + oneLine(j, 300)
	})
	return id, err
}

// Stop shuts Slurm down (scontrol shutdown), then ends what is left of
// its processes by PID, munged last. A nil Cluster is a no-op.
func (c *Cluster) Stop() {
	if c == nil {
		return
	}
	if len(c.procs) > 1 {
		_, _ = c.Scontrol(context.Background(), "shutdown")
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		if i == 0 {
			_ = p.Process.Signal(syscall.SIGTERM) // munged (through setpriv)
		}
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	c.procs = nil
}

// oneLine folds s onto one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}
