package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"

	"tier0/internal/units"
)

// ErrInvalid is wrapped by every error Load, Parse and Validate return for
// a configuration that is wrong (as opposed to one that cannot be read).
var ErrInvalid = errors.New("invalid site configuration")

// Problem is one thing wrong with a configuration.
type Problem struct {
	File string // the configuration file
	Key  string // the YAML key path, e.g. arrays[2].members[1]
	Msg  string // what is wrong and what was expected
}

func (p Problem) String() string {
	if p.Key == "" {
		return p.File + ": " + p.Msg
	}
	return p.File + ": " + p.Key + ": " + p.Msg
}

// ValidationError lists every problem found in a configuration, one per
// line in Error(). It wraps ErrInvalid.
type ValidationError struct {
	Problems []Problem
}

func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// Load reads, validates and resolves the configuration in path. On a
// validation failure the error is a *ValidationError listing every problem.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read site configuration: %w", err)
	}
	return Parse(path, data)
}

// Parse is Load for configuration text already in memory; name is used as
// the file name in problems.
func Parse(name string, data []byte) (*Config, error) {
	c := &Config{File: name}
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(data)); err != nil {
		return nil, &ValidationError{Problems: []Problem{{File: name, Msg: "not valid YAML: " + oneLine(err.Error())}}}
	}
	var md mapstructure.Metadata
	err := v.Unmarshal(c, func(dc *mapstructure.DecoderConfig) {
		dc.Metadata = &md
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(sizeHook, durationHook)
	})
	var probs []Problem
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "*"))
			if line == "" || strings.HasPrefix(line, "decoding failed due to the following error") {
				continue
			}
			probs = append(probs, Problem{File: name, Msg: line})
		}
	}
	for _, k := range md.Unused {
		probs = append(probs, Problem{File: name, Key: k, Msg: "unknown key; expected one of the keys documented in docs/CONFIG.md (check the spelling)"})
	}
	if len(probs) > 0 {
		slices.SortFunc(probs, func(a, b Problem) int { return strings.Compare(a.Key, b.Key) })
		return nil, &ValidationError{Problems: probs}
	}
	c.decodeMembers(&probs)
	c.applyDefaults()
	c.expand(&probs)
	if err := c.validate(probs); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate checks c again (after a caller changed it) and places arrays
// that are automatic and still have no members. It returns a
// *ValidationError or nil.
func (c *Config) Validate() error {
	return c.validate(nil)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// ParseSize parses "64MiB", "1G", "4096" into bytes (binary units; the
// one parser of package units, shared with the command line).
func ParseSize(s string) (Size, error) {
	n, err := units.ParseBytes(s)
	return Size(n), err
}

func sizeHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeOf(Size(0)) {
		return data, nil
	}
	switch d := data.(type) {
	case string:
		return ParseSize(d)
	case int:
		return Size(d), nil
	case int64:
		return Size(d), nil
	case float64:
		return Size(int64(d)), nil
	}
	return data, nil
}

func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeOf(Duration(0)) {
		return data, nil
	}
	switch d := data.(type) {
	case string:
		x, err := time.ParseDuration(d)
		if err != nil {
			return nil, fmt.Errorf("duration %q: expected a number with a unit, like 5s or 250ms", d)
		}
		return Duration(x), nil
	case int:
		return nil, fmt.Errorf("duration %d has no unit; expected a number with a unit, like 5s or 250ms", d)
	}
	return data, nil
}

// decodeMembers turns each array's raw members value into Members/Auto.
func (c *Config) decodeMembers(probs *[]Problem) {
	for i := range c.Arrays {
		a := &c.Arrays[i]
		key := fmt.Sprintf("arrays[%d].members", i)
		switch m := a.RawMembers.(type) {
		case nil:
			a.Auto = true
		case string:
			if m == "auto" {
				a.Auto = true
			} else {
				*probs = append(*probs, Problem{c.File, key, fmt.Sprintf("%q is neither \"auto\" nor a list; expected auto or a list of drive names like [B1, C1, D1]", m)})
			}
		case []any:
			for j, x := range m {
				s, ok := x.(string)
				if !ok {
					s = fmt.Sprint(x)
				}
				if s == "" {
					*probs = append(*probs, Problem{c.File, fmt.Sprintf("%s[%d]", key, j), "empty drive name; expected a drive name like B1"})
				}
				a.Members = append(a.Members, s)
			}
		default:
			*probs = append(*probs, Problem{c.File, key, fmt.Sprintf("unexpected value %v; expected auto or a list of drive names", m)})
		}
		a.RawMembers = nil
	}
}

