package main

import (
	"os"
	"strings"
	"testing"
)

// runCampaignCLI runs `tier0 campaign args...` on a fresh command tree.
func runCampaignCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return runCLI(t, nil, append([]string{"campaign"}, args...)...)
}

func TestCampaignNemesisFlags(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--site", "../../reliability/campaign/testdata/local5.yaml", "--local", "--tier0d", exe}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nemesis", "kill,meteor"}, `nemesis kind "meteor" unknown`},
		{[]string{"--nemesis", "network", "--runs", "0"}, "--runs 0: want at least 1"},
		{[]string{"--runs", "2", "--short"}, "excludes --netns, --short and --faults"},
		{[]string{"--nemesis=kill", "--faults", "kill-owner"}, "excludes"},
	} {
		_, errOut, code := runCampaignCLI(t, append(slicesClone(base), tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("campaign %v: exit %d, stderr %q; want exit 2 saying %q", tc.args, code, errOut, tc.want)
		}
	}
	out, _, code := runCampaignCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "--nemesis") || !strings.Contains(out, "--runs") || !strings.Contains(out, "power-loss") || !strings.Contains(out, "--past-stuck") {
		t.Fatalf("help (exit %d) does not describe the nemesis:\n%s", code, out)
	}
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }
