package config

import (
	"strings"
	"testing"
	"time"
)

const modelSite = `cluster: t
model: {scale: 0.001}
nodes:
  - name: A
    address: 127.0.0.1
    backend: {port: 5001}
    frontend: {port: 5002}
    api: {port: 5003}
    link: {bytes_per_s: 1000MiB}
    drives:
      - {name: A1, path: /x/a1, size: 64MiB, model: {profile: micron-7450-pro-3.84tb}}
      - {name: A2, path: /x/a2, size: 64MiB, model: {profile: micron-7450-pro-3.84tb, write_iops: 90000, read_latency: 100us}}
      - {name: A3, path: /x/a3, size: 64MiB}
control_plane:
  etcd: {peers: [A], client_port: 5100, peer_port: 5101}
`

func TestDriveModelParsesAndScales(t *testing.T) {
	t.Setenv(EnvModelScale, "")
	c, err := Parse("site.yaml", []byte(modelSite))
	if err != nil {
		t.Fatal(err)
	}
	f, link, src, ok := c.DriveModelOf("A1")
	if !ok || f.ReadBytesPerS != 6.8e6 || f.WriteIOPS != 180 || f.ReadLatency != 70*time.Microsecond || link != 1000*(1<<20)*0.001 || !strings.Contains(src, "Micron 7450") {
		t.Errorf("A1 = %+v, link %v, %q, %v; want the profile at a thousandth, latency unscaled", f, link, src, ok)
	}
	f, _, src, _ = c.DriveModelOf("A2")
	if f.WriteIOPS != 90 || f.ReadLatency != 100*time.Microsecond || f.ReadIOPS != 1000 || !strings.Contains(src, "overridden") {
		t.Errorf("A2 overrides = %+v (%q)", f, src)
	}
	if _, _, _, ok := c.DriveModelOf("A3"); ok {
		t.Error("A3 has no model but got one")
	}
	t.Setenv(EnvModelScale, "0.01")
	if f, _, _, _ := c.DriveModelOf("A1"); f.ReadIOPS != 10000 {
		t.Errorf("TIER0_MODEL_SCALE=0.01: read IOPS %v, want 10000", f.ReadIOPS)
	}
}

func TestDriveModelProblems(t *testing.T) {
	y := strings.Replace(modelSite, "scale: 0.001", "scale: 2", 1)
	y = strings.Replace(y, "{profile: micron-7450-pro-3.84tb}}", "{profile: fast-disk}}", 1)
	y = strings.Replace(y, "link: {bytes_per_s: 1000MiB}", "link: {}", 1)
	got := strings.Join(problems(t, y), "\n")
	for _, want := range []string{
		"model.scale: 2; expected a factor in (0, 1]",
		`nodes[0].drives[0].model: profile "fast-disk" is not known; expected one of micron-7450-pro-3.84tb`,
		"nodes[0].link.bytes_per_s: missing",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	dev := strings.Replace(modelSite, "{name: A1, path: /x/a1, size: 64MiB,", "{name: A1, path: /dev/nvme0n1,", 1)
	if got := strings.Join(problems(t, dev), "\n"); !strings.Contains(got, "drive A1 is a device, not a file") {
		t.Errorf("model on a real device accepted:\n%s", got)
	}
}

// TestLinkOfAndModelAt: a node's link at the scale in force (the frontend
// charges it, issue 17), none for a node without one; a drive's model at
// a candidate scale (the start-up calibration) regardless of the scale in
// force.
func TestLinkOfAndModelAt(t *testing.T) {
	t.Setenv(EnvModelScale, "")
	c, err := Parse("site.yaml", []byte(modelSite))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.LinkOf("A"), 1000*(1<<20)*0.001; got != want {
		t.Errorf("LinkOf(A) = %v, want %v", got, want)
	}
	if got := c.LinkOf("Z"); got != 0 {
		t.Errorf("LinkOf(unknown node) = %v, want 0", got)
	}
	f, link, _, ok := c.DriveModelAt("A1", 0.5)
	if !ok || f.ReadIOPS != 500_000 || link != 500*(1<<20) {
		t.Errorf("DriveModelAt(A1, 0.5) = %+v, link %v, %v; want half the profile", f, link, ok)
	}
}
