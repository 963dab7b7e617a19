package api

import (
	"encoding/json"
	"testing"

	"tier0/daemon/cluster"
)

// TestHealthFrom follows node B through the seed story: healthy, lost
// (seen from B's restarted daemon before it resynced), resyncing, healthy.
func TestHealthFrom(t *testing.T) {
	f := newFake(t)
	report := func() string {
		b, _ := json.Marshal(HealthFrom(HealthInput{Node: "B", LeaseHeld: true, Arrays: f.m.Arrays(),
			PathUsable: func(a string) bool { return a != "e" }}))
		return string(b)
	}
	want := `{"node":"B","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[` +
		`{"name":"a","state":"optimal","owner":"A","path_usable":true},{"name":"b","state":"optimal","owner":"B","path_usable":true},` +
		`{"name":"c","state":"optimal","owner":"C","path_usable":true},{"name":"d","state":"optimal","owner":"D","path_usable":true},` +
		`{"name":"e","state":"optimal","owner":"E","path_usable":false}],"rebuild_active":false,"redundant":true}`
	if got := report(); got != want {
		t.Fatalf("healthy:\n got %s\nwant %s", got, want)
	}
	f.step(t, cluster.LeaseExpired{Node: "B"})
	h := HealthFrom(HealthInput{Node: "B", Arrays: f.m.Arrays(), DrivesMissing: []string{"B3"}})
	if h.Lease != "lost" || h.Redundant || h.RebuildActive || h.Arrays[1].Owner != "A" || h.Arrays[0].State != "degraded" || h.DrivesMissing[0] != "B3" {
		t.Fatalf("B lost: %+v", h)
	}
	f.step(t, cluster.NodeReturned{Node: "B"})
	h = HealthFrom(HealthInput{Node: "B", LeaseHeld: true, Arrays: f.m.Arrays()})
	if !h.RebuildActive || h.Redundant || h.Arrays[1].Owner != "B" {
		t.Fatalf("B back, resyncing: %+v", h)
	}
	for _, a := range []string{"a", "c", "d", "e"} {
		f.step(t, cluster.ResyncDone{Array: a, Member: map[string]string{"a": "B1", "c": "B2", "d": "B3", "e": "B4"}[a]})
	}
	h = HealthFrom(HealthInput{Node: "B", LeaseHeld: true, Arrays: f.m.Arrays()})
	if h.RebuildActive || !h.Redundant {
		t.Fatalf("B resynced: %+v", h)
	}
}
