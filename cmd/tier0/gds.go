package main

// tier0 gds: the GPUDirect Storage validator and the nvidia-fs counters.
// See docs/GDS.md.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/olekukonko/tablewriter"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/gds"
)

// gdsExitError carries a GDS verdict's exit code (0 proven, 1 proof failed,
// 3 not available, 2 usage) to main through exitCoder.
type gdsExitError struct {
	code int
	msg  string
}

func (e gdsExitError) Error() string { return e.msg }
func (e gdsExitError) ExitCode() int { return e.code }

const gdsExitUsage = 2

// newGdsCmd is `tier0 gds validate|stats`.
func newGdsCmd(root *rootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gds",
		Short: "GPUDirect Storage: prove the direct nvidia-fs path, show its counters",
	}
	cmd.AddCommand(newGdsValidateCmd(root), newGdsStatsCmd(root))
	return cmd
}

// gdsValidateOptions are the flags of gds validate: the validator's
// options and the sizes as given.
type gdsValidateOptions struct {
	gds.Options
	size, ioSize string
	verbose      bool
}

func (o *gdsValidateOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.File, "file", "", "file or block device to read (must support O_DIRECT)")
	f.StringVar(&o.Dir, "dir", "", "directory in which to write, read and remove a test file")
	f.IntVar(&o.GPU, "gpu", 0, "CUDA device ordinal")
	f.StringVar(&o.size, "size", "", "bytes to read (default: the whole file, or 1G with --dir)")
	f.StringVar(&o.ioSize, "io-size", "1M", "size of one read")
	f.IntVar(&o.Threads, "threads", 4, "concurrent readers, one GPU buffer each")
	f.BoolVar(&o.Strict, "strict", false, "disable cuFile compat mode so a missing direct path fails loudly")
	f.BoolVar(&o.SkipCPUOnly, "no-cpu-only", false, "skip the CPU_ONLY comparison")
	f.StringVar(&o.BaseConfig, "cufile-json", "", "site cufile.json to start from (default $CUFILE_ENV_PATH_JSON or /etc/cufile.json)")
	f.StringVar(&o.WorkDir, "work-dir", "", "keep the run's cufile.json and cufile.log here (default: a temporary directory, kept only when the proof fails)")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "log progress to stderr")
}

