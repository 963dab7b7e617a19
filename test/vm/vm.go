package vm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tier0/internal/testenv"
)

// Img is a built guest image.
type Img struct {
	Dir    string // holds vmlinux, vmlinuz, initramfs.img, KVER
	KVer   string // guest kernel version, e.g. 6.1.0-57-amd64
	Source string // test/vm in the source tree (scripts)
}

// Options describe one guest run.
type Options struct {
	// Script is the guest's /harness/run.sh (busybox ash). Its exit code is
	// the run's RC.
	Script string
	// Files are extra files placed in the share directory (seen by the guest
	// as /harness/NAME). Names may contain slashes.
	Files map[string][]byte
	// HostFwd lists guest TCP ports to expose on host 127.0.0.1; each gets a
	// free host port, see Guest.HostPort.
	HostFwd []int
	// Timeout bounds the whole run (boot, script, power-off); default 5 min.
	Timeout time.Duration
	// MemMB and SMP size the guest (defaults 1024 and 2).
	MemMB, SMP int
	// Append adds kernel command-line words (e.g. nvme_core.multipath=N).
	Append string
}

// Result is what a finished guest reported.
type Result struct {
	Output string        // serial console, including the script's output
	RC     int           // the script's exit code (HARNESS-RC)
	Wall   time.Duration // boot + run + power-off
	Dir    string        // share directory; the guest's /harness
}

// Guest is a running guest.
type Guest struct {
	t       testing.TB
	opts    Options
	dir     string
	fwd     map[int]int
	cmd     *exec.Cmd
	out     *syncBuf
	start   time.Time
	done    chan struct{}
	waitErr error
	unlock  func()
	once    sync.Once
	res     Result
	mu      sync.Mutex
	seq     int
}

var (
	imgMu    sync.Mutex
	imgCache = map[string]*Img{}
	imgErr   = map[string]error{}
)

// skip skips t, or fails it in CI (CI=true, see package testenv) or when
// TIER0_VM_REQUIRED=1: there the guest image is built by make test, and a
// failed build must not turn the interop suites into silent skips.
func skip(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("TIER0_VM_REQUIRED") == "1" {
		t.Fatalf("Linux test guest required (TIER0_VM_REQUIRED=1) but unavailable: %s", msg)
	}
	testenv.Missing(t, "Linux test guest unavailable: %s", msg)
}

// Available reports why a guest cannot run here, or "" when it can (the
// image may still fail to build).
func Available() string {
	if os.Geteuid() != 0 {
		return "needs root (image build uses dpkg -x/depmod, CI runs as root)"
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "qemu-system-x86_64 not found: install the packages in scripts/deps.d/vm.sh (make deps)"
	}
	return ""
}

// RepoRoot returns the tier0 module root above the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module tier0")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("tier0 module root (go.mod with 'module tier0') not found above the working directory")
		}
		dir = parent
	}
}

// Image builds the guest image once (cached in build/vm/img-<hash of the
// scripts> under the repository root; safe against concurrent builds from
// several test processes) and returns it. It skips t when a guest cannot
// run here.
func Image(t testing.TB) *Img {
	t.Helper()
	if why := Available(); why != "" {
		skip(t, "%s", why)
	}
	root, err := RepoRoot()
	if err != nil {
		skip(t, "%v", err)
	}
	src := filepath.Join(root, "test", "vm")
	h := sha256.New()
	for _, f := range []string{"build-initramfs.sh", "init"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			skip(t, "reading the guest build script: %v", err)
		}
		h.Write(b)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	imgMu.Lock()
	defer imgMu.Unlock()
	if img := imgCache[key]; img != nil {
		return img
	}
	if err := imgErr[key]; err != nil {
		skip(t, "%v", err)
	}
	img, err := buildImage(root, src, key)
	if err != nil {
		imgErr[key] = err
		skip(t, "%v", err)
	}
	imgCache[key] = img
	return img
}

