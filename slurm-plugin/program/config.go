package program

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultConfigPath is where the hooks look for their configuration.
const DefaultConfigPath = "/etc/tier0/slurm.yaml"

// DefaultAPI is the local tier0d API the hooks ask when the configuration
// names none.
const DefaultAPI = "http://127.0.0.1:7480"

// Config is the hooks' configuration file (YAML, all keys optional).
type Config struct {
	// API is the base URL of this node's tier0d API [DefaultAPI].
	API string `yaml:"api"`
	// Scontrol is the absolute path of scontrol [/usr/bin/scontrol].
	Scontrol string `yaml:"scontrol"`
	// SlurmConf is passed to scontrol as SLURM_CONF when set
	// (HealthCheckProgram runs with an empty environment).
	SlurmConf string `yaml:"slurm_conf"`
	// ScontrolTimeout bounds one scontrol run [5s]; ScontrolAttempts is
	// how many runs a transient failure gets [2].
	ScontrolTimeout  time.Duration `yaml:"scontrol_timeout"`
	ScontrolAttempts int           `yaml:"scontrol_attempts"`
	// HTTPTimeout bounds the health request [3s].
	HTTPTimeout time.Duration `yaml:"http_timeout"`
	// StateDir keeps the Prolog's counter snapshots and the Epilog totals,
	// per node and job [/var/lib/tier0/slurm].
	StateDir string `yaml:"state_dir"`
	// JobLog receives one JSON line per job from the Epilog
	// [/var/log/tier0/slurm-jobs.log].
	JobLog string `yaml:"job_log"`
	// MetricsDir receives <node>.prom, Prometheus text format, for
	// node_exporter's textfile collector [/var/lib/tier0/slurm/metrics].
	MetricsDir string `yaml:"metrics_dir"`
	// HookLog receives the hooks' own diagnostics [/var/log/tier0/slurm-hooks.log].
	HookLog string `yaml:"hook_log"`
	// SysBlock is the block device directory [/sys/block].
	SysBlock string `yaml:"sys_block"`
	// NQNPrefix selects tier0's namespaces [nqn.2026-11.io.tier0].
	NQNPrefix string `yaml:"nqn_prefix"`
	// PrologArrays is what the Prolog checks for a job that names no
	// arrays: "all" (every array must be usable from the node) or "none"
	// (only the daemon's health) [all].
	PrologArrays string `yaml:"prolog_arrays"`
	// PrologDrain: a failing Prolog drains the node itself with a "tier0:"
	// reason, so HealthCheckProgram can resume it once storage is back
	// (otherwise Slurm drains it as "Prolog error", which tier0 never
	// undoes) [true].
	PrologDrain *bool `yaml:"prolog_drain"`
	// Nodes maps Slurm node names to their tier0 name and API when these
	// differ from the Slurm name and API.
	Nodes map[string]NodeConfig `yaml:"nodes"`
}

// NodeConfig is one entry of Config.Nodes.
type NodeConfig struct {
	Tier0 string `yaml:"tier0"`
	API   string `yaml:"api"`
}

// LoadConfig reads path. A missing file at DefaultConfigPath gives the
// defaults; a missing file elsewhere, an unknown key or a bad value is an
// error.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && path == DefaultConfigPath:
	case err != nil:
		return c, fmt.Errorf("reading tier0 slurm config: %w", err)
	default:
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return c, fmt.Errorf("tier0 slurm config %s: %w", path, err)
		}
	}
	return c.withDefaults()
}

func (c Config) withDefaults() (Config, error) {
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	def(&c.API, DefaultAPI)
	def(&c.Scontrol, "/usr/bin/scontrol")
	def(&c.StateDir, "/var/lib/tier0/slurm")
	def(&c.JobLog, "/var/log/tier0/slurm-jobs.log")
	def(&c.MetricsDir, "/var/lib/tier0/slurm/metrics")
	def(&c.HookLog, "/var/log/tier0/slurm-hooks.log")
	def(&c.SysBlock, "/sys/block")
	def(&c.NQNPrefix, "nqn.2026-11.io.tier0")
	def(&c.PrologArrays, "all")
	if c.ScontrolTimeout <= 0 {
		c.ScontrolTimeout = 5 * time.Second
	}
	if c.ScontrolAttempts <= 0 {
		c.ScontrolAttempts = 2
	}
	if c.HTTPTimeout <= 0 {
		c.HTTPTimeout = 3 * time.Second
	}
	if c.PrologDrain == nil {
		t := true
		c.PrologDrain = &t
	}
	if c.PrologArrays != "all" && c.PrologArrays != "none" {
		return c, fmt.Errorf("prolog_arrays %q: want all or none", c.PrologArrays)
	}
	if !strings.HasPrefix(c.Scontrol, "/") {
		return c, fmt.Errorf("scontrol %q: want an absolute path (Slurm hooks run without PATH)", c.Scontrol)
	}
	return c, nil
}

// Node returns the tier0 node name and API URL for a Slurm node name.
func (c Config) Node(slurmNode string) (tier0, api string) {
	tier0, api = slurmNode, c.API
	if n, ok := c.Nodes[slurmNode]; ok {
		if n.Tier0 != "" {
			tier0 = n.Tier0
		}
		if n.API != "" {
			api = n.API
		}
	}
	return tier0, api
}
