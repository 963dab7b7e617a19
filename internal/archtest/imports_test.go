package archtest

import (
	"bufio"
	"bytes"
	"os/exec"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"
)

const module = "tier0"

// allowed is docs/ARCHITECTURE.md's "may import" column: for each package
// (or a folder ending in "/..."), the tier0 packages its non-test files may
// import: a package path, or a folder ending in "/" for everything under it. A package missing from the table fails the test, so
// that a new package is placed in a layer on purpose. "*" allows anything.
var allowed = map[string][]string{
	// Leaves: no tier0 import (config reads secrets with nvme's parser, so
	// that it accepts exactly what the fabric does; both are leaves).
	"internal/version":  nil,
	"internal/testenv":  {"internal/gobuild"},
	"internal/gobuild":  nil,
	"internal/archtest": nil,
	"internal/units":    nil,
	"daemon/blockdev":   nil,
	"daemon/nvme":       nil,
	"daemon/discover":   nil,
	"daemon/config":     {"daemon/nvme"},
	"daemon/cluster":    nil,
	"daemon/clock":      nil,
	// The data path meets only through blockdev.Device.
	"daemon/blockdev/local":        {"daemon/blockdev"},
	"daemon/blockdev/blockdevtest": {"daemon/blockdev"},
	"daemon/target":                {"daemon/blockdev", "daemon/clock", "daemon/nvme", "daemon/rdma"},
	"daemon/transport":             {"daemon/nvme"},
	"daemon/host":                  {"daemon/blockdev", "daemon/clock", "daemon/nvme", "daemon/transport"},
	"daemon/rdma":                  {"daemon/blockdev", "daemon/nvme", "daemon/transport"},
	"daemon/raid":                  {"daemon/blockdev", "daemon/clock"},
	// The control plane.
	"daemon/store":       {"daemon/config", "daemon/cluster", "daemon/clock"},
	"daemon/api":         {"daemon/config", "daemon/cluster", "daemon/store", "daemon/raid"},
	"daemon/slurm":       nil,
	"daemon/slurm/drain": {"daemon/slurm"},
	// The daemon wires every daemon/ package, and nothing above daemon/.
	"daemon/node": {"daemon/"},

	// The simulation's in-memory store (reliability/sim).
	"daemon/store/memstore": {"daemon/store", "daemon/clock"},

	// Above the daemon.
	"bench":                      {"daemon/blockdev", "daemon/host", "daemon/nvme", "daemon/config", "internal/version"},
	"bench/...":                  {"bench", "daemon/", "internal/version"},
	"reports":                    {"bench"},
	"gds":                        {"gds/cufile"},
	"gds/cufile":                 nil,
	"slurm-plugin/...":           {"slurm-plugin/", "daemon/slurm", "internal/fakescontrol"},
	"internal/fakescontrol":      nil,
	"internal/localslurm":        nil,               // a Slurm on this machine (validate --local-slurm, slurm-plugin/slurmtest)
	"internal/localcluster":      {"daemon/config"}, // a site's tier0d processes on this machine (validate, reliability/campaign)
	"reliability/...":            {"reliability/", "daemon/", "bench", "internal/"},
	"validate":                   {"bench", "daemon/", "gds", "reports", "test/vm", "reliability/", "internal/"},
	"validate/...":               {"bench", "daemon/", "gds", "reports", "test/vm", "reliability/", "validate", "internal/"},
	"test/...":                   {"daemon/", "internal/", "test/", "bench", "reliability/"},
	"dist":                       nil,
	"cmd/tier0":                  {"*"},
	"cmd/tier0d":                 {"daemon/config", "daemon/node", "internal/version"},
	"slurm-plugin/slurmtest":     {"*"},
	"internal/archtest/testdata": nil,
}

type pkg struct {
	path    string   // without the module prefix
	imports []string // tier0 imports of its non-test files, without the prefix
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go tool is not in PATH (%v): this test lists the module's imports with go list", err)
	}
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		p := pkg{path: strings.TrimPrefix(f[0], module+"/")}
		for _, imp := range f[1:] {
			if rest, ok := strings.CutPrefix(imp, module+"/"); ok {
				p.imports = append(p.imports, rest)
			}
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// rule finds the table entry for a package: its own, else the nearest
// "dir/..." above it.
func rule(p string) ([]string, bool) {
	if r, ok := allowed[p]; ok {
		return r, true
	}
	for d := p; d != "." && d != "/" && d != ""; d = path.Dir(d) {
		if r, ok := allowed[d+"/..."]; ok {
			return r, true
		}
	}
	return nil, false
}

// everywhere lists the utility leaves any package may import, as it may the
// standard library.
var everywhere = []string{"internal/units"}

func permits(prefixes []string, imp string) bool {
	if slices.Contains(everywhere, imp) {
		return true
	}
	for _, a := range prefixes {
		if a == "*" || imp == a || (strings.HasSuffix(a, "/") && strings.HasPrefix(imp, a)) {
			return true
		}
	}
	return false
}

// TestImportRules fails when a package imports a tier0 package that its
// layer may not (docs/ARCHITECTURE.md, "Import rules").
func TestImportRules(t *testing.T) {
	var bad []string
	for _, p := range listPackages(t) {
		r, ok := rule(p.path)
		if !ok {
			bad = append(bad, p.path+": not in the layer table of internal/archtest (and docs/ARCHITECTURE.md): add it to a layer")
			continue
		}
		for _, imp := range p.imports {
			if !permits(r, imp) {
				bad = append(bad, p.path+" imports "+imp+"; its layer may import only "+strings.Join(r, ", ")+" (docs/ARCHITECTURE.md)")
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Error(b)
	}
}

// TestNothingBelowImportsAbove is rule 1 stated on its own: nothing under
// daemon/ imports the layers above it.
func TestNothingBelowImportsAbove(t *testing.T) {
	above := []string{"bench", "validate", "reports", "slurm-plugin", "gds", "test", "cmd", "reliability"}
	for _, p := range listPackages(t) {
		if !strings.HasPrefix(p.path, "daemon/") {
			continue
		}
		for _, imp := range p.imports {
			top, _, _ := strings.Cut(imp, "/")
			if slices.Contains(above, top) {
				t.Errorf("%s imports %s: nothing under daemon/ may import %s/ (docs/ARCHITECTURE.md, rule 1)", p.path, imp, top)
			}
		}
	}
}

// TestPermits checks the matcher on its own, so that a table entry cannot
// silently allow more than it says.
func TestPermits(t *testing.T) {
	for _, c := range []struct {
		allowed []string
		imp     string
		want    bool
	}{
		{[]string{"daemon/blockdev"}, "daemon/blockdev", true},
		{[]string{"daemon/blockdev"}, "daemon/blockdev/local", false},
		{[]string{"daemon/"}, "daemon/raid", true},
		{[]string{"daemon/"}, "bench", false},
		{[]string{"bench"}, "bench/perf", false},
		{[]string{"bench/"}, "bench/perf", true},
		{[]string{"bench"}, "benchmarks", false},
		{nil, "daemon/nvme", false},
		{[]string{"*"}, "validate", true},
		{nil, "internal/units", true},
	} {
		if got := permits(c.allowed, c.imp); got != c.want {
			t.Errorf("permits(%q, %q) = %v, want %v", c.allowed, c.imp, got, c.want)
		}
	}
}
