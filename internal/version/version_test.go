package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	old := [3]string{Version, Commit, Date}
	defer func() { Version, Commit, Date = old[0], old[1], old[2] }()
	Version, Commit, Date = "v1.2.3", "abc123", "2026-11-29T00:00:00Z"
	want := "tier0 v1.2.3 (commit abc123, built 2026-11-29T00:00:00Z, " + runtime.Version() + ")"
	if got := String(); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	Version, Commit, Date = "dev", "", ""
	if got := String(); !strings.HasPrefix(got, "tier0 ") || !strings.HasSuffix(got, runtime.Version()+")") {
		t.Fatalf("String() = %q", got)
	}
}
