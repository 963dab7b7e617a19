package validate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"tier0/bench"
)

// hooksConfig is the Slurm hooks' configuration file (the YAML that
// `tier0 slurm ... --config` reads; slurm-plugin/program.Config), written
// for this run: every node's API, the site's scontrol and slurm.conf, and
// state, logs and metrics under the report folder.
type hooksConfig struct {
	Scontrol   string                     `yaml:"scontrol,omitempty"`
	SlurmConf  string                     `yaml:"slurm_conf,omitempty"`
	StateDir   string                     `yaml:"state_dir"`
	JobLog     string                     `yaml:"job_log"`
	MetricsDir string                     `yaml:"metrics_dir"`
	HookLog    string                     `yaml:"hook_log"`
	NQNPrefix  string                     `yaml:"nqn_prefix,omitempty"`
	Nodes      map[string]hooksConfigNode `yaml:"nodes"`
}

type hooksConfigNode struct {
	Tier0 string `yaml:"tier0"`
	API   string `yaml:"api"`
}

// tier0CLI is the tier0 binary the Slurm hooks run (Options.Tier0, else
// this executable: `tier0 validate` runs as tier0).
func (r *runner) tier0CLI() (string, error) {
	if r.o.Tier0 != "" {
		return exec.LookPath(r.o.Tier0)
	}
	return os.Executable()
}

// slurm runs the real Slurm hooks, as slurmd would, for every node: the
// HealthCheckProgram (`tier0 slurm healthcheck`, which asks the real
// Slurm through scontrol and must leave the node in service), then the
// Prolog and Epilog of a job (`tier0 slurm prolog|epilog`, with
// SLURM_JOB_ID set). The check fails when a hook refuses a healthy node,
// cannot reach Slurm, or drains a node.
func (r *runner) slurm() {
	if r.o.LocalSlurm {
		if why := localSlurmMissing(); why != "" {
			r.check(CheckSlurm, bench.NotRun, "--local-slurm: "+why)
			return
		}
	} else if !r.cfg.Slurm.Enabled {
		r.check(CheckSlurm, bench.NotRun, fmt.Sprintf("Slurm not configured (slurm.enabled is false in %s; --local-slurm starts one on this machine)", r.cfg.File))
		return
	}
	bin, err := r.tier0CLI()
	if err != nil {
		r.check(CheckSlurm, bench.Fail, fmt.Sprintf("the tier0 binary for the Slurm hooks: %v", err))
		return
	}
	dir, err := filepath.Abs(filepath.Join(r.o.OutDir, "slurm"))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		r.check(CheckSlurm, bench.Fail, fmt.Sprintf("hooks folder: %v", err))
		return
	}
	var local *localSlurm
	var slurmDir string
	if r.o.LocalSlurm {
		// Under /tmp: munged wants every folder above its socket
		// searchable by all, which the report folder may not be.
		if slurmDir, err = os.MkdirTemp("/tmp", "tier0-validate-slurm-"); err != nil {
			r.check(CheckSlurm, bench.Fail, fmt.Sprintf("--local-slurm folder: %v", err))
			return
		}
		if err := os.Chmod(slurmDir, 0o755); err != nil {
			r.check(CheckSlurm, bench.Fail, fmt.Sprintf("--local-slurm folder: %v", err))
			return
		}
		r.cfg.Slurm.Enabled, r.cfg.Slurm.Scontrol, r.cfg.Slurm.Conf = true, "/usr/bin/scontrol", filepath.Join(slurmDir, "slurm.conf")
		defer func() {
			local.stop()
			if r.o.Keep {
				fmt.Fprintf(r.o.Out, "local Slurm files kept in %s (--keep)\n", slurmDir)
			} else {
				_ = os.RemoveAll(slurmDir)
			}
		}()
	}
	hc := hooksConfig{Scontrol: r.cfg.Slurm.Scontrol, SlurmConf: r.cfg.Slurm.Conf, StateDir: filepath.Join(dir, "state"),
		JobLog: filepath.Join(dir, "jobs.log"), MetricsDir: filepath.Join(dir, "metrics"), HookLog: filepath.Join(dir, "hooks.log"),
		NQNPrefix: r.cfg.Fabrics.NQNPrefix, Nodes: map[string]hooksConfigNode{}}
	if hc.Scontrol != "" && !filepath.IsAbs(hc.Scontrol) {
		if p, err := exec.LookPath(hc.Scontrol); err == nil {
			hc.Scontrol = p
		}
	}
	for _, n := range r.cfg.Nodes {
		hc.Nodes[r.cfg.SlurmName(n.Name)] = hooksConfigNode{Tier0: n.Name, API: "http://" + n.AdvertiseAddr(n.API)}
	}
	b, _ := yaml.Marshal(hc)
	conf := filepath.Join(dir, "hooks.yaml")
	if err := os.WriteFile(conf, b, 0o644); err != nil {
		r.check(CheckSlurm, bench.Fail, err.Error())
		return
	}
	if r.o.LocalSlurm {
		var names []string
		for _, n := range r.cfg.Nodes {
			names = append(names, r.cfg.SlurmName(n.Name))
		}
		if local, err = startLocalSlurm(r.ctx, slurmDir, names, bin, conf); err != nil {
			r.check(CheckSlurm, bench.Fail, fmt.Sprintf("--local-slurm: %v", err))
			return
		}
	}
	job := fmt.Sprintf("tier0-validate-%d", os.Getpid())
	var bad, good []string
	for _, n := range r.cfg.Nodes {
		sn := r.cfg.SlurmName(n.Name)
		var steps []string
		for _, hook := range []string{"healthcheck", "prolog", "epilog"} {
			out, err := r.runHook(bin, conf, hook, sn, job)
			if err != nil {
				bad = append(bad, fmt.Sprintf("node %s: %s: %v: %s", sn, hook, err, oneLine(out, 240)))
				break
			}
			if hook == "healthcheck" {
				var res struct{ Verdict, Action, Why string }
				if json.Unmarshal([]byte(lastJSONLine(out)), &res) != nil || res.Action == "drain" || res.Verdict == "failed" {
					bad = append(bad, fmt.Sprintf("node %s: healthcheck on a healthy cluster: %s", sn, oneLine(out, 240)))
					break
				}
				steps = append(steps, fmt.Sprintf("healthcheck %s/%s", res.Verdict, res.Action))
				continue
			}
			steps = append(steps, hook+" ok")
		}
		if len(steps) == 3 {
			good = append(good, fmt.Sprintf("%s (%s)", sn, strings.Join(steps, ", ")))
		}
	}
	if len(bad) > 0 {
		r.check(CheckSlurm, bench.Fail, strings.Join(bad, "; ")+fmt.Sprintf(" (hook log %s)", hc.HookLog))
		return
	}
	why := fmt.Sprintf("real hooks against Slurm (scontrol %s) on every node: %s", orDefault(hc.Scontrol, "/usr/bin/scontrol"), strings.Join(good, "; "))
	if local != nil {
		did, err := r.slurmJob(local, hc)
		if err != nil {
			r.check(CheckSlurm, bench.Fail, fmt.Sprintf("local Slurm (%s): %v (hook log %s)", local.conf, err, hc.HookLog))
			return
		}
		why = did + "; " + why
	}
	r.check(CheckSlurm, bench.Pass, why)
}

