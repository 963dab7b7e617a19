package slurm

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"tier0/internal/fakescontrol"
)

func TestParseShowNodeReal(t *testing.T) {
	b, err := os.ReadFile("testdata/show-node-22.05.txt")
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := ParseShowNode(string(b))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		name, base, reason, user string
		drained, ours            bool
		flags                    string
	}
	wants := []want{
		{"node1", "IDLE", "", "", false, false, ""},
		{"node3", "IDLE", "tier0: array c no path", "root", true, true, "DRAIN"},
		{"node4", "IDLE", "", "", false, false, "NOT_RESPONDING"},
		{"node5", "IDLE", "admin: disk swap x=1 [ticket 7]", "root", true, false, "DRAIN"},
	}
	if len(nodes) != len(wants) {
		t.Fatalf("parsed %d nodes, want %d", len(nodes), len(wants))
	}
	for i, w := range wants {
		n := nodes[i]
		if n.Name != w.name || n.Base != w.base || n.Reason != w.reason || n.ReasonUser != w.user ||
			n.Drained() != w.drained || n.OwnedByTier0() != w.ours || strings.Join(n.Flags, "+") != w.flags {
			t.Errorf("node %d = %+v (drained %v ours %v), want %+v", i, n, n.Drained(), n.OwnedByTier0(), w)
		}
	}
	if got := nodes[0].Fields["OS"]; got != "Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0" {
		t.Errorf("OS field = %q, want the whole value with spaces", got)
	}
	if got := nodes[1].Fields["Port"]; got != "17003" {
		t.Errorf("Port = %q", got)
	}
	if nodes[3].ReasonTime != "2026-11-29T18:33:28" {
		t.Errorf("ReasonTime = %q", nodes[3].ReasonTime)
	}
}

func TestParseShowNodeErrors(t *testing.T) {
	for _, in := range []string{
		"Node nodeX not found",
		"NodeName= State=IDLE",
		"NodeName=n1 Arch=x86_64",
	} {
		if _, err := ParseShowNode(in); err == nil {
			t.Errorf("ParseShowNode(%q) succeeded, want an error", in)
		}
	}
	nodes, err := ParseShowNode("\n\n")
	if err != nil || len(nodes) != 0 {
		t.Errorf("empty output: %v, %v", nodes, err)
	}
}

func TestReasons(t *testing.T) {
	if !IsTier0Reason("  tier0: daemon down") || IsTier0Reason("Tier0 daemon") || IsTier0Reason("Prolog error") {
		t.Error("IsTier0Reason misclassifies")
	}
	if got := Tier0Reason("daemon\n down"); got != "tier0: daemon down" {
		t.Errorf("Tier0Reason = %q", got)
	}
	if got := Tier0Reason("tier0: x"); got != "tier0: x" {
		t.Errorf("Tier0Reason kept prefix twice: %q", got)
	}
	if got := Tier0Reason(strings.Repeat("x", 500)); len(got) != 200 {
		t.Errorf("Tier0Reason length %d, want 200", len(got))
	}
}

func fastClient(path string) *Client {
	return New(Options{Path: path, Timeout: 2 * time.Second, Attempts: 3, Backoff: 10 * time.Millisecond})
}

func TestClientAgainstFake(t *testing.T) {
	f := fakescontrol.New(t, "n1", "n2")
	c := fastClient(f.Path)
	ctx := context.Background()

	if err := c.Drain(ctx, "n1", "tier0: daemon down"); err != nil {
		t.Fatal(err)
	}
	n, err := c.ShowNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !n.Drained() || n.Reason != "tier0: daemon down" || !n.OwnedByTier0() {
		t.Fatalf("after drain: %+v", n)
	}
	nodes, err := c.ShowNodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[1].Drained() {
		t.Fatalf("ShowNodes = %+v, %v", nodes, err)
	}
	if err := c.Resume(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(ctx, "n1"); !errors.Is(err, ErrInvalidState) {
		t.Errorf("resume of an idle node: %v, want ErrInvalidState", err)
	}
	if _, err := c.ShowNode(ctx, "nope"); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("show unknown node: %v, want ErrUnknownNode", err)
	}
	if err := c.Drain(ctx, "nope", "x"); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("drain unknown node: %v, want ErrUnknownNode", err)
	}
	if err := c.Drain(ctx, "n1", "  "); err == nil {
		t.Error("drain without reason succeeded")
	}
	if err := c.Down(ctx, "n2", "tier0: fenced"); err != nil {
		t.Fatal(err)
	}
	if st, r := f.Get("n2"); st != "DOWN" || r != "tier0: fenced" {
		t.Errorf("after down: %q %q", st, r)
	}
	// Non-retryable errors are not retried: exactly one call each.
	calls := len(f.Calls())
	_ = c.Resume(ctx, "nope")
	if got := len(f.Calls()) - calls; got != 1 {
		t.Errorf("unknown node was tried %d times, want 1", got)
	}
}

func TestClientRetriesWhenControllerAway(t *testing.T) {
	f := fakescontrol.New(t, "n1")
	c := fastClient(f.Path)
	f.FailNext(2)
	if err := c.Drain(context.Background(), "n1", "tier0: x"); err != nil {
		t.Fatalf("drain after 2 transient failures with 3 attempts: %v", err)
	}
	if got := len(f.Calls()); got != 3 {
		t.Errorf("calls = %d, want 3", got)
	}
	f.FailNext(5)
	err := c.Drain(context.Background(), "n1", "tier0: x")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Errorf("drain with controller away: %v, want ErrUnavailable after 3 attempts", err)
	}
}

func TestClientTimeout(t *testing.T) {
	f := fakescontrol.New(t, "n1")
	f.Hang("5")
	c := New(Options{Path: f.Path, Timeout: 150 * time.Millisecond, Attempts: 2, Backoff: 10 * time.Millisecond})
	start := time.Now()
	_, err := c.ShowNode(context.Background(), "n1")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("hung scontrol: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("two timed-out attempts took %v; the timeout did not kill scontrol", d)
	}
}

func TestClientMissingBinary(t *testing.T) {
	c := fastClient("/nonexistent/scontrol")
	_, err := c.ShowNode(context.Background(), "n1")
	if !errors.Is(err, ErrNoScontrol) {
		t.Errorf("missing scontrol: %v, want ErrNoScontrol", err)
	}
}

func FuzzParseShowNode(f *testing.F) {
	b, err := os.ReadFile("testdata/show-node-22.05.txt")
	if err != nil {
		f.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f.Add(l)
	}
	f.Add("NodeName=a State=DOWN+DRAIN Reason=x [u@t]")
	f.Fuzz(func(t *testing.T, s string) {
		nodes, err := ParseShowNode(s)
		if err != nil {
			return
		}
		for _, n := range nodes {
			if n.Name == "" || n.State == "" {
				t.Fatalf("parsed node without name or state from %q: %+v", s, n)
			}
			if n.OwnedByTier0() && !n.Unavailable() {
				t.Fatalf("owned but available: %+v", n)
			}
		}
	})
}
