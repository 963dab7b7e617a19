package diskstat

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// fakeDev writes a fake /sys/block/<name> with a subsystem NQN and stat.
func fakeDev(t *testing.T, root, name, nqn, stat string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, name, "device"), 0o755); err != nil {
		t.Fatal(err)
	}
	if nqn != "" {
		if err := os.WriteFile(filepath.Join(root, name, "device", "subsysnqn"), []byte(nqn+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, name, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
}

const tier0NQN = "nqn.2026-11.io.tier0:array-a"

func TestTakeAndDelta(t *testing.T) {
	root := t.TempDir()
	// Kernel 6.x format: 17 fields.
	fakeDev(t, root, "nvme0n1", tier0NQN, "    100 0 800 10 50 0 400 20 0 30 30 0 0 0 0 0 0\n")
	fakeDev(t, root, "nvme0c0n1", tier0NQN, "999 0 999 0 999 0 999 0 0 0 0\n")
	fakeDev(t, root, "nvme1n1", "nqn.2014-08.org.nvmexpress:local", "5 0 5 0 5 0 5 0 0 0 0\n")
	fakeDev(t, root, "sda", "", "5 0 5 0 5 0 5 0 0 0 0\n")
	t0 := time.Unix(1000, 0)
	s0, err := Take(root, "nqn.2026-11.io.tier0", t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s0.Devices) != 1 || s0.Devices["nvme0n1"].Counters != (Counters{100, 800, 50, 400}) {
		t.Fatalf("snapshot = %+v, want only nvme0n1 with its counters", s0)
	}
	fakeDev(t, root, "nvme0n1", tier0NQN, "    110 0 1800 10 52 0 2400 20 0 30 30 0 0 0 0 0 0\n")
	s1, err := Take(root, "nqn.2026-11.io.tier0", t0.Add(90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	u, warn := Delta(s0, s1)
	want := Usage{Seconds: 90, ReadBytes: 1000 * 512, WriteBytes: 2000 * 512, ReadIOs: 10, WriteIOs: 2, Devices: []string{"nvme0n1"}}
	if !reflect.DeepEqual(u, want) || len(warn) != 0 {
		t.Errorf("Delta = %+v %q, want %+v", u, warn, want)
	}
	all, err := Take(root, "", t0)
	if err != nil || len(all.Devices) != 2 {
		t.Errorf("no prefix: %d devices (%v), want the two namespace heads", len(all.Devices), err)
	}
}

func TestDeltaWarnings(t *testing.T) {
	c := func(n uint64) Counters { return Counters{n, n, n, n} }
	start := Snapshot{Devices: map[string]Device{
		"nvme0n1": {"x", c(10)}, "nvme1n1": {"x", c(10)}, "nvme2n1": {"x", c(10)}, "nvme3n1": {"x", c(10)},
	}}
	end := Snapshot{Devices: map[string]Device{
		"nvme0n1": {"x", c(12)}, "nvme1n1": {"x", c(5)}, "nvme2n1": {"y", c(20)}, "nvme4n1": {"x", c(1)},
	}}
	u, warn := Delta(start, end)
	if u.ReadIOs != 2 || u.ReadBytes != 2*512 || !reflect.DeepEqual(u.Devices, []string{"nvme0n1"}) {
		t.Errorf("usage = %+v, want only nvme0n1 counted", u)
	}
	if len(warn) != 4 {
		t.Errorf("warnings = %q, want backwards, changed, appeared, vanished", warn)
	}
}

func TestParseStatErrors(t *testing.T) {
	for _, s := range []string{"", "1 2 3", "1 2 3 4 5 6 x"} {
		if _, err := ParseStat(s); err == nil {
			t.Errorf("ParseStat(%q) succeeded", s)
		}
	}
}
