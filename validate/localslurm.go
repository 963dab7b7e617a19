package validate

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The programs a local Slurm needs (Debian's slurmctld, slurmd,
// slurm-client and munge packages; scripts/deps.d/slurm.sh).
var localSlurmBins = []string{"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/scontrol", "/usr/bin/sbatch", "/usr/sbin/munged", "/usr/bin/setpriv"}

// localSlurmMissing says why a local Slurm cannot run here, or "".
func localSlurmMissing() string {
	if os.Geteuid() != 0 {
		return "a local Slurm needs root (slurmd and slurmctld run as root, munged as munge)"
	}
	for _, b := range localSlurmBins {
		if _, err := os.Stat(b); err != nil {
			return fmt.Sprintf("%s is not installed: install slurmctld slurmd slurm-client munge (make deps, scripts/deps.d/slurm.sh)", b)
		}
	}
	return ""
}

// localSlurm is a throw-away Slurm cluster on this machine: its own munged
// (own key and socket), slurmctld and one slurmd per node (slurmd -N), on
// 127.0.0.1 only, whose Prolog, Epilog and HealthCheckProgram are the
// real hook wrappers (slurm-plugin/scripts) running a tier0 binary with a
// hooks configuration. Everything lives under dir.
type localSlurm struct {
	dir   string
	conf  string // slurm.conf (SLURM_CONF)
	nodes []string
	procs []*exec.Cmd
}

// hookWrapper is slurm-plugin/scripts/tier0-HOOK with its TIER0= and
// CONFIG= lines set: Slurm runs hooks without PATH, so every path is
// absolute.
func hookWrapper(hook, tier0, conf string) string {
	return fmt.Sprintf(`#!/bin/sh
# tier0 Slurm %s hook (slurm-plugin/scripts/tier0-%[1]s), written by tier0 validate --local-slurm
TIER0=%s
CONFIG=%s
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
exec "$TIER0" slurm %[1]s --config "$CONFIG"
`, hook, tier0, conf)
}

// slurmPorts finds slurmctld's port and n consecutive slurmd ports free
// on 127.0.0.1.
func slurmPorts(n int) (ctld, first int, err error) {
	for k := 0; k < 20; k++ {
		ctld, first = 26817+100*k, 27001+100*k
		ok := true
		for _, p := range append([]int{ctld}, seq(first, n)...) {
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
	return 0, 0, fmt.Errorf("no free ports for a local Slurm (tried slurmctld 26817+100k and slurmd 27001+100k, k<20, on 127.0.0.1)")
}

func seq(first, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = first + i
	}
	return out
}

// startLocalSlurm starts munged, slurmctld and a slurmd for each of nodes
// (Slurm node names) under dir, with the hooks running tier0 (a binary)
// with the hooks configuration hooksConf, and returns once every node is
// idle. On an error what it started is stopped.
func startLocalSlurm(ctx context.Context, dir string, nodes []string, tier0, hooksConf string) (s *localSlurm, err error) {
	// munged refuses a socket below a directory that others cannot search.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for p := dir; p != "/" && p != "."; p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o001 == 0 {
			return nil, fmt.Errorf("local Slurm folder %s: %s is not searchable by others, which munged refuses; use an --out folder below a world-searchable one", dir, p)
		}
	}
	s = &localSlurm{dir: dir, conf: filepath.Join(dir, "slurm.conf"), nodes: nodes}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	for _, d := range []string{"munge", "state", "log", "bin", "spool"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return s, err
		}
	}
	key := make([]byte, 128)
	_, _ = rand.Read(key)
	if err := os.WriteFile(filepath.Join(dir, "munge", "key"), key, 0o400); err != nil {
		return s, err
	}
	if out, err := exec.Command("chown", "-R", "munge:munge", filepath.Join(dir, "munge")).CombinedOutput(); err != nil {
		return s, fmt.Errorf("chown munge:munge %s: %v: %s (is the munge package installed?)", filepath.Join(dir, "munge"), err, bytes.TrimSpace(out))
	}
	sock := filepath.Join(dir, "munge", "sock")
	if err := s.start("munged", "/usr/bin/setpriv", "--reuid=munge", "--regid=munge", "--init-groups", "/usr/sbin/munged", "-F",
		"-S", sock, "--key-file="+filepath.Join(dir, "munge", "key"), "--pid-file="+filepath.Join(dir, "munge", "pid"),
		"--seed-file="+filepath.Join(dir, "munge", "seed"), "--log-file="+filepath.Join(dir, "munge", "log")); err != nil {
		return s, err
	}
	if err := s.waitFor(ctx, "munged's socket", 15*time.Second, func() (bool, string) {
		_, err := os.Stat(sock)
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		return s, err
	}
	for _, h := range []string{"prolog", "epilog", "healthcheck"} {
		if err := os.WriteFile(filepath.Join(dir, "bin", "tier0-"+h), []byte(hookWrapper(h, tier0, hooksConf)), 0o755); err != nil {
			return s, err
		}
	}
	ctld, first, err := slurmPorts(len(nodes))
	if err != nil {
		return s, err
	}
	var nodeLines strings.Builder
	for i, n := range nodes {
		fmt.Fprintf(&nodeLines, "NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=1 RealMemory=1000\n", n, first+i)
	}
	conf := fmt.Sprintf(`# A throw-away Slurm for tier0 validate --local-slurm (127.0.0.1 only)
ClusterName=tier0validate
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%s
CredType=cred/munge
StateSaveLocation=%[3]s/state
SlurmdSpoolDir=%[3]s/spool/%%n
SlurmctldPidFile=%[3]s/slurmctld.pid
SlurmdPidFile=%[3]s/slurmd-%%n.pid
SlurmctldLogFile=%[3]s/log/slurmctld.log
SlurmdLogFile=%[3]s/log/slurmd-%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
ReturnToService=1
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
Prolog=%[3]s/bin/tier0-prolog
Epilog=%[3]s/bin/tier0-epilog
PrologFlags=Alloc
HealthCheckProgram=%[3]s/bin/tier0-healthcheck
HealthCheckInterval=5
HealthCheckNodeState=ANY
%sPartitionName=tier0 Nodes=ALL Default=YES MaxTime=INFINITE State=UP
`, ctld, sock, dir, nodeLines.String())
	if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
		return s, err
	}
	if err := s.start("slurmctld", "/usr/sbin/slurmctld", "-D"); err != nil {
		return s, err
	}
	for _, n := range nodes {
		if err := os.MkdirAll(filepath.Join(dir, "spool", n), 0o755); err != nil {
			return s, err
		}
		if err := s.start("slurmd-"+n, "/usr/sbin/slurmd", "-D", "-N", n); err != nil {
			return s, err
		}
	}
	err = s.waitFor(ctx, "every Slurm node idle", 60*time.Second, func() (bool, string) {
		out, err := s.scontrol(ctx, "show", "nodes", "-o")
		if err != nil {
			return false, err.Error()
		}
		idle := strings.Count(out, "State=IDLE ")
		return idle == len(nodes), fmt.Sprintf("%d of %d nodes idle: %s", idle, len(nodes), oneLine(out, 300))
	})
	return s, err
}

