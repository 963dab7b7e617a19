package localcluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"tier0/daemon/config"
)

// PIDFile is the name, in the work directory, of the PID file of a
// `tier0 validate --local` run (Options.PIDFile), so that a later run can
// stop the tier0d processes of one that was killed before it could clean
// up (StopStale).
const PIDFile = "validate.pids"

// WorkPaths are the files and folders a local run of cfg creates under its
// work directory: drive files, the etcd data, node state, logs and the PID
// file. Only these are removed, never the whole work directory, so that a
// work directory given by mistake (a home folder) loses nothing else.
func WorkPaths(cfg *config.Config, work string) []string {
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
	out = append(out, dd, filepath.Join(work, "state"), filepath.Join(work, "logs"), filepath.Join(work, PIDFile))
	return out
}

func absIn(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// CleanWork removes what WorkPaths names, then every folder left empty
// below work (the per-node drive folders) and work itself if empty.
func CleanWork(cfg *config.Config, work string) error {
	var errs []error
	dirs := map[string]bool{}
	for _, p := range WorkPaths(cfg, work) {
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

// StopStale stops tier0d processes a previous, killed run left behind: the
// PIDs in the work directory's PID file that still run tier0d. It returns
// the PIDs it stopped.
func StopStale(work string) []int {
	f, err := os.Open(filepath.Join(work, PIDFile))
	if err != nil {
		return nil
	}
	defer f.Close()
	var stopped []int
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pid, err := strconv.Atoi(strings.Fields(sc.Text() + " x")[0])
		if err != nil || pid <= 1 || !IsTier0d(pid) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			stopped = append(stopped, pid)
		}
	}
	// Wait until they are gone (they are not our children: poll /proc).
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range stopped {
		for IsTier0d(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return stopped
}

// IsTier0d reports whether pid is a running (not zombie) tier0d.
func IsTier0d(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return strings.HasSuffix(filepath.Base(args[0]), "tier0d") && strings.Contains(string(b), "--node")
}
