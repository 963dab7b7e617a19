package slurmtest

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"tier0/daemon/api"
	"tier0/slurm-plugin/health"
)

// TestHealthReportIsNodeHealth: the node's health answer is defined twice
// on purpose (docs/ARCHITECTURE.md, "Names"): api.NodeHealth, which the
// daemon serves, and health.Report, which the Slurm side parses and may
// import nothing of the daemon. This is what binds them: the same JSON
// fields with the same kinds, and a full answer survives the trip through
// health.Parse unchanged.
func TestHealthReportIsNodeHealth(t *testing.T) {
	a, h := jsonShape(reflect.TypeFor[api.NodeHealth]()), jsonShape(reflect.TypeFor[health.Report]())
	if !slices.Equal(a, h) {
		t.Fatalf("api.NodeHealth and health.Report differ as JSON:\n api:    %s\n health: %s\nchange both (the daemon's answer and the Slurm side's parser)", strings.Join(a, " "), strings.Join(h, " "))
	}
	in := api.NodeHealth{Node: "B", Daemon: "degraded", Fenced: true, Lease: "lost", DrivesMissing: []string{"B1"},
		Arrays:        []api.ArrayHealth{{Name: "a", State: "rebuilding", Owner: "A", PathUsable: true}},
		RebuildActive: true, Redundant: true}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	r, err := health.Parse(b)
	if err != nil {
		t.Fatalf("health.Parse(%s): %v", b, err)
	}
	back, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(back) != string(b) {
		t.Errorf("a node health answer through health.Parse:\n sent: %s\n read: %s\nwant them equal", b, back)
	}
}

// jsonShape lists a struct's JSON fields as "name:kind", nested structs
// (and slices of them) expanded, sorted.
func jsonShape(t reflect.Type) []string {
	var out []string
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				name = f.Name
			}
			ft, kind := f.Type, f.Type.Kind().String()
			if ft.Kind() == reflect.Slice {
				ft = ft.Elem()
				kind = "[]" + ft.Kind().String()
			}
			out = append(out, prefix+name+":"+kind)
			if ft.Kind() == reflect.Struct {
				walk(prefix+name+".", ft)
			}
		}
	}
	walk("", t)
	slices.Sort(out)
	return out
}
