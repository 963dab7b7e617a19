package archtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestTargetDirNotIgnoredByCommonTemplates: daemon/target keeps its name
// (the NVMe term, as Linux's nvmet and SPDK's nvmf_tgt use it), but Maven's,
// Rust's and many editors' ignore templates ignore every `target/` folder.
// A developer with such a global excludes file would silently leave new
// files of the NVMe target out of their commits. The project's .gitignore
// re-includes the folder, and .gitignore takes precedence over a global
// excludes file (docs/ARCHITECTURE.md, "Names").
func TestTargetDirNotIgnoredByCommonTemplates(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".git")); err != nil {
		t.Skipf("not a git checkout (%v): nothing to ignore", err)
	}
	excl := filepath.Join(t.TempDir(), "global-excludes")
	if err := os.WriteFile(excl, []byte("target/\n/target\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("git", "-c", "core.excludesFile="+excl, "check-ignore", "--no-index", "-v", "daemon/target/new_file.go")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a global excludes file with `target/` ignores new files in daemon/target:\n%s\nadd `!/daemon/target/` to .gitignore", out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("git check-ignore: %v\n%s", err, out)
	}
}
