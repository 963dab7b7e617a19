package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
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

// site5 is a copy of the shipped 5-node local site configuration with
// its array lines replaced by arrays.
func site5(t *testing.T, arrays string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "site-configs", "local-5node.yaml"))
	if err != nil {
		t.Skipf("site-configs/local-5node.yaml: %v", err)
	}
	s := string(b)
	i, j := strings.Index(s, "arrays:\n"), strings.Index(s, "fabrics:")
	if i < 0 || j < i {
		t.Fatal("local-5node.yaml has no arrays: section before fabrics:")
	}
	s = s[:i] + "arrays:\n" + arrays + "\n" + s[j:]
	s = strings.Replace(s, "${TIER0_WORK:-tier0-work}", t.TempDir(), 1)
	p := filepath.Join(t.TempDir(), "site.yaml")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestArrayCreateWithoutSite(t *testing.T) {
	if _, err := os.Stat(defaultSiteFile); err == nil {
		t.Skipf("%s exists here", defaultSiteFile)
	}
	out, errOut, code := runCLI(t, nil, "array", "create", "x", "--home", "A", "--members", "B3,C3,D3,E3")
	if code != exitUnsupported {
		t.Fatalf("exit %d, want %d: %s", code, exitUnsupported, errOut)
	}
	mustContain(t, out, "in this release arrays are defined in the site configuration; the management API cannot create them",
		"To create array x:", "add to the arrays: list of the site configuration (/etc/tier0/site.yaml):",
		"- {name: x, level: raid5, home: A, members: [B3, C3, D3, E3]}",
		"copy the edited file to every node", "restart tier0d one node at a time")
	mustContain(t, errOut, "editing the site configuration")
	_, errOut, code = runCLI(t, nil, "array", "create", "x")
	if code != 1 || !strings.Contains(errOut, "--home NODE is required") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

func TestArrayCreateChecksSite(t *testing.T) {
	// Arrays A and B use drive 1 and 2 of their nodes, placed by hand;
	// C is automatic; drives 4 are free.
	site := site5(t, `  - {name: A, level: raid5, home: A, members: [B1, C1, D1, E1]}
  - {name: B, level: raid5, home: B, members: [A2, C2, D2, E2]}
  - {name: C, level: raid5, home: C, members: auto, width: 4}`)
	out, errOut, code := runCLI(t, nil, "array", "create", "N", "--site", site, "--home", "A", "--members", "B4,C4,D4,E4", "--chunk-kib", "64")
	if code != exitUnsupported {
		t.Fatalf("exit %d: %s\n%s", code, out, errOut)
	}
	mustContain(t, out, "To create array N:",
		"1. in "+site+", write out the members of the automatically placed arrays",
		"- {name: C, level: raid5, chunk_kib: 128, home: C, members: [",
		"2. add to the arrays: list of "+site+":",
		"- {name: N, level: raid5, chunk_kib: 64, home: A, members: [B4, C4, D4, E4]}",
		"3. check it: tier0 config validate "+site)

	// Automatic placement of the new array is resolved and shown.
	out, _, code = runCLI(t, nil, "array", "create", "N", "--site", site, "--home", "E", "--width", "3", "--json")
	var p arrayPlan
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if p.Supported || p.Action != "create" || !strings.Contains(p.Entry, "home: E, members: [") || len(p.Freeze) != 1 {
		t.Fatalf("plan %+v", p)
	}
	if code != exitUnsupported || len(p.Problems) != 0 {
		t.Fatalf("exit %d, problems %q: free drives 3 and 4 should do", code, p.Problems)
	}

	// A drive another array uses, an existing name, a bad home.
	out, errOut, code = runCLI(t, nil, "array", "create", "A", "--site", site, "--home", "Z", "--members", "B1,C4,D4")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s\n%s", code, out, errOut)
	}
	mustContain(t, out, "would be wrong:", `duplicate array name "A"`, `node "Z" is not defined`, "drive B1 already holds array(s) A")
	mustContain(t, errOut, "problem(s)")
}

func TestArrayDelete(t *testing.T) {
	site := site5(t, `  - {name: A, level: raid5, home: A, members: [B1, C1, D1, E1]}
  - {name: B, level: raid5, home: B, members: [A2, C2, D2, E2]}
  - {name: S, level: raid5, home: C, members: [A2, B2, D3, E3]}`)
	out, errOut, code := runCLI(t, nil, "array", "delete", "A", "--site", site)
	if code != exitUnsupported {
		t.Fatalf("exit %d: %s\n%s", code, out, errOut)
	}
	mustContain(t, out, "cannot delete them", "remove this entry from the arrays: list of "+site,
		"- {name: A, level: raid5, chunk_kib: 128, home: A, members: [B1, C1, D1, E1]}",
		"nvme disconnect -n nqn.2026-11.io.tier0:local:array-a", "restart tier0d one node at a time", "not erased")
	// B shares A2 with S: deleting B would move S's extent.
	out, _, code = runCLI(t, nil, "array", "delete", "B", "--site", site, "--json")
	var p arrayPlan
	if err := json.Unmarshal([]byte(out), &p); err != nil || code != 1 {
		t.Fatalf("exit %d, %v:\n%s", code, err, out)
	}
	if len(p.Problems) != 1 || !strings.Contains(p.Problems[0], "drive A2 is shared by arrays B, S") {
		t.Fatalf("problems %q", p.Problems)
	}
	_, errOut, code = runCLI(t, nil, "array", "delete", "nope", "--site", site)
	if code != 1 || !strings.Contains(errOut, `array "nope" is not defined`) || !strings.Contains(errOut, "A, B, S") {
		t.Fatalf("exit %d: %s", code, errOut)
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
