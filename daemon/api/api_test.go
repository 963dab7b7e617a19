package api

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"tier0/daemon/cluster"
)

const token = "s3cret-t0ken-value"

// fakeBackend serves a real failover machine holding the seed topology
// (nodes A-E, arrays a-e) as node B would.
type fakeBackend struct {
	mu     sync.Mutex
	m      *cluster.Machine
	self   string
	events []Event
	calls  []string
}

func newFake(t *testing.T) *fakeBackend {
	t.Helper()
	m, err := cluster.New(cluster.Config{LeaseTicks: 10, SelfFenceTicks: 6}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBackend{m: m, self: "B"}
	for _, n := range "ABCDE" {
		s := string(n)
		f.step(t, cluster.NodeJoined{Node: s, Drives: []string{s + "1", s + "2", s + "3", s + "4"}})
	}
	members := map[string]string{"a": "B1,C1,D1,E1", "b": "A1,C2,D2,E2", "c": "A2,B2,D3,E3", "d": "A3,B3,C3,E4", "e": "A4,B4,C4,D4"}
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		var ms []cluster.MemberSpec
		for _, d := range strings.Split(members[name], ",") {
			ms = append(ms, cluster.MemberSpec{Drive: d})
		}
		f.step(t, cluster.ArrayDefined{Name: name, Level: cluster.RAID5, Home: strings.ToUpper(name), Members: ms})
	}
	return f
}

// step applies ev and performs every action successfully.
func (f *fakeBackend) step(t *testing.T, ev cluster.Event) {
	t.Helper()
	if err := f.stepErr(ev); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeBackend) stepErr(ev cluster.Event) error {
	if err := f.m.Step(ev); err != nil {
		return err
	}
	for {
		acts := f.m.Ready()
		if len(acts) == 0 {
			return nil
		}
		for _, a := range acts {
			var reply cluster.Event
			switch a := a.(type) {
			case cluster.Fence:
				reply = cluster.FenceDone{Array: a.Array, Node: a.Node, Epoch: a.NewEpoch}
			case cluster.Assemble:
				reply = cluster.ArrayAssembled{Array: a.Array, Node: a.Node, Epoch: a.Epoch}
			case cluster.Release:
				reply = cluster.Released{Array: a.Array, Node: a.Node, Epoch: a.Epoch}
			case cluster.RecordEvent:
				f.events = append(f.events, Event{Time: time.Unix(1700000000, 0).UTC(), Kind: a.Kind, Array: a.Array, Node: a.Node,
					From: a.From, To: a.To, Epoch: a.Epoch, Message: a.Message, Revision: int64(len(f.events) + 1)})
			}
			if reply != nil {
				if err := f.m.Step(reply); err != nil {
					return err
				}
			}
		}
	}
}

func (f *fakeBackend) Status(ctx context.Context) (Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Status{Node: f.self, Lease: "held", Nodes: f.m.Nodes(), Arrays: f.m.Arrays(), Time: time.Unix(1700000000, 0).UTC()}, nil
}

func (f *fakeBackend) Arrays(ctx context.Context) ([]Array, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m.Arrays(), nil
}

func (f *fakeBackend) Array(ctx context.Context, name string) (Array, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.m.Array(name)
	if !ok {
		return a, fmt.Errorf("array %q: %w", name, ErrNotFound)
	}
	return a, nil
}

func (f *fakeBackend) Events(ctx context.Context, after int64, limit int) ([]Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Event
	for _, e := range f.events {
		if e.Revision > after && (limit == 0 || len(out) < limit) {
			out = append(out, e)
		}
	}
	return out, nil
}

func (f *fakeBackend) NodeHealth(ctx context.Context) (NodeHealth, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := NodeHealth{Node: f.self, Daemon: "ok", Lease: "held", Redundant: true}
	for _, a := range f.m.Arrays() {
		h.Arrays = append(h.Arrays, ArrayHealth{Name: a.Name, State: string(a.State), Owner: a.Owner,
			PathUsable: a.State != cluster.StateFailed && a.State != cluster.StateOffline})
		if a.State != cluster.StateOptimal {
			h.Redundant = false
		}
		if a.State == cluster.StateRebuilding {
			h.RebuildActive = true
		}
	}
	return h, nil
}

func (f *fakeBackend) mutate(call string, ev cluster.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	if err := f.stepErr(ev); err != nil {
		if errors.Is(err, cluster.ErrUnknownNode) || errors.Is(err, cluster.ErrUnknownDrive) {
			return fmt.Errorf("%v: %w", err, ErrNotFound)
		}
		return err
	}
	return nil
}

