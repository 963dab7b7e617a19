package main

import (
	"context"
	"encoding/json"
	"fmt"

	"slices"
	"strings"
	"testing"

	"tier0/daemon/api"
)

func TestArrayListTableAndJSON(t *testing.T) {
	url := serveFake(t, newFakeBackend())
	out, errOut, code := runCLI(t, nil, "array", "list", "--api", url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "ARRAY", "MEMBERS",
		"│ a     │ raid5 │ A    │ A     │ 3     │ degraded   │ active │ B1(missing) C1      │",
		"│ c     │ raid6 │ C    │ C     │ 1     │ optimal    │ active │ A2 B2 C3(resyncing) │",
		"array b  member A1 (node A)  rebuilding  [#####.....] 52%")
	out, _, code = runCLI(t, nil, "array", "list", "--api", url, "--json")
	var arrays []api.Array
	if err := json.Unmarshal([]byte(out), &arrays); err != nil || code != 0 {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if len(arrays) != 3 || arrays[2].Policy != "manual" || arrays[0].Members[0].State != "missing" {
		t.Fatalf("JSON lost data: %+v", arrays)
	}
}

func TestArrayShow(t *testing.T) {
	url := serveFake(t, newFakeBackend())
	out, errOut, code := runCLI(t, nil, "array", "show", "b", "--api", url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "array b: raid5, home B, owner A, epoch 7, state rebuilding, phase active, failback auto",
		"│ 0 │ A1    │ A    │ rebuilding │ [#####.....] 52% │",
		"│ 1 │ C2    │ C    │ ok         │ -                │")
	out, _, _ = runCLI(t, nil, "array", "show", "b", "--api", url, "--json")
	var a api.Array
	if err := json.Unmarshal([]byte(out), &a); err != nil || a.Name != "b" || a.Epoch != 7 {
		t.Fatalf("%v: %+v", err, a)
	}
	out, errOut, code = runCLI(t, nil, "array", "show", "zz", "--api", url)
	if code != 1 || out != "" {
		t.Fatalf("unknown array: exit %d, stdout %q", code, out)
	}
	mustContain(t, errOut, `array "zz" does not exist`, "the arrays are: a, b, c")
}

// CreateArray and DeleteArray make the fake an api.ArrayProvisioner.
func (f *fakeBackend) CreateArray(_ context.Context, req api.ArrayCreate) (api.OnlineArray, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check(); err != nil {
		return api.OnlineArray{}, err
	}
	f.calls = append(f.calls, fmt.Sprintf("create %s %s %d home=%s chunk=%d novol=%v", req.Name, req.Level, req.Members, req.Home, req.ChunkKiB, req.NoVolume))
	if req.Level != "raid5" && req.Level != "raid6" {
		return api.OnlineArray{}, fmt.Errorf("--level %q: want raid5 or raid6: %w", req.Level, api.ErrBadRequest)
	}
	return api.OnlineArray{Name: req.Name, Level: req.Level, ChunkKiB: 128, Home: "A", Members: []string{"B4", "C4", "D4", "E4"}[:req.Members], Phase: "active"}, nil
}

func (f *fakeBackend) DeleteArray(_ context.Context, name string, force bool) (api.OnlineArray, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("delete %s force=%v", name, force))
	h := api.VolumeHolder{HostNQN: "nqn.h1", HostID: "ab", Node: "B"}
	if !force {
		return api.OnlineArray{}, fmt.Errorf("array %s is in use: its volumes v1; hosts use it: nqn.h1 connected through node B; or delete with --force: %w", name, api.ErrConflict)
	}
	return api.OnlineArray{Name: name, Level: "raid5", Members: []string{"B4", "C4", "D4"}, Phase: "deleted", Volumes: []string{"v1"}, Holders: []api.VolumeHolder{h}}, nil
}

