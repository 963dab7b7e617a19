package config

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The performance model of a local site (docs/BENCH.md): each
// file-backed drive shaped to a drive's published figures, each node's
// link to a byte rate, every rate scaled by one factor, so that a whole
// cluster on one machine is bound by the modelled hardware rather than by
// the machine's CPUs. A real cluster sets none of it.

// EnvModelScale overrides model.scale at start-up (tier0 validate
// --model-scale sets it for the tier0d processes it starts).
const EnvModelScale = "TIER0_MODEL_SCALE"

// PerfModel is the site's model section (model:).
type PerfModel struct {
	// Scale multiplies every modelled rate (0 < scale ≤ 1; default 1).
	Scale float64 `mapstructure:"scale" json:"scale,omitempty"`
}

// DriveModel is a drive's performance profile (drives[].model): a named
// profile, any of whose figures the other keys override.
type DriveModel struct {
	// Profile names published figures (see DriveProfiles).
	Profile        string   `mapstructure:"profile" json:"profile,omitempty"`
	ReadBytesPerS  Size     `mapstructure:"read_bytes_per_s" json:"read_bytes_per_s,omitempty"`
	WriteBytesPerS Size     `mapstructure:"write_bytes_per_s" json:"write_bytes_per_s,omitempty"`
	ReadIOPS       int      `mapstructure:"read_iops" json:"read_iops,omitempty"`
	WriteIOPS      int      `mapstructure:"write_iops" json:"write_iops,omitempty"`
	ReadLatency    Duration `mapstructure:"read_latency" json:"read_latency,omitempty"`
	WriteLatency   Duration `mapstructure:"write_latency" json:"write_latency,omitempty"`
}

// Link is a node's modelled network link (nodes[].link): the bytes per
// second its drives may move in all (before scaling).
type Link struct {
	BytesPerS Size `mapstructure:"bytes_per_s" json:"bytes_per_s,omitempty"`
}

// DriveFigures are a drive's rates and latencies (the same fields as
// blockdev.Model, so that the daemon converts one into the other).
type DriveFigures struct {
	ReadBytesPerS, WriteBytesPerS float64
	ReadIOPS, WriteIOPS           float64
	ReadLatency, WriteLatency     time.Duration
}

// DriveProfile is a named set of published drive figures.
type DriveProfile struct {
	Figures DriveFigures
	Source  string
}

// DriveProfiles are the built-in profiles. The Micron 7450 PRO figures
// are those of Micron's product brief for the 3.84 TB U.3 drive (the
// seed's drive model): 6800 MB/s sequential read, 5300 MB/s sequential
// write, 1,000K 4 KiB random read and 180K random write IOPS, 70 µs read
// and 15 µs write typical latency.
var DriveProfiles = map[string]DriveProfile{
	"micron-7450-pro-3.84tb": {
		Figures: DriveFigures{ReadBytesPerS: 6800e6, WriteBytesPerS: 5300e6, ReadIOPS: 1_000_000, WriteIOPS: 180_000,
			ReadLatency: 70 * time.Microsecond, WriteLatency: 15 * time.Microsecond},
		Source: "Micron 7450 PRO 3.84 TB U.3 product brief: 6800/5300 MB/s, 1000K/180K IOPS, 70/15 µs",
	},
}

// ModelScale is the scale in force: $TIER0_MODEL_SCALE when set and
// valid, else model.scale, else 1.
func (c *Config) ModelScale() float64 {
	if v := os.Getenv(EnvModelScale); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 && f <= 1 {
			return f
		}
	}
	if c.Model.Scale > 0 {
		return c.Model.Scale
	}
	return 1
}

// DriveModelOf returns drive's model (scaled), the node's link rate
// (scaled; 0: no link model), the profile's source, and whether the
// drive has a model at all.
func (c *Config) DriveModelOf(drive string) (fig DriveFigures, linkBytesPerS float64, source string, ok bool) {
	return c.DriveModelAt(drive, c.ModelScale())
}

// LinkOf is node's link rate at the scale in force (0: no link model).
func (c *Config) LinkOf(node string) float64 {
	n, ok := c.Node(node)
	if !ok || n.Link == nil {
		return 0
	}
	return float64(n.Link.BytesPerS) * c.ModelScale()
}

