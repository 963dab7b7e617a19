package main

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
)

// exportFake is a cluster whose running configuration is local-5node.yaml,
// whose array A had a member replaced (A's live members differ from the
// placement), and whose pool B is carved into a ready and a creating
// volume.
type exportFake struct {
	*fakeBackend
	cfg     *config.Config
	secrets map[string]string
}

func (f *exportFake) SiteConfig(context.Context) (api.SiteConfig, error) {
	return api.SiteConfig{Config: *f.cfg, Secrets: f.secrets}, nil
}

func (f *exportFake) Arrays(context.Context) ([]api.Array, error) {
	a, _ := f.cfg.Array("A")
	live := slices.Clone(a.Members)
	live[0] = f.replacement(live) // replaced
	var ms []cluster.MemberView
	for _, d := range live {
		ms = append(ms, cluster.MemberView{Drive: d})
	}
	return []api.Array{{Name: "A", Members: ms}}, nil
}

// replacement is a drive on a node none of the other members (nor the
// home) is on, not the first member itself.
func (f *exportFake) replacement(members []string) string {
	used := map[string]bool{"A": true} // A's home
	for _, m := range members[1:] {
		n, _, _ := f.cfg.Drive(m)
		used[n.Name] = true
	}
	for _, n := range f.cfg.Nodes {
		for _, d := range n.Drives {
			if !used[n.Name] && d.Name != members[0] {
				return d.Name
			}
		}
	}
	panic("no free node")
}

func (f *exportFake) Volumes(context.Context) ([]api.Volume, error) {
	return []api.Volume{
		{Name: "A", Pool: "A", NSID: 1, Implicit: true, State: "ready"},
		{Name: "db", Pool: "B", NSID: 1, Size: 2 << 20, State: "ready", NGUID: strings.Repeat("ab", 16), UUID: strings.Repeat("cd", 16),
			Hosts: []string{"nqn.h1"}, Extents: []api.Extent{{Off: 0, Len: 1 << 20}, {Off: 3 << 20, Len: 1 << 20}}},
		{Name: "new", Pool: "B", NSID: 2, State: "creating", NGUID: strings.Repeat("01", 16), UUID: strings.Repeat("02", 16),
			Pending: []api.Extent{{Off: 1 << 20, Len: 1 << 20}}},
	}, nil
}

// TestConfigExport: tier0 config export writes, from the API, a site file
// that validates and holds the live state: the running configuration,
// array A with its current members (a replaced drive included) and every
// other array's placement frozen, the ready volume with its identifiers,
// hosts and extents, not the creating one (said on stderr) nor the
// implicit ones; an inline secret is refused naming the key.
func TestConfigExport(t *testing.T) {
	cfg, err := config.Load("../../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := &exportFake{fakeBackend: newFakeBackend(), cfg: cfg, secrets: map[string]string{"fabrics.frontend.dhchap_secret": "file:/etc/tier0/fe.key"}}
	srv, err := api.NewServer(api.ServerOptions{Backend: f, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	url := serveHandler(t, srv)
	file := filepath.Join(t.TempDir(), "site.yaml")
	_, errOut, code := runCLI(t, nil, "config", "export", "-o", file, "--api", url)
	if code != 0 {
		t.Fatalf("export: exit %d: %s", code, errOut)
	}
	mustContain(t, errOut, "volume new is creating: left out", "wrote "+file+": cluster "+cfg.Cluster+", 5 nodes, 5 arrays, 1 volumes")
	got, err := config.Load(file)
	if err != nil {
		b, _ := os.ReadFile(file)
		t.Fatalf("the export does not load: %v\n%s", err, b)
	}
	a, _ := got.Array("A")
	was, _ := cfg.Array("A")
	if repl := f.replacement(was.Members); a.Members[0] != repl || a.Auto {
		t.Fatalf("array A exported with members %v (auto %v), want the live ones starting with %s", a.Members, a.Auto, repl)
	}
	for _, name := range []string{"B", "C", "D", "E"} {
		was, _ := cfg.Array(name)
		now, _ := got.Array(name)
		if !slices.Equal(was.Members, now.Members) || now.Auto {
			t.Fatalf("array %s: exported members %v (auto %v), want its placement %v frozen", name, now.Members, now.Auto, was.Members)
		}
	}
	if len(got.Volumes) != 1 || got.Volumes[0].Name != "db" || got.Volumes[0].Size != 2<<20 || !slices.Equal(got.Volumes[0].Hosts, []string{"nqn.h1"}) ||
		len(got.Volumes[0].Extents) != 2 || got.Volumes[0].Extents[1] != (config.Extent{Off: 3 << 20, Len: 1 << 20}) || got.Volumes[0].NGUID != strings.Repeat("ab", 16) {
		t.Fatalf("exported volumes %+v, want db with its hosts and two extents", got.Volumes)
	}
	if got.Fabrics.Frontend.DHCHAPSecret != "file:/etc/tier0/fe.key" || !reflect.DeepEqual(got.Nodes, cfg.Nodes) || got.Fabrics.Frontend.Transport != cfg.Fabrics.Frontend.Transport {
		t.Fatalf("exported secret %q, nodes %+v, transport %q", got.Fabrics.Frontend.DHCHAPSecret, got.Nodes, got.Fabrics.Frontend.Transport)
	}
	out, _, code := runCLI(t, nil, "config", "export", "--api", url)
	if code != 0 || !strings.Contains(out, "volumes:") || !strings.Contains(out, "cluster: \""+cfg.Cluster+"\"") {
		t.Fatalf("export to stdout: exit %d:\n%s", code, out)
	}
	f.secrets = map[string]string{"fabrics.backend.dhchap_secret": "inline"}
	_, errOut, code = runCLI(t, nil, "config", "export", "--api", url)
	if code != 1 {
		t.Fatalf("export with an inline secret: exit %d", code)
	}
	mustContain(t, errOut, "fabrics.backend.dhchap_secret is written inline", "file:")
}

func serveHandler(t *testing.T, srv *api.Server) string {
	t.Helper()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}
