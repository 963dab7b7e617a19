package gds

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// DefaultNvfsStatsPath is where the nvidia-fs kernel module publishes its
// counters.
const DefaultNvfsStatsPath = "/proc/driver/nvidia-fs/stats"

// DefaultNvfsParamsDir holds the nvidia-fs module parameters, among them
// rw_stats_enabled.
const DefaultNvfsParamsDir = "/sys/module/nvidia_fs/parameters"

// NvfsStats is a parsed /proc/driver/nvidia-fs/stats.
//
// Every "Label : key=value ..." line lands in Sections[Label] (a label that
// appears twice, like the two "Reads" lines, merges its keys). "Key: value"
// header lines land in Info. Per-GPU lines land in GPUs.
type NvfsStats struct {
	GDSVersion     string                        `json:"gds_version,omitempty"`
	DriverVersion  string                        `json:"driver_version,omitempty"`
	StatsVersion   string                        `json:"stats_version,omitempty"`
	IOStatsEnabled bool                          `json:"io_stats_enabled"`
	Info           map[string]string             `json:"info,omitempty"`
	Sections       map[string]map[string]float64 `json:"sections"`
	GPUs           []NvfsGPU                     `json:"gpus,omitempty"`
	// Order lists section labels in file order, for printing.
	Order []string `json:"-"`
}

// NvfsGPU is one "GPU <bus id> uuid:<uuid> : k=v ..." line.
type NvfsGPU struct {
	BusID    string             `json:"bus_id"`
	UUID     string             `json:"uuid,omitempty"`
	Counters map[string]float64 `json:"counters"`
}

var (
	reNvfsVer    = regexp.MustCompile(`^NVFS statistics\(ver:\s*([^)]+)\)`)
	reNvfsDrv    = regexp.MustCompile(`^NVFS Driver\(version:\s*([^)]+)\)`)
	reNvfsIOStat = regexp.MustCompile(`^IO stats:\s*(\w+)`)
	reNvfsGPU    = regexp.MustCompile(`^GPU\s+(\S+)\s*(?:uuid:\s*(\S+))?\s*$`)
)

// ParseNvfsStats parses the nvidia-fs stats file in any of the known
// layouts (tabs or spaces, IO stats enabled or disabled, with or without
// per-GPU lines). A line it does not understand is kept in Info when it has
// a colon and is otherwise ignored; a value that is not a number is an
// error naming the line.
func ParseNvfsStats(r io.Reader) (*NvfsStats, error) {
	s := &NvfsStats{Info: map[string]string{}, Sections: map[string]map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if m := reNvfsVer.FindStringSubmatch(line); m != nil {
			s.StatsVersion = strings.TrimSpace(m[1])
			continue
		}
		if m := reNvfsDrv.FindStringSubmatch(line); m != nil {
			s.DriverVersion = strings.TrimSpace(m[1])
			continue
		}
		if m := reNvfsIOStat.FindStringSubmatch(line); m != nil {
			s.IOStatsEnabled = strings.EqualFold(m[1], "enabled")
			s.Info["IO stats"] = strings.TrimSpace(strings.TrimPrefix(line, "IO stats:"))
			continue
		}
		eq := strings.IndexByte(line, '=')
		if eq < 0 {
			// "Key: value" header line.
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if k == "GDS Version" {
				s.GDSVersion = v
			}
			s.Info[k] = v
			continue
		}
		// The label ends at the last colon before the first '='.
		colon := strings.LastIndexByte(line[:eq], ':')
		if colon < 0 {
			continue
		}
		label := strings.TrimSpace(line[:colon])
		kv, err := parseKV(line[colon+1:])
		if err != nil {
			return nil, fmt.Errorf("nvidia-fs stats line %d %q: %w", lineNo, line, err)
		}
		if m := reNvfsGPU.FindStringSubmatch(label); m != nil {
			s.GPUs = append(s.GPUs, NvfsGPU{BusID: m[1], UUID: m[2], Counters: kv})
			continue
		}
		sec, ok := s.Sections[label]
		if !ok {
			sec = map[string]float64{}
			s.Sections[label] = sec
			s.Order = append(s.Order, label)
		}
		for k, v := range kv {
			sec[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading nvidia-fs stats: %w", err)
	}
	if len(s.Sections) == 0 && s.DriverVersion == "" {
		return nil, fmt.Errorf("no nvidia-fs counters found: not an nvidia-fs stats file (expected lines like \"Reads : n=0 ok=0 err=0\")")
	}
	return s, nil
}

// parseKV parses whitespace-separated key=value tokens. A token without '='
// is skipped (some versions leave a trailing word); a value must be a
// number.
func parseKV(s string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, tok := range strings.Fields(s) {
		k, v, ok := strings.Cut(tok, "=")
		if !ok || k == "" {
			continue
		}
		v = strings.TrimRight(v, ",")
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("value of %s is %q, expected a number", k, v)
		}
		out[k] = f
	}
	return out, nil
}

// ReadNvfsStatsFile parses the stats file at path.
func ReadNvfsStatsFile(path string) (*NvfsStats, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := ParseNvfsStats(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Counter returns Sections[section][key] and whether it is present.
func (s *NvfsStats) Counter(section, key string) (int64, bool) {
	if s == nil {
		return 0, false
	}
	sec, ok := s.Sections[section]
	if !ok {
		return 0, false
	}
	v, ok := sec[key]
	return int64(v), ok
}

// ReadCounters are the nvidia-fs read counters.
type ReadCounters struct {
	N   int64 `json:"n"`
	OK  int64 `json:"ok"`
	Err int64 `json:"err"`
	// Present is false when the module does not publish n/ok (IO stats
	// disabled: rw_stats_enabled=0).
	Present bool `json:"present"`
}

// Reads returns the "Reads" counters.
func (s *NvfsStats) Reads() ReadCounters {
	n, okN := s.Counter("Reads", "n")
	ok, okOK := s.Counter("Reads", "ok")
	e, _ := s.Counter("Reads", "err")
	return ReadCounters{N: n, OK: ok, Err: e, Present: okN && okOK}
}