// start runs a Slurm or munge daemon in the foreground as a child, in its
// own process group, output to log/NAME.out.
func (s *localSlurm) start(name string, argv ...string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+s.conf)
	out, err := os.Create(filepath.Join(s.dir, "log", name+".out"))
	if err != nil {
		return err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s (%s): %v", name, argv[0], err)
	}
	s.procs = append(s.procs, cmd)
	return nil
}

func (s *localSlurm) waitFor(ctx context.Context, what string, d time.Duration, ok func() (bool, string)) error {
	deadline := time.Now().Add(d)
	for {
		done, why := ok()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("local Slurm: no %s after %v (%s); logs in %s", what, d, why, filepath.Join(s.dir, "log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scontrol runs /usr/bin/scontrol against this Slurm.
func (s *localSlurm) scontrol(ctx context.Context, args ...string) (string, error) {
	return s.run(ctx, "/usr/bin/scontrol", args...)
}

func (s *localSlurm) run(ctx context.Context, bin string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+s.conf)
	cmd.Dir = s.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", filepath.Base(bin), strings.Join(args, " "), err, oneLine(string(out), 300))
	}
	return string(out), nil
}

// job submits a batch job that runs `true` on every node (sbatch -N) and
// waits until it has COMPLETED; it returns the job ID.
func (s *localSlurm) job(ctx context.Context, timeout time.Duration) (string, error) {
	out, err := s.run(ctx, "/usr/bin/sbatch", "--parsable", "-o", "/dev/null", "-N", strconv.Itoa(len(s.nodes)), "-J", "tier0-validate", "--wrap", "true")
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(strings.Split(strings.TrimSpace(out), ";")[0])
	state := ""
	err = s.waitFor(ctx, "job "+id+" COMPLETED", timeout, func() (bool, string) {
		j, err := s.scontrol(ctx, "show", "job", "-o", id)
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

// stop shuts Slurm down (scontrol shutdown), then ends what is left of
// its processes by PID, munged last.
func (s *localSlurm) stop() {
	if s == nil {
		return
	}
	if len(s.procs) > 1 {
		_, _ = s.scontrol(context.Background(), "shutdown")
	}
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
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
	s.procs = nil
}