func buildImage(root, src, key string) (*Img, error) {
	base := filepath.Join(root, "build", "vm")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return nil, err
	}
	unlock, err := flock(filepath.Join(base, "build.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	dir := filepath.Join(base, "img-"+key)
	img := func() (*Img, error) {
		kv, err := os.ReadFile(filepath.Join(dir, "KVER"))
		if err != nil {
			return nil, err
		}
		return &Img{Dir: dir, KVer: strings.TrimSpace(string(kv)), Source: src}, nil
	}
	if _, err := os.Stat(filepath.Join(dir, "ok")); err == nil {
		return img()
	}
	os.RemoveAll(dir)
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	cmd := exec.Command("bash", filepath.Join(src, "build-initramfs.sh"), tmp)
	cmd.Env = append(os.Environ(), "WORK="+filepath.Join(base, "work-"+key))
	out, err := cmd.CombinedOutput()
	os.RemoveAll(filepath.Join(base, "work-"+key, "rootfs"))
	if err != nil {
		return nil, fmt.Errorf("building the guest image with %s failed (%v); output tail:\n%s",
			filepath.Join(src, "build-initramfs.sh"), err, tail(string(out), 2000))
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	return img()
}

// flock takes an exclusive lock on path, blocking.
func flock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
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

// Start boots a guest running opts.Script and returns at once. The guest is
// killed (its whole process group) when the test ends if still running.
func Start(t testing.TB, opts Options) *Guest {
	t.Helper()
	img := Image(t)
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Minute
	}
	if opts.MemMB == 0 {
		opts.MemMB = 1024
	}
	if opts.SMP == 0 {
		opts.SMP = 2
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(opts.Script), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range opts.Files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	g := &Guest{t: t, opts: opts, dir: dir, fwd: map[int]int{}, out: &syncBuf{}, done: make(chan struct{})}
	var fwd []string
	for _, gp := range opts.HostFwd {
		hp := testenv.FreePort(t) // outside the ephemeral range: no outgoing connection takes it before QEMU binds it
		g.fwd[gp] = hp
		fwd = append(fwd, fmt.Sprintf("%d:%d", hp, gp))
	}
	root, _ := RepoRoot()
	unlock, err := flock(filepath.Join(root, "build", "vm", "run.lock"))
	if err != nil {
		t.Fatal(err)
	}
	g.unlock = unlock
	cmd := exec.Command("bash", filepath.Join(img.Source, "run-vm.sh"), dir)
	cmd.Env = append(os.Environ(),
		"IMG="+img.Dir,
		"HOSTFWD="+strings.Join(fwd, " "),
		"TIMEOUT="+strconv.Itoa(int(opts.Timeout/time.Second)+1),
		"MEM="+strconv.Itoa(opts.MemMB),
		"SMP="+strconv.Itoa(opts.SMP),
		"EXTRA_APPEND="+opts.Append,
	)
	cmd.Stdout, cmd.Stderr = g.out, g.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	g.start = time.Now()
	if err := cmd.Start(); err != nil {
		unlock()
		t.Fatalf("starting %s: %v", filepath.Join(img.Source, "run-vm.sh"), err)
	}
	g.cmd = cmd
	go func() {
		g.waitErr = cmd.Wait()
		close(g.done)
	}()
	t.Cleanup(func() {
		select {
		case <-g.done:
		default:
			// our own process group: run-vm.sh, timeout and qemu
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-g.done
		}
		g.unlock()
	})
	return g
}

// Dir is the share directory (the guest's /harness). The guest's console
// log goes to Dir()/out/console.log.
func (g *Guest) Dir() string { return g.dir }

// HostPort is the host loopback port forwarded to guest port p (listed in
// Options.HostFwd), or 0.
func (g *Guest) HostPort(p int) int { return g.fwd[p] }

// Output is the console output so far.
func (g *Guest) Output() string { return g.out.String() }

// WaitFile waits until the guest has written /harness/out/NAME (a signal
// from the guest script) and returns its content. A file that exists but is
// still empty is not written yet: a guest shell's `echo 0 > out/x.rc` creates
// the file before it writes it, so signal files must never be empty. It
// fails when the guest exits first or the timeout passes.
func (g *Guest) WaitFile(name string, timeout time.Duration) ([]byte, error) {
	p := filepath.Join(g.dir, "out", name)
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			return b, nil
		}
		select {
		case <-g.done:
			if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
				return b, nil
			}
			return nil, fmt.Errorf("guest exited before writing /harness/out/%s; console tail:\n%s", name, tail(g.Output(), 3000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("guest did not write /harness/out/%s within %v; console tail:\n%s", name, timeout, tail(g.Output(), 3000))
		}
	}
}

// Signal creates /harness/NAME with data, for a guest script waiting on it
// (e.g. `while [ ! -e /harness/go ]; do sleep 0.2; done`).
func (g *Guest) Signal(name string, data []byte) error {
	p := filepath.Join(g.dir, name)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// ServeLoop is a guest shell snippet: a script that ends with it keeps the
// guest up and runs the commands the test sends with Guest.Exec, until
// Guest.Stop. Its exit status is 0.
const ServeLoop = `
harness_serve() {
    mkdir -p /harness/cmd /harness/out
    while [ ! -e /harness/stop ]; do
        for f in /harness/cmd/*.sh; do
            [ -e "$f" ] || continue
            n=$(basename "$f" .sh)
            [ -e "/harness/out/$n.rc" ] && continue
            sh "$f" > "/harness/out/$n.log" 2>&1
            echo $? > "/harness/out/$n.rc.tmp" && mv "/harness/out/$n.rc.tmp" "/harness/out/$n.rc"
        done
        sleep 0.1
    done
}
harness_serve
`

// Exec runs a shell command in a guest whose script ended with ServeLoop
// and returns its combined output and exit code.
func (g *Guest) Exec(command string, timeout time.Duration) (string, int, error) {
	g.mu.Lock()
	g.seq++
	n := fmt.Sprintf("c%04d", g.seq)
	g.mu.Unlock()
	if err := os.MkdirAll(filepath.Join(g.dir, "cmd"), 0o755); err != nil {
		return "", -1, err
	}
	if err := g.Signal(filepath.Join("cmd", n+".sh"), []byte(command+"\n")); err != nil {
		return "", -1, err
	}
	rc, err := g.WaitFile(n+".rc", timeout)
	out, _ := os.ReadFile(filepath.Join(g.dir, "out", n+".log"))
	if err != nil {
		return string(out), -1, fmt.Errorf("guest command %q: %w", command, err)
	}
	code, _ := strconv.Atoi(strings.TrimSpace(string(rc)))
	return string(out), code, nil
}

// MustExec is Exec that fails the test on a harness error or a non-zero
// exit code.
func (g *Guest) MustExec(command string, timeout time.Duration) string {
	g.t.Helper()
	out, rc, err := g.Exec(command, timeout)
	if err != nil {
		g.t.Fatal(err)
	}
	if rc != 0 {
		g.t.Fatalf("guest command %q exited %d:\n%s", command, rc, out)
	}
	return out
}

// Stop tells a ServeLoop guest to finish.
func (g *Guest) Stop() error { return g.Signal("stop", []byte("stop\n")) }

var rcRE = regexp.MustCompile(`HARNESS-RC=(\d+)`)

// Wait waits for the guest to power off and returns what it reported. It
// fails the test when the guest never reported an exit code (timeout,
// kernel panic, qemu failure).
func (g *Guest) Wait() Result {
	g.t.Helper()
	<-g.done
	g.once.Do(func() {
		out := g.out.String()
		g.res = Result{Output: out, Wall: time.Since(g.start), Dir: g.dir, RC: -1}
		if m := rcRE.FindAllStringSubmatch(out, -1); len(m) > 0 {
			g.res.RC, _ = strconv.Atoi(m[len(m)-1][1])
		}
		g.unlock()
		g.unlock = func() {}
	})
	if g.res.RC < 0 {
		g.t.Fatalf("guest reported no HARNESS-RC (run-vm.sh: %v, timeout %v); console tail:\n%s", g.waitErr, g.opts.Timeout, tail(g.res.Output, 4000))
	}
	return g.res
}

// Run boots a guest, runs opts.Script to completion and returns the result.
func Run(t testing.TB, opts Options) Result {
	t.Helper()
	return Start(t, opts).Wait()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
