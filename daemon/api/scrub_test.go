package api

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// scrubFake is a Backend that also scrubs.
type scrubFake struct {
	*fakeBackend
	scrubs []string
}

func (f *scrubFake) ScrubArray(_ context.Context, name string, repair bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.m.Array(name); !ok {
		return fmt.Errorf("array %q: %w", name, ErrNotFound)
	}
	f.scrubs = append(f.scrubs, fmt.Sprintf("%s repair=%v", name, repair))
	return nil
}

func TestScrubEndpoint(t *testing.T) {
	f := &scrubFake{fakeBackend: newFake(t)}
	s, err := NewServer(ServerOptions{Backend: f, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	ts := newHTTPTest(t, s)
	ctx := t.Context()
	if err := NewClient(ts, "", nil).ScrubArray(ctx, "a", false); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("scrub without the token: %v, want ErrUnauthorized", err)
	}
	good := NewClient(ts, token, nil)
	if err := good.ScrubArray(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	if err := good.ScrubArray(ctx, "b", true); err != nil {
		t.Fatal(err)
	}
	if err := good.ScrubArray(ctx, "zz", false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("scrub of an unknown array: %v, want ErrNotFound", err)
	}
	if want := []string{"a repair=false", "b repair=true"}; !slices.Equal(f.scrubs, want) {
		t.Fatalf("backend scrubs %v, want %v", f.scrubs, want)
	}
	if err := good.do(ctx, "POST", "/v1/arrays/a/scrub?repair=maybe", true, nil); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), `repair="maybe"`) {
		t.Fatalf("repair=maybe: %v, want ErrBadRequest naming the value", err)
	}

	// A backend that cannot scrub has no such endpoint.
	plain, err := NewServer(ServerOptions{Backend: newFake(t), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	if err := NewClient(newHTTPTest(t, plain), token, nil).ScrubArray(ctx, "a", false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("scrub on a backend without Scrubber: %v, want ErrNotFound", err)
	}
}

func TestFailedAndScrubMetrics(t *testing.T) {
	m := NewMetrics()
	m.SetArrayFailed("a", true)
	m.SetArrayFailed("b", false)
	m.SetScrub("a", ScrubStatus{Mismatches: 3, Finished: time.Unix(1700000000, 0)})
	m.SetScrub("b", ScrubStatus{Running: true, Mismatches: 9})
	f := newFake(t)
	s, err := NewServer(ServerOptions{Backend: f, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	text, err := NewClient(newHTTPTest(t, s), "", nil).Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`tier0_array_failed{array="a"} 1`, `tier0_array_failed{array="b"} 0`,
		`tier0_scrub_mismatches{array="a"} 3`, `tier0_scrub_last_finished_seconds{array="a"} 1.7e+09`} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(text, `tier0_scrub_mismatches{array="b"}`) {
		t.Error("a running scrub's partial count was published as the last scrub's")
	}
}

func newHTTPTest(t *testing.T, s *Server) string {
	t.Helper()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}
