package validate

import (
	"io"
	"strings"
	"testing"
	"time"

	"tier0/bench"
	"tier0/daemon/config"
)

const testMaps = `7f1c00000000-7f1c00100000 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libcufile.so.1.9.1
7f1c00100000-7f1c00200000 r--p 00100000 08:01 123 /usr/lib/x86_64-linux-gnu/libcufile.so.1.9.1
7f1c00300000-7f1c00400000 r-xp 00000000 08:01 124 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
7f1c00500000-7f1c00600000 r-xp 00000000 08:01 125 /usr/lib/x86_64-linux-gnu/libcudart.so.12
7f1c00700000-7f1c00800000 rw-p 00000000 00:00 0 [heap]
`

func TestLoadedLibs(t *testing.T) {
	got := loadedLibs(testMaps, "libcufile", "libcuda.")
	if len(got) != 2 || got[0].Version != "1.9.1" || got[1].Path != "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15" || got[1].Version != "550.54.15" {
		t.Errorf("loadedLibs = %+v; want libcufile 1.9.1 and libcuda 550.54.15 once each, not libcudart", got)
	}
}

const testMountinfo = `22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
40 22 259:3 / /mnt/tier0 rw,relatime - xfs /dev/nvme1n1 rw
41 22 0:33 / /mnt/tier0/tmp rw - tmpfs tmpfs rw
42 22 259:4 / /mnt/my\040vol rw - xfs /dev/nvme2n1 rw
`

func TestGDSMountMustBeATier0Volume(t *testing.T) {
	if _, why := gdsMountProblem(testMountinfo, "/mnt/tier0/data", "s.yaml"); why != "" {
		t.Errorf("a directory on /dev/nvme1n1 refused: %s", why)
	}
	if m, why := gdsMountProblem(testMountinfo, "/mnt/my vol", "s.yaml"); why != "" || m.Source != "/dev/nvme2n1" {
		t.Errorf("escaped mount point: %+v %s", m, why)
	}
	for dir, want := range map[string]string{
		"":                 "gds.mount is not set in s.yaml",
		"/home/me/work":    "is on /dev/sda1 (ext4, mounted at /)",
		"/mnt/tier0/tmp/x": "is on tmpfs (tmpfs, mounted at /mnt/tier0/tmp)",
	} {
		if _, why := gdsMountProblem(testMountinfo, dir, "s.yaml"); !strings.Contains(why, want) {
			t.Errorf("gds.mount %q: reason %q, want it to contain %q", dir, why, want)
		}
	}
}

// TestGDSCheckNeverReadsTheWorkDir: with no gds.mount the check does not
// run the validator on the work directory (issue 17: it did); it is not
// run, and says the check needs a tier0 volume.
func TestGDSCheckNeverReadsTheWorkDir(t *testing.T) {
	r := &runner{o: Options{Out: io.Discard}, ctx: t.Context(), cfg: &config.Config{File: "site.yaml"}, work: t.TempDir(), log: discardLog(),
		res: bench.NewResults("t", "s", time.Now(), bench.Environment{})}
	r.gds()
	c := r.res.Checks[0]
	if c.Status != bench.NotRun || !strings.Contains(c.Reason, "file system on a tier0 volume") {
		t.Errorf("GDS check without gds.mount = %+v; want not-run asking for a tier0 volume", c)
	}
	if r.res.GDS == nil || r.res.GDS.Mount != nil {
		t.Errorf("GDS slot %+v; want one, with no mount", r.res.GDS)
	}
}
