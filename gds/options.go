package gds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
)

// Environment variables that override the libraries and kernel files the
// validator uses. Tests point them at stand-ins; on a real host they are
// normally unset.
const (
	EnvCufileLib  = "TIER0_CUFILE_LIB"  // default libcufile.so.0
	EnvCUDALib    = "TIER0_CUDA_LIB"    // default libcuda.so.1
	EnvNvfsStats  = "TIER0_NVFS_STATS"  // default /proc/driver/nvidia-fs/stats
	EnvNvfsParams = "TIER0_NVFS_PARAMS" // default /sys/module/nvidia_fs/parameters
	EnvGdsStats   = "TIER0_GDS_STATS"   // default /usr/libexec/gds/tools/gds_stats or PATH
)

// DefaultGdsStatsPath is where Debian's gds-tools installs gds_stats.
const DefaultGdsStatsPath = "/usr/libexec/gds/tools/gds_stats"

// Options configure Validate. Zero values take the defaults noted.
type Options struct {
	// File to read (must exist, at least IOSize bytes), or Dir in which a
	// test file of Size bytes is written and removed afterwards.
	File string
	Dir  string
	GPU  int   // CUDA device ordinal
	Size int64 // bytes to read; default: the file's size (File) or 1 GiB (Dir)
	// IOSize is the size of one cuFileRead; default 1 MiB. Size and IOSize
	// must be multiples of 4096 (O_DIRECT).
	IOSize  int
	Threads int // default 4
	// Strict turns cuFile compat mode off, so that a missing direct path
	// fails loudly instead of falling back to POSIX.
	Strict bool
	// SkipCPUOnly leaves out the CPU_ONLY comparison run.
	SkipCPUOnly bool

	CufileLib     string // default $TIER0_CUFILE_LIB or libcufile.so.0
	CUDALib       string // default $TIER0_CUDA_LIB or libcuda.so.1
	NvfsStatsPath string // default $TIER0_NVFS_STATS or DefaultNvfsStatsPath
	NvfsParamsDir string // default $TIER0_NVFS_PARAMS or DefaultNvfsParamsDir
	GdsStats      string // gds_stats binary; default $TIER0_GDS_STATS, DefaultGdsStatsPath or PATH
	// BaseConfig is a cufile.json whose settings the run keeps (comments
	// allowed); default $CUFILE_ENV_PATH_JSON, else /etc/cufile.json when
	// present. The validator writes its own copy with stats, logging and
	// compat mode set, and points CUFILE_ENV_PATH_JSON at it.
	BaseConfig string
	// WorkDir receives cufile.json and cufile.log; default a new temporary
	// directory, removed after a proven run and kept otherwise (the verdict
	// names the log).
	WorkDir string

	Logger *slog.Logger
}

