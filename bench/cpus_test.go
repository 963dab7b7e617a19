package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseCPUMax(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		err  bool
	}{
		{"max 100000\n", 0, false},
		{"200000 100000\n", 2, false},
		{"150000 100000", 1.5, false},
		{"50000", 0.5, false},
		{"lots 100000", 0, true},
		{"", 0, true},
	} {
		got, err := ParseCPUMax(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseCPUMax(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
	if q, err := ParseCFSQuota("-1\n", "100000\n"); q != 0 || err != nil {
		t.Errorf("v1 quota -1 = %v, %v; want no limit", q, err)
	}
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCPULimits: a run on a 254-thread host confined to 2 CPUs by its
// affinity, or to 1.5 cores by an ancestor cgroup's quota, reports those,
// not the host's.
func TestCPULimits(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "cpu.max"), "max 100000\n")
	write(t, filepath.Join(root, "job/cpu.max"), "150000 100000\n")
	write(t, filepath.Join(root, "job/step/cpu.max"), "400000 100000\n")
	l, err := cpuLimits(root, "0::/job/step\n", 254)
	if err != nil {
		t.Fatal(err)
	}
	if l.Quota != 1.5 || l.Usable != 1.5 || l.Affinity != 254 || !strings.HasSuffix(l.QuotaSource, "job/cpu.max") {
		t.Errorf("v2 limits = %+v; want the ancestor's 1.5 cores", l)
	}
	if s := l.String(); !strings.HasPrefix(s, "1.5 CPUs (affinity 254; cgroup quota 1.5 cores") {
		t.Errorf("String = %q", s)
	}

	v1 := t.TempDir()
	write(t, filepath.Join(v1, "cpu/cpu.cfs_quota_us"), "-1\n")
	write(t, filepath.Join(v1, "cpu/cpu.cfs_period_us"), "100000\n")
	l, err = cpuLimits(v1, "4:memory:/x\n1:cpu,cpuacct:/\n0::/\n", 2)
	if err != nil || l.Quota != 0 || l.Usable != 2 {
		t.Errorf("v1 without quota = %+v, %v; want the affinity's 2", l, err)
	}
	write(t, filepath.Join(v1, "cpu/slurm/cpu.cfs_quota_us"), "300000\n")
	write(t, filepath.Join(v1, "cpu/slurm/cpu.cfs_period_us"), "100000\n")
	l, _ = cpuLimits(v1, "1:cpu,cpuacct:/slurm\n", 8)
	if l.Usable != 3 {
		t.Errorf("v1 quota = %+v; want 3 usable", l)
	}
}

func TestReadCPULimitsHere(t *testing.T) {
	l, err := ReadCPULimits()
	if err != nil {
		t.Logf("cgroup: %v", err)
	}
	if l.Affinity < 1 || l.Usable <= 0 || l.Usable > float64(l.Affinity) {
		t.Errorf("ReadCPULimits = %+v; want at least one usable CPU, no more than the affinity", l)
	}
}
