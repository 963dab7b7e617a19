package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tier0/gds"
	"tier0/gds/cufile"
)

func needCgoGds(t *testing.T) {
	t.Helper()
	if !cufile.Built {
		t.Skip("built without cgo: the validator has no cuFile bindings (its verdict is not-built)")
	}
}

// runGdsCLI runs the tier0 command tree with args and returns stdout and
// the process exit code main would use.
func runGdsCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	root := newRootCmd()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	code := 0
	if err != nil {
		code = exitCode(err)
		out.WriteString("error: " + err.Error() + "\n")
	}
	return out.String(), code
}

func TestGdsStatsJSON(t *testing.T) {
	out, code := runGdsCLI(t, "gds", "stats", "--json=true", "--file", "../../gds/testdata/nvfs-stats-2.25.7-iostats-disabled.txt")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	var s gds.NvfsStats
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if s.DriverVersion != "2.25.7" || s.IOStatsEnabled || len(s.GPUs) != 1 || s.Sections["Mmap"]["munmap"] != 2 {
		t.Errorf("stats = %+v", s)
	}
	out, code = runGdsCLI(t, "gds", "stats", "--json=false", "--file", "../../gds/testdata/gds_stats-l3-nvidia-doc.txt")
	if code != 0 || !strings.Contains(out, "78193") || !strings.Contains(out, "cuFile stats version 3") {
		t.Errorf("gds_stats table, exit %d:\n%s", code, out)
	}
}

func TestGdsValidateExitCodes(t *testing.T) {
	needCgoGds(t)
	dir := t.TempDir()
	t.Setenv(gds.EnvCUDALib, "/nonexistent/libcuda.so.1")
	out, code := runGdsCLI(t, "gds", "validate", "--json=false", "--work-dir=", "--strict=false", "--file=", "--dir", dir, "--size", "1M", "--io-size", "64K")
	if code != gds.ExitNotAvailable || !strings.HasPrefix(out, "not available on this host: ") || !strings.Contains(out, "libcuda") {
		t.Errorf("no libcuda: exit %d, output %q", code, out)
	}
	out, code = runGdsCLI(t, "gds", "validate", "--json=false", "--work-dir=", "--strict=false", "--file=", "--dir", dir, "--size", "1M", "--io-size", "1000")
	if code != gdsExitUsage || !strings.Contains(out, "io size 1000") {
		t.Errorf("bad io size: exit %d, output %q", code, out)
	}
}

// A POSIX fallback seen through the stand-in cuFile must exit 1 with the
// account on stdout.
func TestGdsValidateProofFailedExit(t *testing.T) {
	needCgoGds(t)
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc to build the stand-in cuFile library")
	}
	dir := t.TempDir()
	for _, b := range [][2]string{{"libcufile_standin.so", "cufile_standin.c"}, {"libcuda_standin.so", "cuda_standin.c"}} {
		if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", filepath.Join(dir, b[0]), "../../gds/testdata/standin/"+b[1], "-lpthread").CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v: %s", err, out)
		}
	}
	params := filepath.Join(dir, "params")
	os.Mkdir(params, 0o755)
	os.WriteFile(filepath.Join(params, "rw_stats_enabled"), []byte("1\n"), 0o644)
	stats := filepath.Join(dir, "stats")
	os.WriteFile(stats, []byte("NVFS Driver(version: 2.20.5)\nReads : n=0 ok=0 err=0\n"), 0o644)
	for k, v := range map[string]string{
		gds.EnvCufileLib: filepath.Join(dir, "libcufile_standin.so"), gds.EnvCUDALib: filepath.Join(dir, "libcuda_standin.so"),
		gds.EnvNvfsStats: stats, gds.EnvNvfsParams: params, gds.EnvGdsStats: "/nonexistent",
		"STANDIN_NVFS_STATS": stats, "STANDIN_NVFS_PARAMS": params, "STANDIN_POSIX_EVERY": "2",
		"CUFILE_ENV_PATH_JSON": "/dev/null", "CUFILE_LOGFILE_PATH": "", "CUFILE_ALLOW_COMPAT_MODE": "",
	} {
		t.Setenv(k, v)
	}
	data := filepath.Join(dir, "data")
	os.WriteFile(data, make([]byte, 1<<20), 0o644)
	out, code := runGdsCLI(t, "gds", "validate", "--json=false", "--file", data, "--dir=", "--size=", "--io-size", "64K", "--threads", "2", "--work-dir", filepath.Join(dir, "work"))
	if code != gds.ExitProofFailed || !strings.HasPrefix(out, "proof failed: 16 operations, 8 through nvfs, 8 POSIX fallbacks: ") {
		t.Errorf("exit %d, output:\n%s", code, out)
	}
}