func newGdsValidateCmd(root *rootOptions) *cobra.Command {
	o := &gdsValidateOptions{}
	cmd := &cobra.Command{
		Use:   "validate --file PATH|--dir DIR [--gpu N] [--size S] [--io-size S] [--threads N] [--strict]",
		Short: "read into GPU memory through cuFile and prove the nvfs DMA path was used",
		Long: `Reads a file into GPU memory with cuFile (O_DIRECT, registered GPU buffers)
and proves the direct path: nvidia-fs read counters before and after, cuFile's
own counters, and cufile.log compat-mode notices. Then measures CPU_ONLY (pread
into pinned memory, copy to the GPU) for comparison.

Exit codes: 0 proven, 1 proof failed, 3 not available on this host, 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runGdsValidate(cmd, root.json, o) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runGdsValidate(cmd *cobra.Command, jsonOut bool, vo *gdsValidateOptions) error {
	o := vo.Options
	var err error
	if vo.size != "" {
		if o.Size, err = gds.ParseSize(vo.size); err != nil {
			return gdsExitError{gdsExitUsage, err.Error()}
		}
	}
	io, err := gds.ParseSize(vo.ioSize)
	if err != nil {
		return gdsExitError{gdsExitUsage, err.Error()}
	}
	o.IOSize = int(io)
	if vo.verbose {
		o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	}
	v, err := gds.Validate(cmd.Context(), o)
	if err != nil {
		if errors.Is(err, gds.ErrUsage) {
			return gdsExitError{gdsExitUsage, err.Error()}
		}
		return err
	}
	if err := printVerdict(cmd.OutOrStdout(), jsonOut, v); err != nil {
		return err
	}
	if code := v.ExitCode(); code != 0 {
		return gdsExitError{code, v.Summary()}
	}
	return nil
}

func printVerdict(w io.Writer, jsonOut bool, v gds.Verdict) error {
	if jsonOut {
		return gdsWriteJSON(w, v)
	}
	fmt.Fprintln(w, v.Summary())
	if !v.Available {
		return nil
	}
	ev := v.Evidence
	t := tablewriter.NewWriter(w)
	t.Header("CHECK", "VALUE")
	rows := [][]any{
		{"file", ev.File},
		{"gpu", fmt.Sprintf("%d %s", ev.GPU, ev.GPUName)},
		{"reads", fmt.Sprintf("%d x %d bytes, %d threads, %d failed", ev.Ops, ev.IOSize, ev.Threads, ev.Failed)},
		{"nvidia-fs reads", gdsCounterRow(ev)},
		{"cuFile counters", gdsCufileRow(ev)},
		{"cufile.log", fmt.Sprintf("%d compat notices, %d errors", len(ev.Log.Compat), len(ev.Log.Errors))},
		{"data check", gdsDataRow(ev)},
		{"GPU_DIRECT", fmt.Sprintf("%.2f GiB/s", v.GPUDirectGiBs)},
		{"CPU_ONLY", fmt.Sprintf("%.2f GiB/s", v.CPUOnlyGiBs)},
		{"gain", fmt.Sprintf("%+.1f%%", v.Gain*100)},
	}
	if ev.LogPath != "" {
		rows = append(rows, []any{"log", ev.LogPath})
	}
	for _, f := range v.Failures {
		rows = append(rows, []any{"FAILED", f})
	}
	for _, n := range ev.Notes {
		rows = append(rows, []any{"note", n})
	}
	for _, r := range rows {
		if err := t.Append(r...); err != nil {
			return err
		}
	}
	return t.Render()
}

func gdsCounterRow(ev gds.Evidence) string {
	if !ev.NvfsBefore.Present || !ev.NvfsAfter.Present {
		return "not published: " + ev.NvfsNote
	}
	return fmt.Sprintf("n %d -> %d (+%d), err +%d", ev.NvfsBefore.N, ev.NvfsAfter.N, ev.NvfsAfter.N-ev.NvfsBefore.N, ev.NvfsAfter.Err-ev.NvfsBefore.Err)
}

func gdsCufileRow(ev gds.Evidence) string {
	if ev.CufileSource == "" {
		return "unavailable: " + ev.CufileNote
	}
	s := fmt.Sprintf("%d reads, %d posix, %d errors", ev.CufileReads, ev.CufilePosix, ev.CufileErrors)
	if ev.CufileHasNvfs {
		s += fmt.Sprintf(", %d nvfs", ev.CufileNvfs)
	}
	return s + " (" + ev.CufileSource + ")"
}

func gdsDataRow(ev gds.Evidence) string {
	if !ev.DataChecked {
		return "not checked"
	}
	if ev.DataMismatch > 0 {
		return fmt.Sprintf("%d buffers differ", ev.DataMismatch)
	}
	return "GPU buffers match the file"
}

// gdsStatsOptions are the flags of gds stats.
type gdsStatsOptions struct {
	path string
}

func (o *gdsStatsOptions) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&o.path, "file", gds.DefaultNvfsStatsPath, "nvidia-fs stats file, or a saved `gds_stats -l 3` output")
}

func newGdsStatsCmd(root *rootOptions) *cobra.Command {
	o := &gdsStatsOptions{}
	cmd := &cobra.Command{
		Use:   "stats [--file /proc/driver/nvidia-fs/stats]",
		Short: "print the nvidia-fs kernel counters (or saved gds_stats output)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := os.ReadFile(o.path)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) && o.path == gds.DefaultNvfsStatsPath {
					return gdsExitError{gds.ExitNotAvailable, fmt.Sprintf("not available on this host: nvidia-fs kernel module not loaded (%s missing)", o.path)}
				}
				return err
			}
			w := cmd.OutOrStdout()
			if bytes.HasPrefix(bytes.TrimSpace(b), []byte("cuFile STATS VERSION")) {
				s, err := gds.ParseGdsStats(bytes.NewReader(b))
				if err != nil {
					return fmt.Errorf("%s: %w", o.path, err)
				}
				return printGdsStats(w, root.json, s)
			}
			s, err := gds.ParseNvfsStats(bytes.NewReader(b))
			if err != nil {
				return fmt.Errorf("%s: %w", o.path, err)
			}
			return printNvfsStats(w, root.json, s)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func printNvfsStats(w io.Writer, jsonOut bool, s *gds.NvfsStats) error {
	if jsonOut {
		return gdsWriteJSON(w, s)
	}
	ioStats := "disabled (Reads n/ok not counted; enable with: echo 1 > " + gds.DefaultNvfsParamsDir + "/rw_stats_enabled)"
	if s.IOStatsEnabled {
		ioStats = "enabled"
	}
	fmt.Fprintf(w, "nvidia-fs %s, GDS %s, stats version %s, IO stats %s\n", s.DriverVersion, s.GDSVersion, s.StatsVersion, ioStats)
	t := tablewriter.NewWriter(w)
	t.Header("SECTION", "COUNTER", "VALUE")
	for _, sec := range s.Order {
		for _, k := range gdsSortedKeys(s.Sections[sec]) {
			if err := t.Append(sec, k, gdsNum(s.Sections[sec][k])); err != nil {
				return err
			}
		}
	}
	for _, g := range s.GPUs {
		for _, k := range gdsSortedKeys(g.Counters) {
			if err := t.Append("GPU "+g.BusID, k, gdsNum(g.Counters[k])); err != nil {
				return err
			}
		}
	}
	return t.Render()
}

func printGdsStats(w io.Writer, jsonOut bool, s *gds.CufileStats) error {
	if jsonOut {
		return gdsWriteJSON(w, s)
	}
	fmt.Fprintf(w, "cuFile stats version %d\n", s.Version)
	t := tablewriter.NewWriter(w)
	t.Header("GPU", "READS", "POSIX", "NVFS", "ERR", "READ MIB", "GIB/S")
	for _, g := range s.GPUs {
		nvfs := "-"
		if v, ok := g.Read["nvfs"]; ok {
			nvfs = gdsNum(v)
		}
		if err := t.Append(fmt.Sprint(g.Index), gdsNum(g.Read["n"]), gdsNum(g.Read["posix"]), nvfs, gdsNum(g.Read["err"]), gdsNum(g.Read["MiB"]), gdsNum(g.Read["bw"])); err != nil {
			return err
		}
	}
	return t.Render()
}

func gdsSortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func gdsNum(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprint(int64(v))
	}
	return strings.TrimRight(fmt.Sprintf("%.6f", v), "0")
}

func gdsWriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
