package api

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"tier0/daemon/config"
)

// statusServer answers GET /v1/status as node with code (200: a view).
func statusServer(t *testing.T, node string, code int, hits *atomic.Int64) string {
	t.Helper()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if code != http.StatusOK {
			w.WriteHeader(code)
			w.Write([]byte(`{"error":"not now"}`))
			return
		}
		w.Write([]byte(`{"node":"` + node + `"}`))
	}))
	t.Cleanup(hs.Close)
	return hs.URL
}

func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// TestClusterCallTriesInTurn: a dead endpoint and one answering 503 are
// passed over; the one that answered is asked first next time; a definite
// refusal (404) is returned as it is, without asking the others.
func TestClusterCallTriesInTurn(t *testing.T) {
	var sick, good, gone atomic.Int64
	eps := []Endpoint{
		{Node: "A", URL: deadURL(t)},
		{Node: "B", URL: statusServer(t, "B", http.StatusServiceUnavailable, &sick)},
		{Node: "C", URL: statusServer(t, "C", http.StatusOK, &good)},
	}
	c := NewCluster(eps, ClusterOptions{Source: "site.yaml"})
	ctx := context.Background()
	s, err := c.Status(ctx)
	if err != nil || s.Node != "C" {
		t.Fatalf("Status = %q, %v; want node C's answer", s.Node, err)
	}
	if sick.Load() != 1 || good.Load() != 1 {
		t.Fatalf("hits: B %d, C %d; want 1 each", sick.Load(), good.Load())
	}
	if got := c.Endpoints()[0].Node; got != "C" {
		t.Fatalf("first endpoint after C answered: %s, want C", got)
	}
	if _, err := c.Status(ctx); err != nil || good.Load() != 2 || sick.Load() != 1 {
		t.Fatalf("second call: %v; hits B %d, C %d; want C asked first", err, sick.Load(), good.Load())
	}
	eps = []Endpoint{{Node: "X", URL: statusServer(t, "X", http.StatusNotFound, &gone)}, eps[1]}
	c = NewCluster(eps, ClusterOptions{})
	if _, err := c.Status(ctx); !errors.Is(err, ErrNotFound) || sick.Load() != 1 {
		t.Fatalf("404: %v (B asked %d times); want ErrNotFound from X alone", err, sick.Load())
	}
}

// TestClusterUnreachableNamesEveryAddress: when none answers, the error
// names each address and its reason, the source, the advice and the hint,
// and wraps ErrUnavailable.
func TestClusterUnreachableNamesEveryAddress(t *testing.T) {
	var sick atomic.Int64
	dead, busy := deadURL(t), statusServer(t, "B", http.StatusServiceUnavailable, &sick)
	c := NewCluster([]Endpoint{{Node: "A", URL: dead}, {Node: "B", URL: busy}},
		ClusterOptions{Source: "site.yaml", Hint: "; or ask someone"})
	_, err := c.Status(context.Background())
	var ue *UnreachableError
	if !errors.As(err, &ue) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err %v (%T); want an *UnreachableError wrapping ErrUnavailable", err, err)
	}
	msg := err.Error()
	for _, want := range []string{"(addresses from site.yaml)", dead + " (node A): ", "connection refused", busy + " (node B): ", "503", "systemctl status tier0d", "reach them; or ask someone."} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if b := ue.Brief(); strings.Contains(b, "\n") || !strings.Contains(b, dead+" (node A)") || strings.Contains(b, "What to do") {
		t.Errorf("Brief() = %q; want one line with the addresses and no advice", b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Status(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("ended context: %v, want context.Canceled", err)
	}
}

func TestClusterOnly(t *testing.T) {
	c := NewCluster([]Endpoint{{Node: "A", URL: "http://a"}, {Node: "B", URL: "http://b"}}, ClusterOptions{Source: "site.yaml"})
	if err := c.Only("Z"); err == nil || !strings.Contains(err.Error(), `node "Z" is not in site.yaml; its nodes are A, B`) {
		t.Fatalf("Only(Z): %v", err)
	}
	if err := c.Only("B"); err != nil || len(c.Endpoints()) != 1 || c.Endpoints()[0].Node != "B" {
		t.Fatalf("Only(B): %v, endpoints %v", err, c.Endpoints())
	}
	direct := NewCluster([]Endpoint{{URL: "http://h:1"}}, ClusterOptions{Source: "--api"})
	if err := direct.Only("B"); err != nil || len(direct.Endpoints()) != 1 {
		t.Fatalf("Only on a direct endpoint: %v", err)
	}
}

func TestSiteEndpointsSelfFirst(t *testing.T) {
	cfg := &config.Config{Nodes: []config.Node{
		{Name: "A", Address: "10.0.0.1", API: config.Endpoint{Port: 7480}},
		{Name: "B", Address: "10.0.0.2", API: config.Endpoint{Port: 7480}},
		{Name: "C", Address: "10.0.0.3", API: config.Endpoint{Port: 7481}},
	}}
	var got []string
	for _, ep := range SiteEndpoints(cfg, "C.cluster.example") {
		got = append(got, ep.String())
	}
	want := "http://10.0.0.3:7481 (node C),http://10.0.0.1:7480 (node A),http://10.0.0.2:7480 (node B)"
	if strings.Join(got, ",") != want {
		t.Fatalf("SiteEndpoints = %v, want %s", got, want)
	}
	if eps := SiteEndpoints(cfg, ""); eps[0].Node != "A" {
		t.Fatalf("without a host name the site order holds: %v", eps)
	}
}