// DriveModelAt is DriveModelOf at scale s instead of the scale in force
// (validate's start-up calibration weighs candidate scales with it).
func (c *Config) DriveModelAt(drive string, s float64) (fig DriveFigures, linkBytesPerS float64, source string, ok bool) {
	for _, n := range c.Nodes {
		for _, d := range n.Drives {
			if d.Name != drive || d.Model == nil {
				continue
			}
			fig, source, err := d.Model.figures()
			if err != nil {
				return DriveFigures{}, 0, "", false // Validate reported it
			}
			fig.ReadBytesPerS *= s
			fig.WriteBytesPerS *= s
			fig.ReadIOPS *= s
			fig.WriteIOPS *= s
			if n.Link != nil {
				linkBytesPerS = float64(n.Link.BytesPerS) * s
			}
			return fig, linkBytesPerS, source, true
		}
	}
	return DriveFigures{}, 0, "", false
}

// figures resolves the profile and the overrides (unscaled).
func (m *DriveModel) figures() (DriveFigures, string, error) {
	var f DriveFigures
	src := "site file"
	if m.Profile != "" {
		p, ok := DriveProfiles[m.Profile]
		if !ok {
			return f, "", fmt.Errorf("profile %q is not known; expected one of %s, or explicit figures (read_bytes_per_s, write_bytes_per_s, read_iops, write_iops, read_latency, write_latency)", m.Profile, profileNames())
		}
		f, src = p.Figures, p.Source
	}
	if m.ReadBytesPerS > 0 {
		f.ReadBytesPerS = float64(m.ReadBytesPerS)
	}
	if m.WriteBytesPerS > 0 {
		f.WriteBytesPerS = float64(m.WriteBytesPerS)
	}
	if m.ReadIOPS > 0 {
		f.ReadIOPS = float64(m.ReadIOPS)
	}
	if m.WriteIOPS > 0 {
		f.WriteIOPS = float64(m.WriteIOPS)
	}
	if m.ReadLatency > 0 {
		f.ReadLatency = time.Duration(m.ReadLatency)
	}
	if m.WriteLatency > 0 {
		f.WriteLatency = time.Duration(m.WriteLatency)
	}
	if f.ReadBytesPerS <= 0 && f.ReadIOPS <= 0 && f.WriteBytesPerS <= 0 && f.WriteIOPS <= 0 {
		return f, "", fmt.Errorf("no figures: expected a profile (%s) or at least one rate", profileNames())
	}
	if m.Profile != "" && (m.ReadBytesPerS > 0 || m.WriteBytesPerS > 0 || m.ReadIOPS > 0 || m.WriteIOPS > 0 || m.ReadLatency > 0 || m.WriteLatency > 0) {
		src += ", with figures overridden in the site file"
	}
	return f, src, nil
}

func profileNames() string {
	names := make([]string, 0, len(DriveProfiles))
	for n := range DriveProfiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// validateModel checks the model keys: a known profile or figures, a
// scale in (0, 1], models only on file-backed drives.
func (c *Config) validateModel(k *checker) {
	if c.Model.Scale < 0 || c.Model.Scale > 1 {
		k.add("model.scale", "%g; expected a factor in (0, 1] that scales every modelled rate (0.001 runs the seed's drives at a thousandth)", c.Model.Scale)
	}
	for i, n := range c.Nodes {
		if n.Link != nil && n.Link.BytesPerS <= 0 {
			k.add(fmt.Sprintf("nodes[%d].link.bytes_per_s", i), "missing; expected the link's byte rate before scaling, such as 50GB (dual 400 Gb/s)")
		}
		for j, d := range n.Drives {
			if d.Model == nil {
				continue
			}
			key := fmt.Sprintf("nodes[%d].drives[%d].model", i, j)
			if _, _, err := d.Model.figures(); err != nil {
				k.add(key, "%v", err)
			}
			if d.Size == 0 {
				k.add(key, "drive %s is a device, not a file with a size; the performance model is for local sites whose drives are files (a real drive performs as it does)", d.Name)
			}
		}
	}
}
