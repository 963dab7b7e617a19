package health

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

const sample = `{"node":"B","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[{"name":"a","state":"optimal","owner":"A","path_usable":true}],"rebuild_active":false,"redundant":true}`

func TestJudge(t *testing.T) {
	base, err := Parse([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	mod := func(f func(r *Report)) Report {
		r := base
		r.Arrays = append([]Array(nil), base.Arrays...)
		f(&r)
		return r
	}
	cases := []struct {
		name    string
		r       Report
		err     error
		verdict Verdict
		reasons []string
	}{
		{"healthy", base, nil, Healthy, nil},
		{"unreachable", Report{}, ErrDaemonDown, Failed, []string{"daemon down"}},
		{"daemon starting", mod(func(r *Report) { r.Daemon = "starting" }), nil, Failed, []string{"daemon starting"}},
		{"fenced", mod(func(r *Report) { r.Fenced = true }), nil, Failed, []string{"fenced"}},
		{"lease", mod(func(r *Report) { r.Lease = "lost" }), nil, Failed, []string{"lease lost"}},
		{"drives", mod(func(r *Report) { r.DrivesMissing = []string{"B1", "B3"} }), nil, Failed, []string{"drives missing B1,B3"}},
		{"rebuilding", mod(func(r *Report) { r.RebuildActive, r.Redundant = true, false }), nil, Impaired, []string{"rebuild active", "not redundant"}},
		{"no path", mod(func(r *Report) { r.Arrays[0].PathUsable = false }), nil, Impaired, []string{"array a has no usable path from this node"}},
		{"array failed", mod(func(r *Report) { r.Arrays[0].State = StateFailed }), nil, Impaired, []string{"array a failed"}},
	}
	for _, c := range cases {
		v, reasons := Judge(c.r, c.err)
		if v != c.verdict || !reflect.DeepEqual(reasons, c.reasons) {
			t.Errorf("%s: Judge = %v %q, want %v %q", c.name, v, reasons, c.verdict, c.reasons)
		}
	}
}

func TestArrayProblems(t *testing.T) {
	r := Report{Arrays: []Array{
		{Name: "a", State: StateOptimal, PathUsable: true},
		{Name: "b", State: StateDegraded, PathUsable: true},
		{Name: "c", State: StateRebuilding, PathUsable: false},
		{Name: "d", State: StateOffline, PathUsable: false},
	}}
	if p := r.ArrayProblems([]string{"a", "b"}); len(p) != 0 {
		t.Errorf("a,b usable (degraded is usable): %q", p)
	}
	want := []string{"array c has no usable path from this node", "array d offline", "array x unknown to this node"}
	if p := r.ArrayProblems([]string{"c", "d", "x"}); !reflect.DeepEqual(p, want) {
		t.Errorf("ArrayProblems = %q, want %q", p, want)
	}
	if p := r.ArrayProblems(nil); len(p) != 2 {
		t.Errorf("all arrays: %q, want 2 problems", p)
	}
}

func TestFetch(t *testing.T) {
	body, status := sample, http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != Path {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	ctx := context.Background()
	r, err := Fetch(ctx, nil, srv.URL+"/")
	if err != nil || r.Node != "B" || !r.Redundant || len(r.Arrays) != 1 {
		t.Fatalf("Fetch = %+v, %v", r, err)
	}
	status = http.StatusServiceUnavailable
	if _, err := Fetch(ctx, nil, srv.URL); !errors.Is(err, ErrDaemonDown) || !strings.Contains(err.Error(), "503") {
		t.Errorf("503: %v, want ErrDaemonDown naming the status", err)
	}
	status, body = http.StatusOK, `{"node":"B"}`
	if _, err := Fetch(ctx, nil, srv.URL); !errors.Is(err, ErrDaemonDown) {
		t.Errorf("incomplete report: %v, want ErrDaemonDown", err)
	}
	srv.Close()
	if _, err := Fetch(ctx, nil, srv.URL); !errors.Is(err, ErrDaemonDown) {
		t.Errorf("closed server: %v, want ErrDaemonDown", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte(`{"node":"B","daemon":"ok","lease":"held","arrays":[{"name":""}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Parse(b)
		if err != nil {
			return
		}
		v, reasons := Judge(r, nil)
		if (v == Healthy) != (len(reasons) == 0) {
			t.Fatalf("verdict %v with reasons %q", v, reasons)
		}
	})
}
