//go:build cgo && linux

package gds

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tier0/gds/cufile"
	"tier0/internal/testenv"
)

// realLibcufile skips when Debian's libcufile0 is missing and this is not
// root (root runs scripts/install-deps.sh, which installs it; as root a
// missing library is a failure).
func realLibcufile(t *testing.T) {
	t.Helper()
	if _, err := cufile.Open("libcufile.so.0"); err != nil {
		if os.Geteuid() != 0 {
			testenv.Missing(t, "libcufile.so.0 not installed (%v) and not root: run scripts/install-deps.sh as root to install Debian's libcufile0", err)
		}
		t.Fatalf("libcufile.so.0 not loadable as root (%v): scripts/install-deps.sh should have installed libcufile0 from Debian non-free", err)
	}
}

func hostHasLibcuda() bool {
	_, err := cufile.OpenCUDA("libcuda.so.1")
	return err == nil
}

// On this GPU-less machine, with the real libcufile installed, the verdict
// must name the missing piece: libcuda.so.1.
func TestRealLibcufileNoGPUVerdict(t *testing.T) {
	realLibcufile(t)
	if hostHasLibcuda() {
		t.Skip("this host has libcuda.so.1 (an NVIDIA driver): the no-GPU verdict cannot be observed here")
	}
	for _, k := range []string{EnvCufileLib, EnvCUDALib, "CUFILE_ENV_PATH_JSON", "CUFILE_LOGFILE_PATH"} {
		t.Setenv(k, "")
	}
	dir := t.TempDir()
	v, err := Validate(context.Background(), Options{Dir: dir, Size: 1 << 20, WorkDir: filepath.Join(dir, "work")})
	if err != nil {
		t.Fatal(err)
	}
	if v.Available || v.Cause != CauseNoCUDA || v.ExitCode() != ExitNotAvailable {
		t.Fatalf("verdict = %+v", v)
	}
	want := "not available on this host: libcuda not loadable: dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file"
	if !strings.HasPrefix(v.Summary(), want) {
		t.Errorf("summary = %q\nwant prefix %q", v.Summary(), want)
	}
}

// The real cuFileDriverOpen on a host without libcuda.so.1: libcufile 1.4
// cannot load the CUDA driver itself and fails with 5033; the verdict
// carries the code and cufile.log's explanation. The stand-in libcuda and
// nvidia-fs stats file only get the validator past its own checks.
func TestRealLibcufileDriverOpen5033(t *testing.T) {
	realLibcufile(t)
	if hostHasLibcuda() {
		t.Skip("this host has libcuda.so.1: cuFileDriverOpen would not fail with 5033 here")
	}
	_, _, cudaLib := standinLibs(t)
	s := newStandin(t, "libcufile.so.0")
	s.opts.CUDALib = cudaLib
	v, err := Validate(context.Background(), s.opts)
	if err != nil {
		t.Fatal(err)
	}
	if v.Cause != CauseDriverOpen || v.ExitCode() != ExitNotAvailable {
		t.Fatalf("verdict = %s (cause %q)", v.Summary(), v.Cause)
	}
	for _, want := range []string{
		"cuFileDriverOpen: error 5033 (CU_FILE_NVFS_SETUP_ERROR: NVFS driver initialization error)",
		"cufile.log: unable to load, libcuda.so.1; missing cuda symbols while dynamic loading; cuFile initialization failed",
	} {
		if !strings.Contains(v.Reason, want) {
			t.Errorf("reason %q\nlacks %q", v.Reason, want)
		}
	}
}
