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
	if !r.cfg.Slurm.Enabled {
		r.check(CheckSlurm, bench.NotRun, fmt.Sprintf("Slurm not configured (slurm.enabled is false in %s)", r.cfg.File))
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
	r.check(CheckSlurm, bench.Pass, fmt.Sprintf("real hooks against Slurm (scontrol %s) on every node: %s", orDefault(hc.Scontrol, "/usr/bin/scontrol"), strings.Join(good, "; ")))
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