func (o *Options) setDefaults() error {
	if (o.File == "") == (o.Dir == "") {
		return fmt.Errorf("%w: give exactly one of --file and --dir (got file %q, dir %q)", ErrUsage, o.File, o.Dir)
	}
	if o.IOSize == 0 {
		o.IOSize = 1 << 20
	}
	if o.Threads == 0 {
		o.Threads = 4
	}
	if o.Dir != "" && o.Size == 0 {
		o.Size = 1 << 30
	}
	if o.IOSize < 0 || o.IOSize%4096 != 0 {
		return fmt.Errorf("%w: io size %d is not a positive multiple of 4096 (O_DIRECT needs aligned I/O)", ErrUsage, o.IOSize)
	}
	if o.Size < 0 || o.Size%4096 != 0 {
		return fmt.Errorf("%w: size %d is not a multiple of 4096", ErrUsage, o.Size)
	}
	if o.Threads < 1 || o.Threads > 256 {
		return fmt.Errorf("%w: threads %d, expected 1..256", ErrUsage, o.Threads)
	}
	if o.GPU < 0 {
		return fmt.Errorf("%w: gpu %d, expected a CUDA device ordinal >= 0", ErrUsage, o.GPU)
	}
	o.CufileLib = firstNonEmpty(o.CufileLib, os.Getenv(EnvCufileLib), "libcufile.so.0")
	o.CUDALib = firstNonEmpty(o.CUDALib, os.Getenv(EnvCUDALib), "libcuda.so.1")
	o.NvfsStatsPath = firstNonEmpty(o.NvfsStatsPath, os.Getenv(EnvNvfsStats), DefaultNvfsStatsPath)
	o.NvfsParamsDir = firstNonEmpty(o.NvfsParamsDir, os.Getenv(EnvNvfsParams), DefaultNvfsParamsDir)
	if o.GdsStats == "" {
		o.GdsStats = os.Getenv(EnvGdsStats)
	}
	if o.GdsStats == "" {
		if p, err := findTool(DefaultGdsStatsPath, "gds_stats", ErrNoGdsio); err == nil {
			o.GdsStats = p
		}
	}
	if o.BaseConfig == "" {
		o.BaseConfig = os.Getenv("CUFILE_ENV_PATH_JSON")
	}
	if o.BaseConfig == "" {
		if _, err := os.Stat("/etc/cufile.json"); err == nil {
			o.BaseConfig = "/etc/cufile.json"
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// CufileConfig returns the cufile.json the validator runs with: base (a
// cufile.json, comments allowed; empty for none) with cuFile statistics at
// level 3, logging to logDir at INFO, and compat mode allowed or not. A
// base that cannot be parsed is an error naming it.
func CufileConfig(base []byte, logDir string, allowCompat bool) ([]byte, error) {
	cfg := map[string]any{}
	if len(bytes.TrimSpace(base)) > 0 {
		if err := json.Unmarshal(stripJSONComments(base), &cfg); err != nil {
			return nil, fmt.Errorf("parse cufile.json: %w", err)
		}
	}
	section := func(name string) map[string]any {
		m, ok := cfg[name].(map[string]any)
		if !ok {
			m = map[string]any{}
			cfg[name] = m
		}
		return m
	}
	section("profile")["cufile_stats"] = 3
	lg := section("logging")
	lg["dir"] = logDir
	lg["level"] = "INFO"
	section("properties")["allow_compat_mode"] = allowCompat
	return json.MarshalIndent(cfg, "", "  ")
}

// stripJSONComments removes // and /* */ comments outside strings, as
// NVIDIA's cufile.json has them.
func stripJSONComments(b []byte) []byte {
	var out []byte
	inStr, esc := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inStr {
			out = append(out, c)
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		if c == '"' {
			inStr = true
			out = append(out, c)
			continue
		}
		if c == '/' && i+1 < len(b) && b[i+1] == '/' {
			for i < len(b) && b[i] != '\n' {
				i++
			}
			out = append(out, '\n')
			continue
		}
		if c == '/' && i+1 < len(b) && b[i+1] == '*' {
			end := bytes.Index(b[i+2:], []byte("*/"))
			if end < 0 {
				break
			}
			i += end + 3
			continue
		}
		out = append(out, c)
	}
	// cufile.json also tolerates trailing commas before } and ].
	return reTrailingComma(out)
}

func reTrailingComma(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == ',' {
			j := i + 1
			for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
				j++
			}
			if j < len(b) && (b[j] == '}' || b[j] == ']') {
				continue
			}
		}
		out = append(out, b[i])
	}
	return out
}

// runGdsStats runs `gds_stats -p pid -l 3` and parses it.
func runGdsStats(bin string, pid int) (*CufileStats, error) {
	out, err := exec.Command(bin, "-p", fmt.Sprint(pid), "-l", "3").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s -p %d -l 3: %w: %s", bin, pid, err, lastLines(string(out), 3))
	}
	s, err := ParseGdsStats(bytes.NewReader(out))
	if err != nil {
		return nil, fmt.Errorf("%s -p %d -l 3: %w", bin, pid, err)
	}
	return s, nil
}

// scanLogFile scans the cufile.log at path for lines of pid.
func scanLogFile(path string, pid int) (LogScan, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return LogScan{}, nil
		}
		return LogScan{}, err
	}
	defer f.Close()
	return ScanCufileLog(f, pid)
}

// logErrorSummary joins the messages of the log's ERROR lines.
func logErrorSummary(s LogScan) string {
	var msgs []string
	seen := map[string]bool{}
	for _, l := range s.Errors {
		if !seen[l.Message] {
			seen[l.Message] = true
			msgs = append(msgs, l.Message)
		}
	}
	return strings.Join(msgs, "; ")
}
