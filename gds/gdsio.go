package gds

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// GdsioResult is one gdsio result line, for example
//
//	IoType: READ XferType: GPUD Threads: 8 DataSetSize: 818796544/4096000(KiB) IOSize: 1024(KiB) Throughput: 6.524658 GiB/sec, Avg_Latency: 1197.370995 usecs ops: 799606 total_time 119.679102 secs
//
// (GPU_BATCH adds "IoDepth: N"). XferType only echoes the requested mode:
// it proves nothing about the path taken; the validator does that.
type GdsioResult struct {
	Node           string     `json:"node,omitempty"` // set by the caller when aggregating nodes
	IoType         string     `json:"io_type"`        // READ, WRITE, RANDREAD, RANDWRITE
	XferType       string     `json:"xfer_type"`      // GPUD, CPUONLY, CPU_GPU, GPUD_ASYNC, GPU_BATCH...
	Threads        int        `json:"threads"`
	IoDepth        int        `json:"io_depth,omitempty"`
	DataKiB        uint64     `json:"data_kib"`     // KiB transferred
	DataSetKiB     uint64     `json:"data_set_kib"` // configured data set size
	IOSizeKiB      string     `json:"io_size_kib"`  // as printed ("1024", or a range)
	IOSizeBytes    int64      `json:"io_size_bytes,omitempty"`
	ThroughputGiBs float64    `json:"throughput_gib_s"`
	AvgLatencyUs   float64    `json:"avg_latency_us"`
	Ops            int64      `json:"ops"`
	TotalTimeS     float64    `json:"total_time_s"`
	Verified       bool       `json:"verified,omitempty"` // a "Verifying data" line came before
	Jobs           []GdsioJob `json:"jobs,omitempty"`
}

// GdsioJob is a per-job line of a gdsio config-file run ("- Job ID: ..."),
// with the per-thread spread from the "-- Per Thread" line after it.
type GdsioJob struct {
	ID                 int     `json:"id"`
	Threads            int     `json:"threads"`
	DataKiB            uint64  `json:"data_kib"`
	ThroughputGiBs     float64 `json:"throughput_gib_s"`
	AvgLatencyUs       float64 `json:"avg_latency_us"`
	ThreadMinGiBs      float64 `json:"thread_min_gib_s,omitempty"`
	ThreadMaxGiBs      float64 `json:"thread_max_gib_s,omitempty"`
	ThreadMinLatencyUs float64 `json:"thread_min_latency_us,omitempty"`
	ThreadMaxLatencyUs float64 `json:"thread_max_latency_us,omitempty"`
}

var (
	reGdsioResult = regexp.MustCompile(`IoType:\s*(\S+)\s+XferType:\s*(\S+)\s+Threads:\s*(\d+)\s+(?:IoDepth:\s*(\d+)\s+)?DataSetSize:\s*(\d+)/(\d+)\(KiB\)\s+IOSize:\s*(\S+?)\(KiB\)\s+Throughput:\s*([0-9.eE+-]+)\s*GiB/sec,\s*Avg_Latency:\s*([0-9.eE+-]+)\s*usecs\s+ops:\s*(\d+)\s+total_time\s+([0-9.eE+-]+)\s*secs`)
	reGdsioJob    = regexp.MustCompile(`^-\s*Job ID:\s*(\d+)\s+Threads:\s*(\d+)\s+DataSetSize\s*:\s*(\d+)\s*\(KiB\)\s+Throughput:\s*([0-9.eE+-]+)\s*GiB/sec,\s*Avg_Latency:\s*([0-9.eE+-]+)`)
	reGdsioThread = regexp.MustCompile(`^--\s*Per Thread Throughput\(Min/Max\):\s*([0-9.eE+-]+)/([0-9.eE+-]+)\s*GiB/sec,\s*Per Thread Latency\(Min/Max\):\s*([0-9.eE+-]+)/([0-9.eE+-]+)`)
)

// ErrNoGdsioResult: the output held no gdsio result line.
var ErrNoGdsioResult = errors.New("no gdsio result line")

