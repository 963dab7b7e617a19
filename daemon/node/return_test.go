package node

import (
	"encoding/json"
	"testing"
	"time"

	"tier0/daemon/cluster"
)

// A "returned" report names the registration it reports, as the node
// watch's NodeReturned does, so that the coordinator takes the two for one
// return; a report without one (notServing's) still has none.
func TestReturnedReportNamesTheRegistration(t *testing.T) {
	started := time.Date(2026, 12, 2, 0, 0, 0, 123456789, time.UTC)
	var r report
	b, _ := json.Marshal(report{Kind: "returned", Node: "A", Started: unixNano(started), Fences: 2})
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	ev, err := r.event()
	if err != nil {
		t.Fatal(err)
	}
	want := cluster.NodeReturned{Node: "A", Started: started.UnixNano(), Fences: 2}
	if ev != want {
		t.Fatalf("report %s became %#v, want %#v", b, ev, want)
	}
	if ev, _ := (report{Kind: "returned", Node: "A", Array: "x"}).event(); ev != (cluster.NodeReturned{Node: "A"}) {
		t.Fatalf("a report without a registration became %#v, want NodeReturned{Node: A} without identity", ev)
	}
	if unixNano(time.Time{}) != 0 {
		t.Fatalf("the zero Started is identity %d, want 0 (none)", unixNano(time.Time{}))
	}
}
