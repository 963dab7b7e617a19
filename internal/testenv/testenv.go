package testenv

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"tier0/internal/gobuild"
)

// InCI reports whether the tests run in CI: CI set to a true value (CI=true
// is what CI systems, and .ci/run's caller, set), or TIER0_REQUIRE_ALL=1
// for a developer who wants CI's strictness.
func InCI() bool {
	if os.Getenv("TIER0_REQUIRE_ALL") == "1" {
		return true
	}
	switch strings.ToLower(os.Getenv("CI")) {
	case "1", "true", "yes":
		return true
	}
	return false
}

// Missing ends t because a prerequisite is missing: it skips with the
// reason on a developer's machine and fails in CI, where `make test`
// provides every prerequisite. Use it only for what CI provides (root, the
// packages of scripts/deps.d, the guest image, namespaces, loop devices),
// never for properties of the kernel or hardware that CI may lack too.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("required in CI (CI=true) but missing: %s", msg)
	}
	t.Skip(msg)
}

// Binaries builds the module's commands tier0/cmd/NAME into t's temporary
// folder with gobuild.BuildBinaries and returns their paths in the order
// of names. A missing go tool is a missing prerequisite (Missing); a build
// that fails fails t.
func Binaries(t testing.TB, names ...string) []string {
	t.Helper()
	paths, err := gobuild.BuildBinaries(t.TempDir(), names...)
	if errors.Is(err, gobuild.ErrNoGo) {
		Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return paths
}
