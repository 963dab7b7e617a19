package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tier0/internal/fakescontrol"
)

func run(t *testing.T, jsonOut bool, args ...string) (string, error) {
	t.Helper()
	cmd := Command(&jsonOut)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestVerbs(t *testing.T) {
	fake := fakescontrol.New(t, "n1")
	body := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if body == "" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "slurm.yaml")
	text := "api: " + srv.URL + "\nscontrol: " + fake.Path + "\nstate_dir: " + dir + "/state\njob_log: " + dir +
		"/jobs.log\nmetrics_dir: " + dir + "/m\nhook_log: " + dir + "/hooks.log\nsys_block: " + dir + "/sys\nnodes: {n1: {tier0: A}}\n"
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLURM_JOB_ID", "5")

	out, err := run(t, false, "healthcheck", "--config", cfg, "--node", "n1")
	if err != nil || !strings.Contains(out, "n1 (A): failed daemon down -> drain") {
		t.Fatalf("healthcheck with daemon down: %q %v", out, err)
	}
	if st, r := fake.Get("n1"); st != "IDLE+DRAIN" || r != "tier0: daemon down" {
		t.Errorf("n1 %q %q", st, r)
	}

	_, err = run(t, false, "prolog", "--config", cfg, "--node", "n1")
	var ec interface{ ExitCode() int }
	if !errors.As(err, &ec) || ec.ExitCode() != 1 || !strings.Contains(err.Error(), "tier0: prolog job 5: daemon down") {
		t.Errorf("prolog with daemon down: %v, want exit 1 with the reason", err)
	}

	body = `{"node":"A","daemon":"ok","fenced":false,"lease":"held","drives_missing":[],"arrays":[],"rebuild_active":false,"redundant":true}`
	out, err = run(t, true, "healthcheck", "--config", cfg, "--node", "n1")
	var res struct{ Action, Verdict string }
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Action != "resume" || res.Verdict != "healthy" {
		t.Fatalf("healthcheck --json when healthy: %q %v", out, err)
	}
	if _, err := run(t, false, "prolog", "--config", cfg, "--node", "n1"); err != nil {
		t.Errorf("prolog when healthy: %v", err)
	}
	out, err = run(t, true, "epilog", "--config", cfg, "--node", "n1")
	if err != nil || !strings.Contains(out, `"job_id":"5"`) {
		t.Errorf("epilog: %q %v", out, err)
	}
	// The epilog never fails, even without a usable configuration.
	if _, err := run(t, false, "epilog", "--config", filepath.Join(dir, "missing.yaml"), "--node", "n1"); err != nil {
		t.Errorf("epilog with a missing config: %v, want exit 0", err)
	}
	if _, err := run(t, false, "healthcheck", "--config", cfg, "--node", ""); err == nil {
		t.Error("healthcheck without a node name succeeded")
	}
	if b, err := os.ReadFile(filepath.Join(dir, "hooks.log")); err != nil || !strings.Contains(string(b), "hook=prolog") {
		t.Errorf("hook log: %q %v", b, err)
	}
}
