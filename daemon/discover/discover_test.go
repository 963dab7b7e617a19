package discover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var fake = Options{SysRoot: "testdata/node/sys", DevRoot: "testdata/node/dev"}

func TestScan(t *testing.T) {
	drives, err := Scan(fake)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range drives {
		got = append(got, fmt.Sprintf("%s %s %q %q %s %s nsid=%d size=%d lbs=%d byid=%s",
			d.Name, d.Controller, d.Model, d.Serial, d.Firmware, d.Transport, d.NSID, d.Size, d.BlockSize, filepath.Base(d.ByID)))
	}
	want := []string{
		`nvme0n1 nvme0 "SAMSUNG MZWLO3T8HCLS-00A07" "S7WNNE0X100010" OPPA4B5Q pcie nsid=1 size=3840755982336 lbs=4096 byid=nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S7WNNE0X100010`,
		`nvme0n2 nvme0 "SAMSUNG MZWLO3T8HCLS-00A07" "S7WNNE0X100010" OPPA4B5Q pcie nsid=2 size=1073741824 lbs=4096 byid=nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S7WNNE0X100010_2`,
		`nvme1n1 nvme1 "SAMSUNG MZWLO3T8HCLS-00A07" "S7WNNE0X100011" OPPA4B5Q pcie nsid=1 size=3840755982336 lbs=512 byid=nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S7WNNE0X100011`,
		`nvme3n1 nvme-subsys3 "KIOXIA KCMYXRUG7T68" "9DB0A00XT1X8" 1UET7104 pcie nsid=1 size=7681501126656 lbs=512 byid=nvme-KIOXIA_KCMYXRUG7T68_9DB0A00XT1X8`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Scan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := len(drives[0].Links); n != 3 {
		t.Fatalf("nvme0n1 has %d links, want 3", n)
	}
	all, _ := Scan(Options{SysRoot: fake.SysRoot, DevRoot: fake.DevRoot, All: true})
	if len(all) != 5 || all[3].Name != "nvme2n1" || all[3].Transport != "tcp" {
		t.Fatalf("All: %d drives, want 5 including the tcp import nvme2n1", len(all))
	}
}

func TestResolve(t *testing.T) {
	drives, err := Scan(fake)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path, byID, serial string
		want               string // resolved path, or "!error substring"
		nvme               bool
	}{
		{path: "/dev/nvme1n1", want: "/dev/nvme1n1", nvme: true},
		{path: "/dev/disk/by-id/nvme-SAMSUNG_MZWLO3T8HCLS-00A07_S7WNNE0X100010", want: "/dev/nvme0n1", nvme: true},
		{byID: "nvme-KIOXIA_KCMYXRUG7T68_9DB0A00XT1X8", want: "/dev/nvme3n1", nvme: true},
		{byID: "/dev/disk/by-id/nvme-eui.36344830526000610025384500000002", want: "/dev/nvme0n2", nvme: true},
		{serial: "S7WNNE0X100011", want: "/dev/nvme1n1", nvme: true},
		{serial: "9DB0A00XT1X8", want: "/dev/nvme3n1", nvme: true},
		{serial: "S7WNNE0X100010", want: "!matches 2 namespaces (nvme0n1, nvme0n2); give the path or by_id instead"},
		{serial: "NOPE", want: "!no NVMe drive on this node has it"},
		{byID: "nvme-MISSING", want: "!no such link"},
		{byID: "nvme-DANGLING_LINK", want: "!no such link"},
		{path: "/dev/nvme7n1", want: "!/dev/nvme7n1: no such device or link on this node"},
		{path: "/var/tmp/tier0/A1.img", want: "/var/tmp/tier0/A1.img"},
		{path: "/dev/disk/by-id/ata-SOMEDISK_123", want: "/dev/sda"},
		{want: "!empty drive reference"},
	}
	for _, tc := range cases {
		r, err := Resolve(fake, drives, tc.path, tc.byID, tc.serial)
		ref := tc.path + tc.byID + tc.serial
		if msg, isErr := strings.CutPrefix(tc.want, "!"); isErr {
			if err == nil || !strings.Contains(err.Error(), msg) {
				t.Errorf("%q: error %v, want one containing %q", ref, err, msg)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", ref, err)
			continue
		}
		if r.Path != tc.want || (r.Drive != nil) != tc.nvme {
			t.Errorf("%q: resolved %s (nvme %v), want %s (nvme %v)", ref, r.Path, r.Drive != nil, tc.want, tc.nvme)
		}
	}
	if _, err := Resolve(fake, drives, "", "", "S7WNNE0X100010"); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("ambiguous serial: %v", err)
	}
	if _, err := Resolve(fake, drives, "", "", "NOPE"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown serial: %v", err)
	}
}

func TestScanMissingSysfs(t *testing.T) {
	_, err := Scan(Options{SysRoot: "testdata/none"})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "is sysfs mounted?") {
		t.Fatalf("got %v", err)
	}
}

func TestScanRealSystem(t *testing.T) {
	// On any Linux machine Scan must at least not fail; on a machine with
	// NVMe drives it lists them.
	if _, err := os.Stat("/sys/block"); err != nil {
		t.Skip("no /sys/block here")
	}
	drives, err := Scan(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range drives {
		if d.Size <= 0 || d.Transport != "pcie" {
			t.Errorf("%+v", d)
		}
	}
	t.Logf("%d local NVMe namespaces", len(drives))
}

func TestNaturalCompare(t *testing.T) {
	if naturalCompare("nvme2n1", "nvme10n1") >= 0 || naturalCompare("nvme0n10", "nvme0n2") <= 0 || naturalCompare("nvme1n1", "nvme1n1") != 0 {
		t.Fatal("naturalCompare order wrong")
	}
}
