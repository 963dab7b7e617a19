package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"tier0/daemon/api"
)

// The fake cluster's volumes: pool a is carved; v1 is used by a host.

func (f *fakeBackend) Volumes(context.Context) ([]api.Volume, error) {
	return []api.Volume{
		{Name: "v1", Pool: "a", NSID: 1, Size: 10 << 30, State: "ready", NGUID: "00112233445566778899aabbccddeeff"},
		{Name: "b", Pool: "b", NSID: 1, Size: 1 << 40, State: "ready", Implicit: true},
	}, nil
}

func (f *fakeBackend) Volume(_ context.Context, name string) (api.Volume, error) {
	if name != "v1" {
		return api.Volume{}, fmt.Errorf("volume %s is not known: %w", name, api.ErrNotFound)
	}
	return api.Volume{Name: "v1", Pool: "a", NSID: 1, Size: 10 << 30, State: "ready", Extents: []api.Extent{{Off: 0, Len: 10 << 30}},
		Holders: []api.VolumeHolder{{HostNQN: "nqn.h1", HostID: "01", Node: "B"}}}, nil
}

func (f *fakeBackend) CreateVolume(_ context.Context, name, pool string, size int64, hosts []string) (api.Volume, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("create %s %s %d %v", name, pool, size, hosts))
	f.mu.Unlock()
	return api.Volume{Name: name, Pool: pool, NSID: 2, State: "creating", Hosts: hosts, Pending: []api.Extent{{Off: 10 << 30, Len: size}}}, nil
}

func (f *fakeBackend) SetVolumeHosts(_ context.Context, name string, hosts []string) (api.Volume, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("hosts %s %v", name, hosts))
	f.mu.Unlock()
	return api.Volume{Name: name, Pool: "a", NSID: 1, State: "ready", Hosts: hosts}, nil
}

func (f *fakeBackend) ResizeVolume(_ context.Context, name string, size int64) (api.Volume, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("resize %s %d", name, size))
	f.mu.Unlock()
	return api.Volume{Name: name, Pool: "a", NSID: 1, State: "growing"}, nil
}

func (f *fakeBackend) DeleteVolume(_ context.Context, name string, force bool) (api.Volume, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fmt.Sprintf("delete %s force=%v", name, force))
	f.mu.Unlock()
	if !force {
		return api.Volume{}, fmt.Errorf("volume %s is in use: nqn.h1 connected through node B; disconnect those hosts, or delete with --force: %w", name, api.ErrConflict)
	}
	return api.Volume{Name: name, Pool: "a", NSID: 1, State: "deleting"}, nil
}

// TestVolumeVerbs: list, show, create, resize and delete through the API,
// sizes parsed, --json, the token needed, and a refused delete naming who
// holds the volume.
func TestVolumeVerbs(t *testing.T) {
	f := newFakeBackend()
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, nil, "volume", "list", "--api", url)
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, errOut)
	}
	mustContain(t, out, "v1", "a", "10.00 GiB", "ready", "b (implicit)", "1.00 TiB")
	out, _, code = runCLI(t, nil, "volume", "show", "v1", "--api", url)
	if code != 0 {
		t.Fatalf("show: exit %d", code)
	}
	mustContain(t, out, "volume v1: pool a", "extent: pool bytes 0 +10737418240", "used by nqn.h1 connected through node B")
	if _, errOut, code = runCLI(t, nil, "volume", "show", "zz", "--api", url); code != 1 {
		t.Fatalf("show unknown: exit %d", code)
	}
	mustContain(t, errOut, "volume zz is not known")
	out, errOut, code = runCLI(t, nil, "volume", "create", "v2", "--pool", "a", "--size", "10GiB", "--json", "--api", url, "--token", testToken)
	var v api.Volume
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != 0 || v.Name != "v2" || v.State != "creating" {
		t.Fatalf("create --json: exit %d %v: %s %s", code, err, out, errOut)
	}
	if _, errOut, code = runCLI(t, nil, "volume", "create", "v3", "--pool", "a", "--api", url, "--token", testToken); code != 1 {
		t.Fatalf("create without --size: exit %d", code)
	}
	mustContain(t, errOut, "--pool ARRAY and --size SIZE are both needed")
	if _, errOut, code = runCLI(t, nil, "volume", "create", "v3", "--pool", "a", "--size", "lots", "--api", url, "--token", testToken); code != 1 {
		t.Fatalf("create with a bad size: exit %d", code)
	}
	mustContain(t, errOut, `size "lots"`)
	if _, errOut, code = runCLI(t, nil, "volume", "create", "v3", "--pool", "a", "--size", "1G", "--api", url); code != 1 {
		t.Fatalf("create without the token: exit %d", code)
	}
	mustContain(t, errOut, "401")
	out, _, code = runCLI(t, nil, "volume", "resize", "v1", "--size", "20GiB", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("resize: exit %d", code)
	}
	mustContain(t, out, "volume v1 (pool a, namespace 1): growing")
	_, errOut, code = runCLI(t, nil, "volume", "delete", "v1", "--api", url, "--token", testToken)
	if code != 1 {
		t.Fatalf("delete in use: exit %d", code)
	}
	mustContain(t, errOut, "409", "nqn.h1 connected through node B", "--force")
	out, _, code = runCLI(t, nil, "volume", "delete", "v1", "--force", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("delete --force: exit %d", code)
	}
	mustContain(t, out, "deleting; every node removes its namespace")
	out, errOut, code = runCLI(t, nil, "volume", "create", "v4", "--pool", "a", "--size", "1GiB", "--allow-host", "nqn.h1", "--allow-host", "nqn.h2", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("create --allow-host: exit %d: %s", code, errOut)
	}
	mustContain(t, out, "hosts: nqn.h1, nqn.h2 (no other host sees it)")
	out, errOut, code = runCLI(t, nil, "volume", "hosts", "v4", "--allow-host", "nqn.h3", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("hosts --allow-host: exit %d: %s", code, errOut)
	}
	mustContain(t, out, "hosts set", "hosts: nqn.h3")
	out, _, code = runCLI(t, nil, "volume", "hosts", "v4", "--any-host", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("hosts --any-host: exit %d", code)
	}
	mustContain(t, out, "hosts: every host the pool's subsystem admits")
	if _, errOut, code = runCLI(t, nil, "volume", "hosts", "v4", "--api", url, "--token", testToken); code != 1 {
		t.Fatalf("hosts without a list: exit %d", code)
	}
	mustContain(t, errOut, "either --allow-host NQN")
	want := []string{"create v2 a 10737418240 []", "resize v1 21474836480", "delete v1 force=false", "delete v1 force=true",
		"create v4 a 1073741824 [nqn.h1 nqn.h2]", "hosts v4 [nqn.h3]", "hosts v4 []"}
	if got := f.mutations(); !slices.Equal(got, want) {
		t.Fatalf("backend saw %v, want %v", got, want)
	}
}
