package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReportVerb(t *testing.T) {
	out := t.TempDir()
	var buf bytes.Buffer
	root := newRootCmd()
	root.SetOut(&buf)
	root.SetArgs([]string{"report", filepath.Join("..", "..", "reports", "testdata", "minimal.json"), "--out", out})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if s := buf.String(); !strings.Contains(s, "SIDE BY SIDE WITH THE SEED") || !strings.Contains(s, "NOT RUN") {
		t.Fatalf("tables missing from the output:\n%s", s)
	}
	for _, f := range []string{"report.html", "report.md", "img/efficiency.png"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}