func (c *Config) applyDefaults() {
	for i := range c.Arrays {
		a := &c.Arrays[i]
		a.Level = strings.ToLower(a.Level)
		if a.ChunkKiB == 0 {
			a.ChunkKiB = DefaultChunkKiB
		}
		if a.Width == 0 {
			if a.Auto {
				a.Width = len(c.Nodes) - 1
			} else {
				a.Width = len(a.Members)
			}
		}
	}
	if c.Placement.Domains == "" {
		c.Placement.Domains = "none"
	}
	if c.Fabrics.NQNPrefix == "" {
		c.Fabrics.NQNPrefix = DefaultNQNPrefix
	}
	for _, f := range []*Fabric{&c.Fabrics.Backend, &c.Fabrics.Frontend} {
		if f.Transport == "" {
			f.Transport = TransportTCP
		}
		if f.Queues == 0 {
			f.Queues = DefaultQueues
		}
		if f.QueueDepth == 0 {
			f.QueueDepth = DefaultQueueDepth
		}
		if f.ConnectTimeout == 0 {
			f.ConnectTimeout = Duration(DefaultConnectTimeout)
		}
	}
	e := &c.ControlPlane.Etcd
	if e.ClientPort == 0 {
		e.ClientPort = DefaultEtcdClientPort
	}
	if e.PeerPort == 0 {
		e.PeerPort = DefaultEtcdPeerPort
	}
	if e.DataDir == "" {
		e.DataDir = "etcd"
	}
	if e.Tick == 0 {
		e.Tick = Duration(DefaultEtcdTick)
	}
	if e.Election == 0 {
		e.Election = 10 * e.Tick
	}
	p := &c.Policies
	if p.Failback == "" {
		p.Failback = "auto"
	}
	if p.RebuildRateMiBs == 0 {
		p.RebuildRateMiBs = DefaultRebuildRateMiBs
	}
	if p.RebuildAdaptive == nil {
		t := true
		p.RebuildAdaptive = &t
	}
	if p.LeaseTTL == 0 {
		p.LeaseTTL = Duration(DefaultLeaseTTL)
	}
	if p.MemberIOTimeout == 0 {
		p.MemberIOTimeout = Duration(DefaultMemberIOTimeout)
	}
	if p.MemberSlowRead == 0 {
		p.MemberSlowRead = Duration(DefaultMemberSlowRead)
	}
	if p.HousekeepingInterval == 0 {
		p.HousekeepingInterval = Duration(DefaultHousekeeping)
	}
	if p.MemberIORetries == nil {
		r := DefaultMemberIORetries
		p.MemberIORetries = &r
	}
	if c.Slurm.Scontrol == "" {
		c.Slurm.Scontrol = "scontrol"
	}
}

// expandString expands ${VAR}, ${VAR:-default} and $VAR from the
// environment, and ${workdir} to the (already expanded) work directory.
// Unset variables without a default are collected in missing.
func (c *Config) expandString(s string, missing *[]string) string {
	return os.Expand(s, func(name string) string {
		def, hasDef := "", false
		if i := strings.Index(name, ":-"); i >= 0 {
			name, def, hasDef = name[:i], name[i+2:], true
		}
		if name == "workdir" {
			return c.Workdir
		}
		if v, ok := os.LookupEnv(name); ok && v != "" {
			return v
		}
		if hasDef {
			return def
		}
		*missing = append(*missing, name)
		return ""
	})
}

func (c *Config) expand(probs *[]Problem) {
	var missing []string
	c.Workdir = c.expandString(c.Workdir, &missing)
	for _, name := range missing {
		*probs = append(*probs, Problem{c.File, "workdir", fmt.Sprintf("refers to ${%s}, which is not set; export %s or write ${%s:-default}", name, name, name)})
	}
	for i := range c.Nodes {
		for j := range c.Nodes[i].Drives {
			d := &c.Nodes[i].Drives[j]
			missing = nil
			d.Path = c.expandString(d.Path, &missing)
			for _, name := range missing {
				*probs = append(*probs, Problem{c.File, fmt.Sprintf("nodes[%d].drives[%d].path", i, j), fmt.Sprintf("refers to ${%s}, which is not set; export %s or write ${%s:-default}", name, name, name)})
			}
		}
	}
}
