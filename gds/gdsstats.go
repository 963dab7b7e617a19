package gds

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// CufileStats is parsed `gds_stats -p PID -l N` output: cuFile's own
// per-process counters.
type CufileStats struct {
	Version int                `json:"version"`
	Global  map[string]float64 `json:"global"`
	GPUs    []CufileGPUStats   `json:"gpus"`
}

// CufileGPUStats is one "GPU N Read: ... Write: ... BufRegister: ..." line.
// Each group maps its keys (n, posix, err, MiB, and nvfs in newer versions)
// to values.
type CufileGPUStats struct {
	Index       int                `json:"index"`
	Read        map[string]float64 `json:"read"`
	Write       map[string]float64 `json:"write"`
	BufRegister map[string]float64 `json:"buf_register"`
}

var (
	reGdsStatsVersion = regexp.MustCompile(`^cuFile STATS VERSION\s*:\s*(\d+)`)
	reGdsStatsGPU     = regexp.MustCompile(`^GPU\s+(\d+)\s+(Read:.*)$`)
)

// ParseGdsStats parses gds_stats output (level 1 to 3). Only the PER_GPU
// STATS section yields GPUs; pool-buffer and RDMA sections are skipped.
func ParseGdsStats(r io.Reader) (*CufileStats, error) {
	s := &CufileStats{Global: map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	section := "GLOBAL"
	seenHeader := false
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if m := reGdsStatsVersion.FindStringSubmatch(line); m != nil {
			s.Version, _ = strconv.Atoi(m[1])
			seenHeader = true
			continue
		}
		if strings.HasSuffix(line, ":") && strings.ToUpper(line) == line {
			// Section header: "GLOBAL STATS:", "PER_GPU STATS:", ...
			section = strings.TrimSuffix(line, ":")
			continue
		}
		switch {
		case strings.HasPrefix(section, "GLOBAL"):
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				continue // a non-numeric global line is information only
			}
			s.Global[strings.TrimSpace(k)] = f
		case section == "PER_GPU STATS":
			m := reGdsStatsGPU.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			g, err := parseGdsGPULine(m[2])
			if err != nil {
				return nil, fmt.Errorf("gds_stats line %d %q: %w", lineNo, line, err)
			}
			g.Index, _ = strconv.Atoi(m[1])
			s.GPUs = append(s.GPUs, g)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading gds_stats output: %w", err)
	}
	if !seenHeader {
		return nil, fmt.Errorf("no \"cuFile STATS VERSION\" line: not gds_stats output")
	}
	return s, nil
}

func parseGdsGPULine(rest string) (CufileGPUStats, error) {
	g := CufileGPUStats{Read: map[string]float64{}, Write: map[string]float64{}, BufRegister: map[string]float64{}}
	var cur map[string]float64
	for _, tok := range strings.Fields(rest) {
		switch tok {
		case "Read:":
			cur = g.Read
			continue
		case "Write:":
			cur = g.Write
			continue
		case "BufRegister:":
			cur = g.BufRegister
			continue
		}
		k, v, ok := strings.Cut(tok, "=")
		if !ok || cur == nil {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return g, fmt.Errorf("value of %s is %q, expected a number", k, v)
		}
		cur[k] = f
	}
	return g, nil
}

// ReadTotals sums the per-GPU read counters: n (all reads), posix (reads
// served in compat mode), err, and nvfs (reads through nvidia-fs) with
// hasNvfs false when this cuFile version does not report nvfs=.
func (s *CufileStats) ReadTotals() (n, posix, errs, nvfs int64, hasNvfs bool) {
	if s == nil {
		return
	}
	for _, g := range s.GPUs {
		n += int64(g.Read["n"])
		posix += int64(g.Read["posix"])
		errs += int64(g.Read["err"])
		if v, ok := g.Read["nvfs"]; ok {
			nvfs += int64(v)
			hasNvfs = true
		}
	}
	return
}