// ParseGdsio parses gdsio output: every result line in either printf
// format of gdsio 1.4 (with and without IoDepth), plus the per-job lines of
// config-file runs, which attach to the next result line (or the last one
// at the end). Other lines are ignored. No result line is ErrNoGdsioResult.
func ParseGdsio(r io.Reader) ([]GdsioResult, error) {
	var out []GdsioResult
	var jobs []GdsioJob
	verifying := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "Verifying data") {
			verifying = true
			continue
		}
		if m := reGdsioThread.FindStringSubmatch(line); m != nil && len(jobs) > 0 {
			j := &jobs[len(jobs)-1]
			j.ThreadMinGiBs, j.ThreadMaxGiBs = atof(m[1]), atof(m[2])
			j.ThreadMinLatencyUs, j.ThreadMaxLatencyUs = atof(m[3]), atof(m[4])
			continue
		}
		if m := reGdsioJob.FindStringSubmatch(line); m != nil {
			jobs = append(jobs, GdsioJob{
				ID: atoi(m[1]), Threads: atoi(m[2]), DataKiB: atou(m[3]),
				ThroughputGiBs: atof(m[4]), AvgLatencyUs: atof(m[5]),
			})
			continue
		}
		m := reGdsioResult.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		res := GdsioResult{
			IoType: m[1], XferType: m[2], Threads: atoi(m[3]),
			DataKiB: atou(m[5]), DataSetKiB: atou(m[6]), IOSizeKiB: m[7],
			ThroughputGiBs: atof(m[8]), AvgLatencyUs: atof(m[9]),
			Ops: int64(atou(m[10])), TotalTimeS: atof(m[11]),
			Verified: verifying, Jobs: jobs,
		}
		if m[4] != "" {
			res.IoDepth = atoi(m[4])
		}
		if k, err := strconv.ParseInt(m[7], 10, 64); err == nil {
			res.IOSizeBytes = k * 1024
		}
		out = append(out, res)
		jobs, verifying = nil, false
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("reading gdsio output: %w", err)
	}
	if len(out) == 0 {
		return nil, ErrNoGdsioResult
	}
	if len(jobs) > 0 {
		out[len(out)-1].Jobs = append(out[len(out)-1].Jobs, jobs...)
	}
	return out, nil
}

func atoi(s string) int     { v, _ := strconv.Atoi(s); return v }
func atou(s string) uint64  { v, _ := strconv.ParseUint(s, 10, 64); return v }
func atof(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }

// gdsio transfer types (-x).
const (
	XferGPUDirect      = 0
	XferCPUOnly        = 1
	XferCPUGPU         = 2
	XferCPUAsyncGPU    = 3
	XferCPUCachedGPU   = 4
	XferGPUDirectAsync = 5
	XferGPUBatch       = 6
)

// gdsio I/O types (-I).
const (
	IORead      = 0
	IOWrite     = 1
	IORandRead  = 2
	IORandWrite = 3
)

// GdsioConfig is one gdsio invocation.
type GdsioConfig struct {
	Binary  string   `json:"binary,omitempty"`  // default: FindGdsio()
	File    string   `json:"file,omitempty"`    // -f (one of File, Dir)
	Dir     string   `json:"dir,omitempty"`     // -D
	GPU     int      `json:"gpu"`               // -d
	Threads int      `json:"threads"`           // -w
	Size    string   `json:"size"`              // -s, e.g. "10G"
	IOSize  string   `json:"io_size"`           // -i, e.g. "1M"
	Xfer    int      `json:"xfer"`              // -x, Xfer*
	IOType  int      `json:"io_type"`           // -I, IO*
	Seconds int      `json:"seconds,omitempty"` // -T
	Verify  bool     `json:"verify,omitempty"`  // -V
	Extra   []string `json:"extra,omitempty"`   // appended verbatim
}

// SeedGdsioConfig is the seed's GDS measurement (a sequential 1 MiB read of
// a file on the shared file system into one GPU, GPU_DIRECT; run it again
// with Xfer = XferCPUOnly for the comparison). The seed does not state its
// thread count or data set size; 8 threads, 10 GiB and 60 s are tier0's
// choice.
func SeedGdsioConfig(file string, gpu int) GdsioConfig {
	return GdsioConfig{File: file, GPU: gpu, Threads: 8, Size: "10G", IOSize: "1M", Xfer: XferGPUDirect, IOType: IORead, Seconds: 60}
}

// Args returns the gdsio command-line arguments for c.
func (c GdsioConfig) Args() ([]string, error) {
	var a []string
	switch {
	case c.File != "" && c.Dir != "":
		return nil, fmt.Errorf("gdsio: both file %q and dir %q given; set one", c.File, c.Dir)
	case c.File != "":
		a = append(a, "-f", c.File)
	case c.Dir != "":
		a = append(a, "-D", c.Dir)
	default:
		return nil, fmt.Errorf("gdsio: no file or dir given; set GdsioConfig.File or Dir")
	}
	if c.Threads <= 0 {
		return nil, fmt.Errorf("gdsio: threads %d, expected at least 1", c.Threads)
	}
	if c.Size == "" || c.IOSize == "" {
		return nil, fmt.Errorf("gdsio: size %q and io size %q must both be set (e.g. 10G and 1M)", c.Size, c.IOSize)
	}
	if c.Xfer < 0 || c.Xfer > XferGPUBatch {
		return nil, fmt.Errorf("gdsio: xfer type %d, expected 0..6", c.Xfer)
	}
	if c.IOType < 0 || c.IOType > IORandWrite {
		return nil, fmt.Errorf("gdsio: io type %d, expected 0..3", c.IOType)
	}
	a = append(a, "-d", strconv.Itoa(c.GPU), "-w", strconv.Itoa(c.Threads),
		"-s", c.Size, "-i", c.IOSize, "-x", strconv.Itoa(c.Xfer), "-I", strconv.Itoa(c.IOType))
	if c.Seconds > 0 {
		a = append(a, "-T", strconv.Itoa(c.Seconds))
	}
	if c.Verify {
		a = append(a, "-V")
	}
	return append(a, c.Extra...), nil
}