func (f *fakeBackend) Drain(ctx context.Context, n string) error {
	return f.mutate("drain "+n, cluster.DrainRequested{Node: n})
}
func (f *fakeBackend) Undrain(ctx context.Context, n string) error {
	return f.mutate("undrain "+n, cluster.UndrainRequested{Node: n})
}
func (f *fakeBackend) FailDrive(ctx context.Context, d string) error {
	for _, a := range f.m.Arrays() {
		for _, mb := range a.Members {
			if mb.Drive == d {
				return f.mutate("fail "+d, cluster.MemberFailed{Array: a.Name, Member: d})
			}
		}
	}
	return fmt.Errorf("drive %q is in no array: %w", d, ErrNotFound)
}
func (f *fakeBackend) ReplaceDrive(ctx context.Context, d string) error {
	return f.mutate("replace "+d, cluster.DriveReplaced{Drive: d})
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newServerM(t *testing.T, f *fakeBackend, tok string) (*httptest.Server, *Server) {
	t.Helper()
	s, err := NewServer(ServerOptions{Backend: f, Token: tok})
	if err != nil {
		t.Fatal(err)
	}
	s.Metrics().SetArrays(f.self, f.m.Arrays())
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts, s
}

func newServer(t *testing.T, f *fakeBackend, tok string) (*httptest.Server, *syncBuf) {
	t.Helper()
	logs := &syncBuf{}
	s, err := NewServer(ServerOptions{Backend: f, Token: tok, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	s.Metrics().SetArrays(f.self, f.m.Arrays())
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts, logs
}

func TestNodeHealthExactShape(t *testing.T) {
	f := newFake(t)
	ts, _ := newServer(t, f, token)
	resp, err := http.Get(ts.URL + "/v1/node/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	want := `{"node":"B","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[` +
		`{"name":"a","state":"optimal","owner":"A","path_usable":true},{"name":"b","state":"optimal","owner":"B","path_usable":true},` +
		`{"name":"c","state":"optimal","owner":"C","path_usable":true},{"name":"d","state":"optimal","owner":"D","path_usable":true},` +
		`{"name":"e","state":"optimal","owner":"E","path_usable":true}],"rebuild_active":false,"redundant":true}`
	if got := strings.TrimSpace(b.String()); got != want {
		t.Fatalf("health:\n got %s\nwant %s", got, want)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
}

func TestClientReadsAndErrors(t *testing.T) {
	f := newFake(t)
	ts, _ := newServer(t, f, token)
	c := NewClient(ts.URL, "", nil)
	ctx := t.Context()
	st, err := c.Status(ctx)
	if err != nil || st.Node != "B" || len(st.Nodes) != 5 || len(st.Arrays) != 5 {
		t.Fatalf("status %+v, %v", st, err)
	}
	arrs, err := c.Arrays(ctx)
	if err != nil || len(arrs) != 5 || arrs[0].Name != "a" || arrs[0].Members[0].Drive != "B1" {
		t.Fatalf("arrays %+v, %v", arrs, err)
	}
	a, err := c.Array(ctx, "c")
	if err != nil || a.Owner != "C" || a.Epoch != 1 || a.State != cluster.StateOptimal {
		t.Fatalf("array c %+v, %v", a, err)
	}
	if _, err := c.Array(ctx, "zz"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown array: %v, want ErrNotFound", err)
	}
	evs, err := c.Events(ctx, 0, 0)
	if err != nil || len(evs) != 10 || evs[0].Kind != "assign" {
		t.Fatalf("events %d %+v, %v", len(evs), evs, err)
	}
	tail, err := c.Events(ctx, 8, 1)
	if err != nil || len(tail) != 1 || tail[0].Revision != 9 {
		t.Fatalf("events after 8 limit 1: %+v, %v", tail, err)
	}
	if _, err := c.Events(ctx, 0, 0); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(ts.URL + "/v1/events?after=-3")
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("negative after: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if _, err := NewClient("http://127.0.0.1:1", "", nil).Status(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("closed port: %v, want ErrUnavailable", err)
	}
}

func TestMutationsNeedToken(t *testing.T) {
	f := newFake(t)
	ts, logs := newServer(t, f, token)
	ctx := t.Context()
	for _, c := range []*Client{NewClient(ts.URL, "", nil), NewClient(ts.URL, "wrong-"+token, nil), NewClient(ts.URL, token[:len(token)-1], nil)} {
		for name, call := range map[string]func() error{
			"drain":   func() error { return c.Drain(ctx, "C") },
			"undrain": func() error { return c.Undrain(ctx, "C") },
			"fail":    func() error { return c.FailDrive(ctx, "C1") },
			"replace": func() error { return c.ReplaceDrive(ctx, "C1") },
		} {
			if err := call(); !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("%s with token %q: %v, want ErrUnauthorized", name, c.token, err)
			}
		}
	}
	if len(f.calls) != 0 {
		t.Fatalf("backend called without authorization: %v", f.calls)
	}
	good := NewClient(ts.URL, token, nil)
	if err := good.Drain(ctx, "C"); err != nil {
		t.Fatal(err)
	}
	if a, _ := good.Array(ctx, "c"); a.Owner == "C" || a.Epoch != 2 {
		t.Fatalf("after drain C, array c = owner %s epoch %d", a.Owner, a.Epoch)
	}
	if err := good.Undrain(ctx, "C"); err != nil {
		t.Fatal(err)
	}
	if a, _ := good.Array(ctx, "c"); a.Owner != "C" || a.Epoch != 3 {
		t.Fatalf("after undrain C, array c = owner %s epoch %d", a.Owner, a.Epoch)
	}
	if err := good.FailDrive(ctx, "C1"); err != nil {
		t.Fatal(err)
	}
	if h, _ := good.NodeHealth(ctx); h.Redundant || h.Arrays[0].State != "degraded" {
		t.Fatalf("after failing C1: %+v", h)
	}
	if err := good.ReplaceDrive(ctx, "C1"); err != nil {
		t.Fatal(err)
	}
	if h, _ := good.NodeHealth(ctx); !h.RebuildActive || h.Arrays[0].State != "rebuilding" {
		t.Fatalf("after replacing C1: %+v", h)
	}
	if err := good.Drain(ctx, "Q"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("drain of unknown node: %v, want ErrNotFound", err)
	}
	if want := []string{"drain C", "undrain C", "fail C1", "replace C1", "drain Q"}; !slices.Equal(f.calls, want) {
		t.Fatalf("backend calls %v, want %v", f.calls, want)
	}
	if l := logs.String(); strings.Contains(l, token[:8]) || !strings.Contains(l, "status=401") {
		t.Fatalf("logs leak the token or miss the refusals:\n%s", l)
	}

	// No token configured: mutations are refused outright.
	ts2, _ := newServer(t, newFake(t), "")
	if err := NewClient(ts2.URL, "", nil).Drain(ctx, "C"); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("server without token accepted a drain: %v", err)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	f := newFake(t)
	f.step(t, cluster.MemberFailed{Array: "a", Member: "C1"})
	f.step(t, cluster.DriveReplaced{Drive: "C1"})
	f.step(t, cluster.RebuildProgress{Array: "a", Member: "C1", Percent: 25})
	ts, srv := newServerM(t, f, token)
	srv.Metrics().ObserveRecord(cluster.RecordEvent{Kind: "failover", Array: "b", Ticks: 3}, 500*time.Millisecond)
	srv.Metrics().ObserveRecord(cluster.RecordEvent{Kind: "state", Array: "b"}, time.Second)
	c := NewClient(ts.URL, "", nil)
	if _, err := c.Status(t.Context()); err != nil {
		t.Fatal(err)
	}
	text, err := c.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`tier0_array_state{array="a",state="rebuilding"} 1`,
		`tier0_array_state{array="a",state="optimal"} 0`,
		`tier0_array_degraded_members{array="a"} 1`,
		`tier0_rebuild_progress_ratio{array="a",member="C1"} 0.25`,
		`tier0_array_owned{array="b"} 1`,
		`tier0_array_owned{array="a"} 0`,
		`tier0_api_requests_total{code="200",route="/v1/status"} 1`,
		`tier0_failovers_total{array="b",kind="failover"} 1`,
		`tier0_failover_duration_seconds_sum{kind="failover"} 1.5`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tier0-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestServeTLSAndShutdown(t *testing.T) {
	cert := selfSigned(t)
	s, err := NewServer(ServerOptions{Backend: newFake(t), Token: token, TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	pool := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	pool.AddCert(leaf)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + l.Addr().String()
	c := NewClient(base, token, hc)
	if err := c.Drain(t.Context(), "C"); err != nil {
		t.Fatalf("drain over TLS: %v", err)
	}
	if _, err := NewClient("http://"+l.Addr().String(), token, nil).Status(t.Context()); err == nil {
		t.Fatal("plain HTTP accepted by a TLS server")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}