// slurmJob runs a job on every node of the local Slurm and checks that
// slurmd itself ran the hooks: each node's Prolog let the job start, its
// Epilog recorded the job in the job log, its HealthCheckProgram ran, and
// no node was drained.
func (r *runner) slurmJob(s *localSlurm, hc hooksConfig) (string, error) {
	var since int64
	if st, err := os.Stat(hc.HookLog); err == nil {
		since = st.Size()
	}
	id, err := s.job(r.ctx, 60*time.Second)
	if err != nil {
		return "", err
	}
	var missing []string
	err = s.waitFor(r.ctx, "hook runs by slurmd for job "+id, 30*time.Second, func() (bool, string) {
		jobs, _ := os.ReadFile(hc.JobLog)
		hooks, _ := os.ReadFile(hc.HookLog)
		// Only what was logged since the job was submitted: validate's
		// own hook runs before it logged health checks too.
		hooks = hooks[min(int(since), len(hooks)):]
		missing = missing[:0]
		for _, n := range s.nodes {
			if !hookLogHas(string(hooks), "prolog: storage usable", n, id) {
				missing = append(missing, n+": no prolog run for job "+id)
			}
			if !strings.Contains(string(jobs), fmt.Sprintf(`"node":%q`, n)) || !jobLogHas(string(jobs), n, id) {
				missing = append(missing, n+": no epilog record of job "+id)
			}
			if !hookLogHas(string(hooks), "msg=healthcheck", n, "") {
				missing = append(missing, n+": no HealthCheckProgram run")
			}
		}
		return len(missing) == 0, strings.Join(missing, "; ")
	})
	if err != nil {
		return "", err
	}
	out, err := s.scontrol(r.ctx, "show", "nodes", "-o")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(line, "DRAIN") || strings.Contains(line, "DOWN") {
			return "", fmt.Errorf("a node left service after the job: %s", oneLine(line, 300))
		}
	}
	return fmt.Sprintf("local Slurm (slurmctld + %d slurmd on this machine): job %s ran on every node, slurmd ran each node's Prolog, Epilog and HealthCheckProgram (tier0 hooks), no node drained", len(s.nodes), id), nil
}

// hookLogHas reports whether the hook log has a line with msg for node
// (and job, when given).
func hookLogHas(log, msg, node, job string) bool {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, msg) && strings.Contains(l+" ", " node="+node+" ") && (job == "" || strings.Contains(l+" ", " job="+job+" ")) {
			return true
		}
	}
	return false
}

// jobLogHas reports whether the job log has the Epilog's record of job on
// node.
func jobLogHas(log, node, job string) bool {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, fmt.Sprintf(`"node":%q`, node)) && strings.Contains(l, fmt.Sprintf(`"job_id":%q`, job)) {
			return true
		}
	}
	return false
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// runHook runs `tier0 --json slurm HOOK --config CONF --node NODE` with
// the environment slurmd gives a hook.
func (r *runner) runHook(bin, conf, hook, node, job string) (string, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--json", "slurm", hook, "--config", conf, "--node", node, "--timeout", "30s")
	cmd.Env = append(os.Environ(), "SLURMD_NODENAME="+node, "SLURM_JOB_ID="+job, "SLURM_JOB_USER=root")
	if r.cfg.Slurm.Conf != "" {
		cmd.Env = append(cmd.Env, "SLURM_CONF="+r.cfg.Slurm.Conf)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func lastJSONLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(strings.TrimSpace(lines[i]), "{") {
			return lines[i]
		}
	}
	return ""
}
