package gobuild

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestBuildBinaries(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go tool is not on $PATH (%v): the module's tests run with it", err)
	}
	dir := t.TempDir()
	paths, err := BuildBinaries(dir, "tier0d")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 1 || paths[0] != dir+"/tier0d" {
		t.Fatalf("paths %v, want [%s/tier0d]", paths, dir)
	}
	fi, err := os.Stat(paths[0])
	if err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("built tier0d: %v, mode %v; want an executable", err, fi)
	}
}

func TestBuildBinariesRefusesBadNames(t *testing.T) {
	for _, names := range [][]string{nil, {""}, {"cmd/tier0d"}} {
		_, err := BuildBinaries(t.TempDir(), names...)
		if err == nil || !strings.Contains(err.Error(), "expected") {
			t.Errorf("BuildBinaries(%q): %v, want an error saying what is expected", names, err)
		}
	}
}

func TestBuildBinariesWithoutGo(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := BuildBinaries(t.TempDir(), "tier0d")
	if !errors.Is(err, ErrNoGo) {
		t.Fatalf("without go on $PATH: %v, want ErrNoGo", err)
	}
}
