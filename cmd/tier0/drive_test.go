package main

import (
	"encoding/json"
	"slices"
	"testing"

	"tier0/daemon/cluster"
)

func TestDriveList(t *testing.T) {
	f := newFakeBackend()
	f.status.Nodes[2].Drives = append(f.status.Nodes[2].Drives, "C9") // in no array
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, nil, "drive", "list", "--api", url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "DRIVE", "NODE STATE", "PROGRESS",
		"│ A1    │ A    │ up         │ b     │ rebuilding │ [#####.....] 52%  │",
		"│ B1    │ B    │ down       │ a     │ missing    │ -                 │",
		"│ C3    │ C    │ up         │ c     │ resyncing  │ [##########] 100% │",
		"│ C9    │ C    │ up         │ -     │ unused     │ -                 │")
	out, _, _ = runCLI(t, nil, "drive", "list", "--api", url, "--json")
	var rows []driveRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 8 {
		t.Fatalf("%v: %s", err, out)
	}
	if r := rows[0]; r.Drive != "A1" || r.Array != "b" || r.Progress == nil || *r.Progress != 52 {
		t.Fatalf("row 0: %+v", r)
	}
	if r := rows[2]; r.Drive != "B1" || r.NodeState != "down" || r.Progress != nil {
		t.Fatalf("row 2: %+v", r)
	}
}

func TestDriveFailAndReplace(t *testing.T) {
	f := newFakeBackend()
	url := serveFake(t, f)
	// C2 is in b, whose other member A1 is rebuilding: failing C2 would
	// leave raid5 b with two members out of sync.
	out, errOut, code := runCLI(t, nil, "drive", "fail", "C2", "--api", url, "--token", testToken)
	if code != 1 || out != "" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	mustContain(t, errOut, "refusing to fail drive C2", "b (raid5, 1 other member(s) not in sync: A1(rebuilding) C2)", "--force")
	if m := f.mutations(); len(m) != 0 {
		t.Fatalf("refused fail reached the daemon: %v", m)
	}
	// raid6 c has one member resyncing and can lose another.
	out, errOut, code = runCLI(t, nil, "drive", "fail", "A2", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "fail of drive A2 accepted; arrays with it: c", "tier0 drive replace A2")
	out, errOut, code = runCLI(t, nil, "drive", "fail", "C2", "--force", "--api", url, "--token", testToken, "--json")
	var res driveResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 {
		t.Fatalf("exit %d %v: %s %s", code, err, out, errOut)
	}
	if res.Drive != "C2" || res.Action != "fail" || res.Result != "accepted" || !slices.Equal(res.Arrays, []string{"b"}) {
		t.Fatalf("%+v", res)
	}
	out, errOut, code = runCLI(t, nil, "drive", "replace", "B1", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "replace of drive B1 accepted; arrays with it: a", "tier0 status")
	if m := f.mutations(); !slices.Equal(m, []string{"fail A2", "fail C2", "replace B1"}) {
		t.Fatalf("backend saw %v", m)
	}
	_, errOut, code = runCLI(t, nil, "drive", "replace", "Z9", "--api", url, "--token", testToken)
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, errOut, `drive "Z9" is on no node`, "tier0 drive list")
}

func TestFailWouldLose(t *testing.T) {
	f := newFakeBackend()
	for _, tc := range []struct {
		drive string
		lose  int
	}{{"C1", 1}, {"B1", 0}, {"A1", 0}, {"C2", 1}, {"A2", 0}, {"B2", 0}} {
		in, _ := arraysOf(f.status, tc.drive)
		got := failWouldLose(in, tc.drive)
		if len(got) != tc.lose {
			t.Errorf("fail %s: would lose %q, want %d arrays", tc.drive, got, tc.lose)
		}
	}
	// raid6 with two members out: a third loses it.
	f.status.Arrays[2].Members[0].State = cluster.MemberMissing
	in, _ := arraysOf(f.status, "B2")
	if got := failWouldLose(in, "B2"); len(got) != 1 {
		t.Errorf("raid6 with 2 out: %q", got)
	}
}
