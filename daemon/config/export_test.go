package config

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// normalized is c as the desired state it describes: placement frozen
// (explicit members), without the file name and raw members value.
func normalized(c *Config) Config {
	n := *c
	n.File = ""
	n.Arrays = nil
	for _, a := range c.Arrays {
		a.Auto, a.RawMembers, a.Width = false, nil, len(a.Members)
		n.Arrays = append(n.Arrays, a)
	}
	return n
}

// TestExportRoundTrips: every shipped site configuration, and one with
// volumes, transports and a secret file, exports to a file that loads to
// the same desired state (nodes, arrays with their members, fabrics,
// volumes, policies, everything), and exporting that again gives the same
// bytes.
func TestExportRoundTrips(t *testing.T) {
	files, _ := filepath.Glob("../../site-configs/*.yaml")
	if len(files) == 0 {
		t.Fatal("no site configurations in site-configs/")
	}
	var cfgs []*Config
	for _, f := range files {
		c, err := Load(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		cfgs = append(cfgs, c)
	}
	withVols := *cfgs[0]
	withVols.Fabrics.Frontend.Transport = TransportRDMA
	withVols.Fabrics.Frontend.DHCHAPSecret = "file:/etc/tier0/frontend.key"
	withVols.Fabrics.Frontend.AllowHosts = []string{"nqn.h1"}
	pool := withVols.Arrays[0].Name
	withVols.Volumes = []Volume{
		{Name: "db", Pool: pool, NSID: 1, Size: 2 << 20, NGUID: strings.Repeat("ab", 16), UUID: strings.Repeat("cd", 16),
			Hosts: []string{"nqn.h1"}, Extents: []Extent{{Off: 0, Len: 1 << 20}, {Off: 4 << 20, Len: 1 << 20}}},
		{Name: "logs", Pool: pool, NSID: 2, Size: 1 << 20, NGUID: strings.Repeat("01", 16), UUID: strings.Repeat("02", 16),
			Extents: []Extent{{Off: 1 << 20, Len: 1 << 20}}},
	}
	cfgs = append(cfgs, &withVols)
	for _, c := range cfgs {
		out, err := c.Export()
		if err != nil {
			t.Fatalf("%s: export: %v", c.File, err)
		}
		back, err := Parse("exported", out)
		if err != nil {
			t.Fatalf("%s: the export does not load: %v\n%s", c.File, err, out)
		}
		if got, want := normalized(back), normalized(c); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: export -> load changed the desired state:\n got %+v\nwant %+v\n%s", c.File, got, want, out)
		}
		again, err := back.Export()
		if err != nil || string(again) != string(out) {
			t.Fatalf("%s: a second export differs (%v):\n%s\n---\n%s", c.File, err, out, again)
		}
	}
}

// TestExportRefusesInlineSecret: an inline DH-HMAC-CHAP secret is not
// copied into the export; the error says what to do.
func TestExportRefusesInlineSecret(t *testing.T) {
	c, err := Load("../../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c.Fabrics.Backend.DHCHAPSecret = "DHHC-1:00:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0:"
	if _, err := c.Export(); err == nil || !strings.Contains(err.Error(), "fabrics.backend.dhchap_secret") || !strings.Contains(err.Error(), "file:") {
		t.Fatalf("export with an inline secret: %v, want a refusal naming the key and file:PATH", err)
	}
}

// TestVolumesSectionChecked: the volumes section's problems are named.
func TestVolumesSectionChecked(t *testing.T) {
	c, err := Load("../../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pool := c.Arrays[0].Name
	c.Volumes = []Volume{
		{Name: "v", Pool: pool, NSID: 1, Size: 1 << 20, NGUID: strings.Repeat("ab", 16), UUID: strings.Repeat("cd", 16), Extents: []Extent{{Off: 0, Len: 1 << 20}}},
		{Name: "v", Pool: pool, NSID: 1, Size: 1 << 20, NGUID: "xyz", UUID: strings.Repeat("cd", 16), Extents: []Extent{{Off: 512 << 10, Len: 1 << 20}}},
		{Name: "w", Pool: "nope", NSID: 2000, Size: 3, NGUID: strings.Repeat("ab", 16), UUID: strings.Repeat("cd", 16)},
	}
	err = c.Validate()
	for _, want := range []string{"volumes[1].name", "volumes[1].nsid", "volumes[1].nguid", "volumes[1].extents[0]: overlaps volumes[0].extents[0]",
		"volumes[2].pool", "volumes[2].nsid", "volumes[2].extents"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("problems %v: want one at %s", err, want)
		}
	}
}
