// Package dist holds the files that install tier0d on a node: the systemd
// unit, its defaults file, an example site configuration and install.sh.
// The tests check that they fit together and with tier0d's flags.
package dist

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"tier0/daemon/config"
)

func TestExampleSiteValid(t *testing.T) {
	c, err := config.Load("tier0.yaml")
	if err != nil {
		t.Fatalf("dist/tier0.yaml must be a valid site configuration: %v", err)
	}
	seen := map[string]string{}
	for _, a := range c.Arrays {
		for _, d := range a.Members {
			if other, ok := seen[d]; ok {
				t.Errorf("drive %s is shared by arrays %s and %s; the example should not share drives", d, other, a.Name)
			}
			seen[d] = a.Name
		}
	}
}

// The unit starts tier0d with flags tier0d has, from variables the
// defaults file sets.
func TestUnitMatchesDaemonFlagsAndDefaults(t *testing.T) {
	unit := read(t, "systemd/tier0d.service")
	defaults := read(t, "default/tier0d")
	daemon := read(t, filepath.Join("..", "cmd", "tier0d", "main.go"))
	exec := regexp.MustCompile(`(?m)^ExecStart=(\S+) (.*)$`).FindStringSubmatch(unit)
	if exec == nil {
		t.Fatal("no ExecStart line")
	}
	for _, m := range regexp.MustCompile(`--([a-z-]+)`).FindAllStringSubmatch(exec[2]+" "+defaults, -1) {
		if !strings.Contains(daemon, `flag.`) || !regexp.MustCompile(`flag\.\w+\("`+m[1]+`"`).MatchString(daemon) {
			t.Errorf("--%s is used by the unit or the defaults file but tier0d has no such flag", m[1])
		}
	}
	for _, m := range regexp.MustCompile(`\$\{?(\w+)`).FindAllStringSubmatch(exec[2], -1) {
		if !regexp.MustCompile(`(?m)^` + m[1] + `=`).MatchString(defaults) {
			t.Errorf("ExecStart uses $%s but default/tier0d does not set it", m[1])
		}
	}
	if !strings.Contains(unit, "EnvironmentFile=-/etc/default/tier0d") {
		t.Error("the unit does not read /etc/default/tier0d")
	}
}

// systemd-analyze finds no unknown keys or sections in the unit.
func TestUnitVerifies(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd)")
	}
	out, _ := exec.Command(sa, "verify", "systemd/tier0d.service").CombinedOutput()
	// Only syntax findings count: the binary is not installed here, and a
	// container without a running systemd adds notes of its own.
	bad := regexp.MustCompile(`(?i)unknown (key|section|lvalue)|invalid|failed to parse|ignoring`)
	for _, l := range strings.Split(string(out), "\n") {
		if bad.MatchString(l) {
			t.Errorf("systemd-analyze verify: %s", l)
		}
	}
}

func TestInstallScript(t *testing.T) {
	bin := t.TempDir()
	for _, b := range []string{"tier0", "tier0d"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\necho "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	run := func() string {
		cmd := exec.Command("sh", "install.sh", bin)
		cmd.Env = append(os.Environ(), "DESTDIR="+root, "PREFIX=/opt/tier0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
		return string(out)
	}
	out := run()
	for path, mode := range map[string]os.FileMode{
		"opt/tier0/bin/tier0": 0o755, "opt/tier0/bin/tier0d": 0o755,
		"etc/systemd/system/tier0d.service": 0o644, "etc/default/tier0d": 0o644,
		"etc/tier0/site.yaml.example": 0o644, "etc/tier0/token": 0o600,
		"opt/tier0/share/doc/tier0/CONFIG.md": 0o644, "opt/tier0/share/doc/tier0/OPERATIONS.md": 0o644,
	} {
		st, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Errorf("%s not installed: %v", path, err)
			continue
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s mode %v, want %v", path, st.Mode().Perm(), mode)
		}
	}
	unit := read(t, filepath.Join(root, "etc/systemd/system/tier0d.service"))
	if !strings.Contains(unit, "ExecStart=/opt/tier0/bin/tier0d ") {
		t.Errorf("unit does not start the binary under PREFIX:\n%s", unit)
	}
	tok := read(t, filepath.Join(root, "etc/tier0/token"))
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(tok) {
		t.Errorf("token %q: want 64 hex digits", tok)
	}
	if !strings.Contains(out, "systemctl daemon-reload") {
		t.Errorf("no next steps printed:\n%s", out)
	}
	// A second run keeps the settings and the token.
	os.WriteFile(filepath.Join(root, "etc/default/tier0d"), []byte("TIER0_NODE=X\n"), 0o644)
	out = run()
	if got := read(t, filepath.Join(root, "etc/tier0/token")); got != tok {
		t.Error("a second install replaced the token")
	}
	if got := read(t, filepath.Join(root, "etc/default/tier0d")); got != "TIER0_NODE=X\n" {
		t.Error("a second install replaced /etc/default/tier0d")
	}
	if !strings.Contains(out, "kept existing /etc/tier0/token") {
		t.Errorf("second run did not say what it kept:\n%s", out)
	}
	// Without binaries it says what to do.
	cmd := exec.Command("sh", "install.sh", t.TempDir())
	cmd.Env = append(os.Environ(), "DESTDIR="+root)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "make build") {
		t.Errorf("install without binaries: %v\n%s", err, out)
	}
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