// DefaultGdsioPath is where Debian's gds-tools installs gdsio.
const DefaultGdsioPath = "/usr/libexec/gds/tools/gdsio"

// ErrNoGdsio: gdsio is neither at DefaultGdsioPath nor on PATH.
var ErrNoGdsio = errors.New("gdsio not found")

// FindGdsio returns DefaultGdsioPath if it exists, else gdsio from PATH.
func FindGdsio() (string, error) {
	return findTool(DefaultGdsioPath, "gdsio", ErrNoGdsio)
}

func findTool(def, name string, sentinel error) (string, error) {
	if st, err := os.Stat(def); err == nil && !st.IsDir() {
		return def, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: not at %s nor on PATH (install gds-tools from Debian non-free, or the CUDA GDS package)", sentinel, def)
}

// RunGdsio runs gdsio with c and parses its result lines. The combined
// output is returned too, for reports and for diagnosing a failed run.
func RunGdsio(ctx context.Context, c GdsioConfig) ([]GdsioResult, []byte, error) {
	args, err := c.Args()
	if err != nil {
		return nil, nil, err
	}
	bin := c.Binary
	if bin == "" {
		if bin, err = FindGdsio(); err != nil {
			return nil, nil, err
		}
	}
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &buf, &buf
	runErr := cmd.Run()
	res, perr := ParseGdsio(bytes.NewReader(buf.Bytes()))
	if runErr != nil {
		return res, buf.Bytes(), fmt.Errorf("%s %s: %w; output: %s", bin, strings.Join(args, " "), runErr, lastLines(buf.String(), 5))
	}
	if perr != nil {
		return nil, buf.Bytes(), fmt.Errorf("%s %s: %w; output: %s", bin, strings.Join(args, " "), perr, lastLines(buf.String(), 5))
	}
	return res, buf.Bytes(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// GdsioAggregate sums results that ran at the same time on several nodes
// (or GPUs): throughput and ops add up; latency is the ops-weighted mean;
// time is the longest run.
type GdsioAggregate struct {
	Results        int      `json:"results"`
	Nodes          []string `json:"nodes,omitempty"`
	IoType         string   `json:"io_type"`
	XferType       string   `json:"xfer_type"`
	ThroughputGiBs float64  `json:"throughput_gib_s"`
	Ops            int64    `json:"ops"`
	DataKiB        uint64   `json:"data_kib"`
	AvgLatencyUs   float64  `json:"avg_latency_us"`
	MaxTotalTimeS  float64  `json:"max_total_time_s"`
}

// AggregateGdsio combines results of one concurrent run across nodes. All
// results must have the same IoType and XferType; mixing them is an error
// that names both.
func AggregateGdsio(rs []GdsioResult) (GdsioAggregate, error) {
	var a GdsioAggregate
	if len(rs) == 0 {
		return a, fmt.Errorf("aggregate gdsio: no results")
	}
	a.IoType, a.XferType = rs[0].IoType, rs[0].XferType
	var latW float64
	seen := map[string]bool{}
	for _, r := range rs {
		if r.IoType != a.IoType || r.XferType != a.XferType {
			return GdsioAggregate{}, fmt.Errorf("aggregate gdsio: result of node %q is %s/%s, expected %s/%s like the first; aggregate one kind at a time",
				r.Node, r.IoType, r.XferType, a.IoType, a.XferType)
		}
		a.Results++
		a.ThroughputGiBs += r.ThroughputGiBs
		a.Ops += r.Ops
		a.DataKiB += r.DataKiB
		latW += r.AvgLatencyUs * float64(r.Ops)
		if r.TotalTimeS > a.MaxTotalTimeS {
			a.MaxTotalTimeS = r.TotalTimeS
		}
		if r.Node != "" && !seen[r.Node] {
			seen[r.Node] = true
			a.Nodes = append(a.Nodes, r.Node)
		}
	}
	if a.Ops > 0 {
		a.AvgLatencyUs = latW / float64(a.Ops)
	}
	return a, nil
}
