package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"tier0/daemon/api"
)

func TestEventsTable(t *testing.T) {
	url := serveFake(t, newFakeBackend())
	out, errOut, code := runCLI(t, nil, "events", "--api", url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "REV", "TIME", "KIND", "MOVE", "EPOCH", "TOOK", "MESSAGE",
		"│ 9   │ 2026-11-29T17:58:00Z │ assign        │ b     │ -    │ ->B  │ 1     │ -      │",
		"│ 10  │ 2026-11-29T17:59:00Z │ node-lost     │ -     │ B    │ -    │ -     │ -      │",
		"│ 11  │ 2026-11-29T17:59:10Z │ failover      │ b     │ -    │ B->A │ 7     │ 2.500s │",
		"│ 12  │ 2026-11-29T17:59:20Z │ rebuild-start │ b     │ A    │ -    │ -     │ -      │ member A1 │")
	out, _, _ = runCLI(t, nil, "events", "--api", url, "--after", "10", "--last", "1")
	if strings.Contains(out, "node-lost") || strings.Contains(out, "failover") || !strings.Contains(out, "rebuild-start") {
		t.Fatalf("--after 10 --last 1:\n%s", out)
	}
	out, _, _ = runCLI(t, nil, "events", "--api", url, "--json", "--after", "10")
	var evs []api.Event
	if err := json.Unmarshal([]byte(out), &evs); err != nil || len(evs) != 2 || evs[0].Revision != 11 || evs[0].Duration != 2.5 || evs[0].To != "A" {
		t.Fatalf("%v: %s", err, out)
	}
	out, _, _ = runCLI(t, nil, "events", "--api", url, "--json", "--after", "99")
	if strings.TrimSpace(out) != "[]" {
		t.Fatalf("no events should be [], got %q", out)
	}
}

// follow prints the backlog, then each new event once, across a spell in
// which the daemon answers 503, until the context ends.
func TestEventsFollow(t *testing.T) {
	f := newFakeBackend()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.onEvents = func(n int) {
		switch n {
		case 3:
			f.events = append(f.events, api.Event{Time: testTime, Kind: "handoff", Array: "b", From: "A", To: "B", Epoch: 8, Duration: 0.75, Revision: 13})
		case 4, 5:
			f.unavail = true
		case 6:
			f.unavail = false
			f.events = append(f.events, api.Event{Time: testTime.Add(time.Second), Kind: "rebuild-done", Array: "b", Node: "B", Message: `member "A1"`, Revision: 15})
		case 8:
			cancel()
		}
	}
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, ctx, "events", "--follow", "--api", url, "--last", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if context.Cause(ctx) != context.Canceled {
		t.Fatalf("follow ended on its own: %v", ctx.Err())
	}
	want := "11     2026-11-29T17:59:10Z failover         array=b move=B->A epoch=7 took=2.500s\n" +
		"12     2026-11-29T17:59:20Z rebuild-start    array=b node=A \"member A1\"\n" +
		"13     2026-11-29T18:00:00Z handoff          array=b move=A->B epoch=8 took=0.750s\n" +
		"15     2026-11-29T18:00:01Z rebuild-done     array=b node=B \"member \\\"A1\\\"\"\n"
	if out != want {
		t.Fatalf("follow printed:\n%s\nwant:\n%s", out, want)
	}
	mustContain(t, errOut, "cluster not answering, retrying", "503", "cluster answering again")
}

func TestEventsFollowJSONLines(t *testing.T) {
	f := newFakeBackend()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.onEvents = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	out, errOut, code := runCLI(t, ctx, "events", "-f", "--json", "--api", serveFake(t, f))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 4 JSON lines, got:\n%s", out)
	}
	for i, l := range lines {
		var e api.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Revision != int64(9+i) {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
	}
}