// TestArrayCreateDeleteOnline: create and delete go through the API
// (before issue 16 they printed a site-file plan and exited 2).
func TestArrayCreateDeleteOnline(t *testing.T) {
	f := newFakeBackend()
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, nil, "array", "create", "p1", "--members", "4", "--level", "raid6", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errOut)
	}
	mustContain(t, out, "array p1 created: raid6, chunk 128 KiB, home A, members B4 C4 D4 E4", "tier0 array show p1")
	out, _, code = runCLI(t, nil, "array", "create", "p2", "--members", "3", "--home", "B", "--chunk-kib", "64", "--no-volume", "--json", "--api", url, "--token", testToken)
	var a api.OnlineArray
	if err := json.Unmarshal([]byte(out), &a); err != nil || code != 0 || a.Name != "p2" || len(a.Members) != 3 || a.Phase != "active" {
		t.Fatalf("create --json: exit %d %v: %s", code, err, out)
	}
	_, errOut, code = runCLI(t, nil, "array", "create", "p3", "--members", "3", "--level", "raid7", "--api", url, "--token", testToken)
	if code != 1 || !strings.Contains(errOut, `--level "raid7": want raid5 or raid6`) {
		t.Fatalf("bad level: exit %d: %s", code, errOut)
	}
	_, errOut, code = runCLI(t, nil, "array", "create", "p3", "--api", url, "--token", testToken)
	if code != 1 || !strings.Contains(errOut, "--members N is required") {
		t.Fatalf("no --members: exit %d: %s", code, errOut)
	}
	_, errOut, code = runCLI(t, nil, "array", "create", "p3", "--members", "3", "--api", url)
	if code != 1 || !strings.Contains(errOut, "401") {
		t.Fatalf("no token: exit %d: %s", code, errOut)
	}
	_, errOut, code = runCLI(t, nil, "array", "delete", "p1", "--api", url, "--token", testToken)
	if code != 1 {
		t.Fatalf("delete in use: exit %d: %s", code, errOut)
	}
	mustContain(t, errOut, "array p1 is in use", "nqn.h1 connected through node B", "--force")
	out, errOut, code = runCLI(t, nil, "array", "delete", "p1", "--force", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("delete --force: exit %d: %s", code, errOut)
	}
	mustContain(t, out, "array p1 deleted; drives B4 C4 D4 are free", "volumes removed: v1", "was in use by: nqn.h1 connected through node B")
	want := []string{"create p1 raid6 4 home= chunk=0 novol=false", "create p2 raid5 3 home=B chunk=64 novol=true", "create p3 raid7 3 home= chunk=0 novol=false", "delete p1 force=false", "delete p1 force=true"}
	if got := f.mutations(); !slices.Equal(got, want) {
		t.Fatalf("backend saw %q\nwant %q", got, want)
	}
}

func (f *fakeBackend) ScrubArray(_ context.Context, name string, repair bool) error {
	verb := "scrub"
	if repair {
		verb = "scrub-repair"
	}
	var names []string
	for _, a := range f.status.Arrays {
		names = append(names, a.Name)
	}
	return f.mutate(verb, "array", name, names)
}

func TestArrayScrub(t *testing.T) {
	f := newFakeBackend()
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, nil, "array", "scrub", "a", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "scrub of array a accepted: its owner A checks every stripe in the background", "tier0 status")
	out, errOut, code = runCLI(t, nil, "array", "scrub", "c", "--repair", "--json", "--api", url, "--token", testToken)
	var res scrubResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 {
		t.Fatalf("exit %d %v: %s %s", code, err, out, errOut)
	}
	if res != (scrubResult{Array: "c", Action: "scrub", Repair: true, Owner: "C", Result: "accepted"}) {
		t.Fatalf("%+v", res)
	}
	if got := f.mutations(); !slices.Equal(got, []string{"scrub a", "scrub-repair c"}) {
		t.Fatalf("backend saw %v", got)
	}
	_, errOut, code = runCLI(t, nil, "array", "scrub", "q", "--api", url, "--token", testToken)
	if code != 1 {
		t.Fatalf("unknown array: exit %d", code)
	}
	mustContain(t, errOut, `array "q" does not exist`, "a, b, c")
	_, errOut, code = runCLI(t, nil, "array", "scrub", "a", "--api", url)
	if code != 1 || !strings.Contains(errOut, "401") {
		t.Fatalf("no token: exit %d: %s", code, errOut)
	}
}

func TestArrayShowReasons(t *testing.T) {
	f := newFakeBackend()
	f.status.Arrays[0].State = "failed"
	f.status.Arrays[0].Reason = "raid5 lost 2 of 2 members (B1, C1)"
	f.status.Arrays[0].LastError = "resync C1 at epoch 3: member not reachable yet"
	f.status.Arrays[0].Failures = 4
	out, errOut, code := runCLI(t, nil, "array", "show", "a", "--api", serveFake(t, f))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "array a  failed: raid5 lost 2 of 2 members (B1, C1)",
		"array a  last error (4 attempts, retried with backoff): resync C1 at epoch 3: member not reachable yet")
}
