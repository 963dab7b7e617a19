package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"tier0/daemon/api"
)

func TestStatusTable(t *testing.T) {
	f := newFakeBackend()
	out, errOut, code := runCLI(t, nil, "status", "--api", serveFake(t, f))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out,
		"cluster view from node A at 2026-11-29T18:00:00Z: coordinator A, A's lease held",
		"NODE", "DOMAIN", "STATE", "DRAINING", "DRIVES", "OWNS",
		"│ A    │ rack1  │ up    │ no       │ A1 A2    │ a b  │",
		"│ B    │ rack1  │ down  │ no       │ B1 B2    │ -    │",
		"ARRAY", "LEVEL", "HOME", "OWNER", "EPOCH", "STATE", "PHASE", "MEMBERS",
		"│ a     │ raid5 │ A    │ A     │ 3     │ degraded   │ active │ B1(missing) C1      │",
		"│ b     │ raid5 │ B    │ A     │ 7     │ rebuilding │ active │ A1(rebuilding) C2   │",
		"resync/rebuild:",
		"array b  member A1 (node A)  rebuilding  [#####.....] 52%",
		"array c  member C3 (node C)  resyncing   [##########] 100%",
		"3 nodes: 2 up, 1 down; 3 arrays: 1 degraded, 1 rebuilding, 1 optimal")
}

func TestStatusJSON(t *testing.T) {
	f := newFakeBackend()
	out, errOut, code := runCLI(t, nil, "status", "--json", "--api", serveFake(t, f))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var s api.Status
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if s.Coordinator != "A" || len(s.Nodes) != 3 || len(s.Arrays) != 3 || s.Arrays[1].Members[0].Progress != 52 {
		t.Fatalf("JSON lost data: %+v", s)
	}
	if strings.Contains(out, "┌") {
		t.Fatal("--json printed a table")
	}
}

func TestStatusHealthyNoRebuildSection(t *testing.T) {
	f := newFakeBackend()
	f.status.Arrays = f.status.Arrays[2:]
	f.status.Arrays[0].Members[2].State = "ok"
	f.status.Nodes[1].Draining = true
	out, _, code := runCLI(t, nil, "status", "--api", serveFake(t, f))
	if code != 0 {
		t.Fatal(code)
	}
	if strings.Contains(out, "resync/rebuild") {
		t.Fatalf("rebuild section without a rebuild:\n%s", out)
	}
	mustContain(t, out, "3 nodes: 2 up, 1 down (draining); 1 arrays: 1 optimal")
}

func TestStatusDaemonNotReady(t *testing.T) {
	f := newFakeBackend()
	f.unavail = true
	url := serveFake(t, f)
	_, errOut, code := runCLI(t, nil, "status", "--api", url)
	if code != exitUnreachable {
		t.Fatalf("exit %d, want %d", code, exitUnreachable)
	}
	mustContain(t, errOut, url, "503", "store not reachable")
}

func TestStatusShowsFailedArraysAndScrubs(t *testing.T) {
	f := newFakeBackend()
	f.status.Arrays[0].State = "failed"
	f.status.Arrays[0].Reason = "raid5 lost 2 of 2 members (B1, C1)"
	f.status.Owners = []api.OwnerReport{
		{Array: "a", Owner: "A", Epoch: 3, State: "failed", Failed: true, Reason: "members 0, 1 failed; raid5 tolerates 1", Time: testTime},
		{Array: "c", Owner: "C", Epoch: 1, State: "optimal", Time: testTime, Scrub: &api.ScrubStatus{
			Started: testTime.Add(-time.Hour), Finished: testTime.Add(-30 * time.Minute), Mismatches: 2, Repaired: 1, Stripes: []int64{17, 40}}},
		{Array: "b", Owner: "A", Epoch: 7, State: "degraded", Reason: "degraded: member 0 rebuilding", Time: testTime, Scrub: &api.ScrubStatus{Running: true, Started: testTime.Add(-time.Minute)}},
	}
	out, errOut, code := runCLI(t, nil, "status", "--api", serveFake(t, f))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out,
		"problems:",
		"array a  failed: raid5 lost 2 of 2 members (B1, C1)",
		"array a  failed on its owner A (epoch 3), not served: members 0, 1 failed; raid5 tolerates 1",
		"array b  degraded on its owner A: degraded: member 0 rebuilding",
		"scrub:",
		"array c  last scrub 2026-11-29T17:30:00Z (owner C): 2 mismatches, 1 repaired, stripes 17 40",
		"array b  scrub running since 2026-11-29T17:59:00Z (owner A)",
		"3 arrays: 1 failed, 1 rebuilding, 1 optimal")
	out, _, _ = runCLI(t, nil, "status", "--json", "--api", serveFake(t, f))
	var s api.Status
	if err := json.Unmarshal([]byte(out), &s); err != nil || len(s.Owners) != 3 || !s.Owners[0].Failed || s.Owners[1].Scrub.Mismatches != 2 {
		t.Fatalf("JSON lost the owners' reports (%v): %s", err, out)
	}
}
