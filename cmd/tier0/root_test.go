package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestEachRunBuildsAFreshTree: what one run's flags set does not reach
// the next run. cobra keeps parsed flag values in the command tree; with
// one global tree the tests had to reset every flag by hand between runs.
func TestEachRunBuildsAFreshTree(t *testing.T) {
	url := serveFake(t, newFakeBackend())
	out, errOut, code := runCLI(t, nil, "events", "--api", url, "--json", "--after", "11", "--last", "1")
	if code != 0 || !strings.HasPrefix(out, "[") || !strings.Contains(out, "rebuild-start") {
		t.Fatalf("events --json --after 11: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, nil, "events", "--api", url)
	if code != 0 || strings.HasPrefix(out, "[") {
		t.Fatalf("events after a --json run: exit %d, stderr %q; want a table, got:\n%s", code, errOut, out)
	}
	mustContain(t, out, "REV", "assign", "node-lost", "failover", "rebuild-start")

	_, _, code = runCLI(t, nil, "status", "--site", "/nonexistent/site.yaml")
	if code != 1 {
		t.Fatalf("status --site /nonexistent: exit %d, want 1", code)
	}
	out, errOut, code = runCLI(t, nil, "status", "--api", url)
	if code != 0 {
		t.Fatalf("status --api after a --site run: exit %d (the --site of the run before stuck?), stderr:\n%s", code, errOut)
	}
	mustContain(t, out, "cluster view from node A")

	// Two trees built side by side share no option.
	a, b := newRootCmd(), newRootCmd()
	var ao, bo bytes.Buffer
	a.SetOut(&ao)
	b.SetOut(&bo)
	a.SetArgs([]string{"--json", "version"})
	b.SetArgs([]string{"version"})
	if err := a.Execute(); err != nil {
		t.Fatal(err)
	}
	if err := b.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ao.String(), "{") || strings.HasPrefix(bo.String(), "{") {
		t.Fatalf("--json of one tree reached the other: %q, %q", ao.String(), bo.String())
	}
}
