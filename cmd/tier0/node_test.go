package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
)

func TestNodeList(t *testing.T) {
	url := serveFake(t, newFakeBackend())
	out, errOut, code := runCLI(t, nil, "node", "list", "--api", url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "NODE", "OWNS", "│ A    │ rack1  │ up    │ no       │ A1 A2    │ a b  │", "│ C    │ rack2  │ up    │ no       │ C1 C2 C3 │ c    │")
	out, _, _ = runCLI(t, nil, "node", "list", "--api", url, "--json")
	var nodes []cluster.NodeView
	if err := json.Unmarshal([]byte(out), &nodes); err != nil || len(nodes) != 3 || nodes[1].State != cluster.NodeDown {
		t.Fatalf("%v: %+v", err, nodes)
	}
}

func TestNodeDrainUndrain(t *testing.T) {
	f := newFakeBackend()
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, nil, "node", "drain", "C", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "drain of node C accepted", "tier0 events --follow")
	out, errOut, code = runCLI(t, nil, "node", "undrain", "C", "--api", url, "--token", testToken, "--json")
	var res moveResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 {
		t.Fatalf("exit %d %v: %s %s", code, err, out, errOut)
	}
	if res != (moveResult{Node: "C", Action: "undrain", Result: "accepted"}) {
		t.Fatalf("%+v", res)
	}
	if got := f.mutations(); !slices.Equal(got, []string{"drain C", "undrain C"}) {
		t.Fatalf("backend saw %v", got)
	}
	_, errOut, code = runCLI(t, nil, "node", "drain", "Q", "--api", url, "--token", testToken)
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, errOut, `node "Q" is not in the site config`, "tier0 node list")
	_, errOut, code = runCLI(t, nil, "node", "drain", "C", "--api", url)
	if code != 1 || !strings.Contains(errOut, "401") {
		t.Fatalf("no token: exit %d: %s", code, errOut)
	}
}

// The cluster moves array c off C on the 3rd look; drain --wait returns
// once C owns nothing and nothing is moving.
func TestNodeDrainWait(t *testing.T) {
	f := newFakeBackend()
	f.onStatus = func(s *api.Status, n int) {
		s.Nodes[2].Draining = true
		c := &s.Arrays[2]
		switch {
		case n == 2:
			c.Phase = "releasing"
		case n == 3:
			c.Owner, c.Phase, s.Nodes[2].Owns = "A", "fencing", nil
		case n >= 4:
			c.Phase = "active"
		}
	}
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, nil, "node", "drain", "C", "--wait", "--api", url, "--token", testToken)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, errOut, "waiting: array c still on C (phase active)", "waiting: array c still on C (phase releasing)", "waiting: array c moving to A (phase fencing)")
	mustContain(t, out, "drain of node C accepted", "node C owns no array now")
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nStatus < 4 {
		t.Fatalf("returned after %d looks, before the move was done", f.nStatus)
	}
}

func TestNodeDrainWaitTimesOut(t *testing.T) {
	f := newFakeBackend() // C never lets go of c
	url := serveFake(t, f)
	_, errOut, code := runCLI(t, nil, "node", "drain", "C", "--wait", "--wait-timeout", "50ms", "--api", url, "--token", testToken)
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	mustContain(t, errOut, "drain of node C was recorded, but gave up after 50ms waiting for:", "node C not marked draining yet", "array c still on C")
}

// undrain --wait: B comes up, b returns home, then the resyncs finish.
func TestNodeUndrainWait(t *testing.T) {
	f := newFakeBackend()
	f.onStatus = func(s *api.Status, n int) {
		f.unavail = n == 2 // the node asked restarts once
		if n >= 2 {
			s.Nodes[1].State = cluster.NodeUp
		}
		if n >= 3 {
			s.Arrays[1].Owner = "B"
		}
		if n >= 4 {
			for i := range s.Arrays {
				s.Arrays[i].State = cluster.StateOptimal
				for j := range s.Arrays[i].Members {
					s.Arrays[i].Members[j].State = cluster.MemberOK
				}
			}
		}
	}
	url := serveFake(t, f)
	out, errOut, code := runCLI(t, nil, "node", "undrain", "B", "--wait", "--api", url, "--token", testToken, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, errOut, "waiting: node B is down", "array b not back on its home B (owner A, phase active)",
		"waiting: cluster not answering: no tier0d API answered: "+url+": ", "503",
		"waiting: array a degraded, phase active; array b rebuilding, phase active, A1 rebuilding 52%")
	var res moveResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Result != "done" {
		t.Fatalf("%v: %s", err, out)
	}
}

func TestNodeHealth(t *testing.T) {
	f := newFakeBackend()
	site := siteFile(t, deadAddr(t), hostPort(serveFake(t, f)))
	// Node A's own API is down: asking for A must not take B's answer.
	_, errOut, code := runCLI(t, nil, "node", "health", "A", "--site", site)
	if code != exitUnreachable || strings.Contains(errOut, "(node B)") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// B's API answers, but as node A (the fake): a mismatch is an error.
	_, errOut, code = runCLI(t, nil, "node", "health", "B", "--site", site)
	if code != 1 || !strings.Contains(errOut, "asked for node B's health but A answered") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	_, errOut, _ = runCLI(t, nil, "node", "health", "X", "--site", site)
	mustContain(t, errOut, `node "X" is not in`, "its nodes are A, B")
	out, errOut, code := runCLI(t, nil, "node", "health", "--site", site)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mustContain(t, out, "node A: daemon ok, lease held, fenced no, drives missing -, rebuild active no, redundant no",
		"PATH USABLE", "│ a     │ degraded │ A     │ yes         │")
	out, _, _ = runCLI(t, nil, "node", "health", "--site", site, "--json")
	var h api.NodeHealth
	if err := json.Unmarshal([]byte(out), &h); err != nil || h.Node != "A" || len(h.Arrays) != 1 {
		t.Fatalf("%v: %+v", err, h)
	}
}
