package vm

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWaitFileWaitsForContent: a guest shell's `echo 0 > out/x.rc` creates
// the file before it writes it, and the share can show the empty file in
// between. WaitFile must not return that empty moment as the file's content
// (CI once failed a fio run that had passed, reading rc "").
func TestWaitFileWaitsForContent(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	g := &Guest{t: t, dir: dir, out: &syncBuf{}, done: make(chan struct{})}
	p := filepath.Join(dir, "out", "job.rc")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		os.WriteFile(p, []byte("0\n"), 0o644)
	}()
	b, err := g.WaitFile("job.rc", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "0\n" {
		t.Fatalf("WaitFile returned %q, want the content the guest wrote (%q)", b, "0\n")
	}
}

// TestWaitFileEmptyAtExit: a file that is still empty when the guest exits
// is reported as not written, not as empty content.
func TestWaitFileEmptyAtExit(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "out"), 0o755)
	g := &Guest{t: t, dir: dir, out: &syncBuf{}, done: make(chan struct{})}
	os.WriteFile(filepath.Join(dir, "out", "job.rc"), nil, 0o644)
	close(g.done)
	if b, err := g.WaitFile("job.rc", 10*time.Second); err == nil {
		t.Fatalf("WaitFile returned %q and no error for a file the guest never wrote", b)
	}
}
