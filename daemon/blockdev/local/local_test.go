package local

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"tier0/daemon/blockdev"
	"tier0/internal/testenv"
)

// diskDir returns a temporary directory on a disk-backed file system
// (O_DIRECT needs one; tmpfs refuses it): $TIER0_TEST_DIR or /var/tmp.
func diskDir(t testing.TB) string {
	t.Helper()
	base := os.Getenv("TIER0_TEST_DIR")
	if base == "" {
		base = "/var/tmp"
	}
	dir, err := os.MkdirTemp(base, "tier0-local-test-")
	if err != nil {
		t.Skipf("no disk-backed temp dir under %s (set TIER0_TEST_DIR): %v", base, err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func openFile(t testing.TB, size int64, o Options) *Device {
	t.Helper()
	o.Size, o.Create = size, true
	d, err := Open(filepath.Join(diskDir(t), "sub", "dev.img"), o)
	if errors.Is(err, ErrNoDirectIO) {
		t.Skipf("temp dir refuses O_DIRECT: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func pattern(n int, seed int64) []byte {
	p := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(p)
	return p
}

// roundTrip exercises a device the same way whatever backs it.
func roundTrip(t *testing.T, d blockdev.Device) {
	bs := d.BlockSize()
	// Aligned buffers.
	w := blockdev.AlignedBuffer(16 * bs)
	copy(w, pattern(len(w), 1))
	if _, err := d.WriteAt(w, int64(4*bs)); err != nil {
		t.Fatal(err)
	}
	r := blockdev.AlignedBuffer(16 * bs)
	if _, err := d.ReadAt(r, int64(4*bs)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r, w) {
		t.Fatal("aligned round trip differs")
	}
	// Unaligned user buffers go through bounce buffers, also when larger
	// than one bounce buffer.
	n := bounceSize + 3*bs
	raw := make([]byte, n+1)
	uw := raw[1:]
	copy(uw, pattern(n, 2))
	if _, err := d.WriteAt(uw, int64(64*bs)); err != nil {
		t.Fatal(err)
	}
	rraw := make([]byte, n+7)
	ur := rraw[7:]
	if got, err := d.ReadAt(ur, int64(64*bs)); err != nil || got != n {
		t.Fatalf("unaligned read: %d, %v", got, err)
	}
	if !bytes.Equal(ur, uw) {
		t.Fatal("unaligned round trip differs")
	}
	// FUA write and flush.
	if _, err := d.(blockdev.FUAWriter).WriteAtFUA(uw[:bs], 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	// Zeroes and discard read back as zeroes, and touch nothing else.
	if err := d.WriteZeroes(int64(5*bs), int64(2*bs)); err != nil {
		t.Fatal(err)
	}
	if err := d.Discard(int64(10*bs), int64(3*bs)); err != nil {
		t.Fatal(err)
	}
	d.ReadAt(r, int64(4*bs))
	want := append([]byte(nil), w...)
	clear(want[bs : 3*bs])
	clear(want[6*bs : 9*bs])
	if !bytes.Equal(r, want) {
		t.Fatal("after zeroes/discard: content differs")
	}
	// Misaligned and out-of-range requests fail and touch nothing.
	if _, err := d.WriteAt(make([]byte, bs), int64(bs/2)); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Fatalf("misaligned offset: %v", err)
	}
	if _, err := d.ReadAt(make([]byte, bs+1), 0); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Fatalf("misaligned length: %v", err)
	}
	if _, err := d.WriteAt(make([]byte, 2*bs), d.Size()-int64(bs)); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Fatalf("past the end: %v", err)
	}
	if err := d.WriteZeroes(d.Size(), int64(bs)); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Fatalf("zeroes past the end: %v", err)
	}
	if _, err := d.ReadAt(nil, d.Size()); err != nil {
		t.Fatalf("zero-length read at the end: %v", err)
	}
	// The last block is usable.
	if _, err := d.WriteAt(w[:bs], d.Size()-int64(bs)); err != nil {
		t.Fatal(err)
	}
}

func TestFileRoundTrip(t *testing.T) {
	d := openFile(t, 8<<20, Options{})
	if d.BlockSize() != 4096 || d.Size() != 8<<20 || !d.Direct() || d.IsBlockDevice() {
		t.Fatalf("block size %d size %d direct %v block %v", d.BlockSize(), d.Size(), d.Direct(), d.IsBlockDevice())
	}
	roundTrip(t, d)
}

func TestEngines(t *testing.T) {
	d := openFile(t, 4<<20, Options{})
	if d.Engine() != "aio" {
		t.Errorf("default engine %q, want aio", d.Engine())
	}
	s := openFile(t, 4<<20, Options{SyncIO: true})
	if s.Engine() != "sync" {
		t.Fatalf("SyncIO engine %q, want sync", s.Engine())
	}
	roundTrip(t, s)
}

func TestFile512(t *testing.T) {
	d := openFile(t, 4<<20, Options{BlockSize: 512})
	if d.BlockSize() != 512 {
		t.Fatalf("block size %d", d.BlockSize())
	}
	roundTrip(t, d)
}

func TestConcurrent(t *testing.T) {
	d := openFile(t, 4<<20, Options{MaxInFlight: 4})
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			off := int64(g) * 64 << 10
			w := pattern(64<<10, int64(g))
			r := make([]byte, 64<<10)
			for i := 0; i < 8; i++ {
				if _, err := d.WriteAt(w, off); err != nil {
					t.Error(err)
					return
				}
				if _, err := d.ReadAt(r, off); err != nil || !bytes.Equal(r, w) {
					t.Errorf("goroutine %d: read back differs (%v)", g, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestReopenKeepsData(t *testing.T) {
	path := filepath.Join(diskDir(t), "keep.img")
	d, err := Open(path, Options{Size: 1 << 20, Create: true})
	if errors.Is(err, ErrNoDirectIO) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	w := pattern(8192, 5)
	d.WriteAt(w, 8192)
	d.Flush()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadAt(make([]byte, 4096), 0); !errors.Is(err, blockdev.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if err := d.Close(); !errors.Is(err, blockdev.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	d, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Size() != 1<<20 {
		t.Fatalf("size after reopen %d", d.Size())
	}
	r := make([]byte, 8192)
	d.ReadAt(r, 8192)
	if !bytes.Equal(r, w) {
		t.Fatal("data lost across reopen")
	}
	// A file smaller than the configured size is not silently used.
	if _, err := Open(path, Options{Size: 2 << 20}); err == nil || !strings.Contains(err.Error(), "smaller than the configured size") {
		t.Fatalf("short file: %v", err)
	}
}

func TestTmpfsRefusesDirectIO(t *testing.T) {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Skip("/dev/shm is not a tmpfs here")
	}
	dir, err := os.MkdirTemp("/dev/shm", "tier0-local-test-")
	if err != nil {
		t.Skip(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "x.img")
	d0, err := Open(path, Options{Size: 1 << 20, Create: true})
	if err == nil {
		d0.Close()
		t.Skip("this kernel's tmpfs accepts O_DIRECT (Linux 6.6 and later)")
	}
	if !errors.Is(err, ErrNoDirectIO) || !strings.Contains(err.Error(), "/var/tmp") {
		t.Fatalf("want ErrNoDirectIO with advice, got %v", err)
	}
	d, err := Open(path, Options{Size: 1 << 20, Create: true, AllowBuffered: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Direct() {
		t.Fatal("Direct() = true on tmpfs")
	}
	roundTrip(t, d)
}

func TestNotADevice(t *testing.T) {
	if _, err := Open(diskDir(t), Options{}); err == nil || !strings.Contains(err.Error(), "not a block device or regular file") {
		t.Fatalf("directory: %v", err)
	}
	if _, err := Open(filepath.Join(diskDir(t), "missing"), Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// TestLoopDevice runs the round trip on a real block device: a loop device
// over a file (root and losetup needed).
func TestLoopDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "loop devices need root; run the tests as root (make test does)")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		testenv.Missing(t, "losetup not installed (util-linux; scripts/deps.d/base.sh installs it)")
	}
	for _, sector := range []int{512, 4096} {
		img := filepath.Join(diskDir(t), "loop.img")
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 8<<20); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("losetup", "--find", "--show", "--sector-size", itoa(sector), img).CombinedOutput()
		if err != nil {
			testenv.Missing(t, "losetup cannot attach a loop device here: %v: %s", err, out)
		}
		loop := strings.TrimSpace(string(out))
		t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
		d, err := Open(loop, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !d.IsBlockDevice() || d.BlockSize() != sector || d.Size() != 8<<20 {
			t.Fatalf("%s: block %v block size %d size %d, want block device, %d, %d", loop, d.IsBlockDevice(), d.BlockSize(), d.Size(), sector, 8<<20)
		}
		t.Run(itoa(sector), func(t *testing.T) { roundTrip(t, d) })
		d.Close()
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestWrappersOverLocal stacks the test wrappers on a real device: the
// recorder sees the FUA write the fault layer passes through, and a fault
// rule keeps a write off the medium.
func TestWrappersOverLocal(t *testing.T) {
	d := openFile(t, 1<<20, Options{})
	f := blockdev.NewFault(d)
	r := blockdev.NewRecorder(f)
	f.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: 8192, Len: 4096, Action: blockdev.Fail})
	buf := blockdev.AlignedBuffer(4096)
	copy(buf, pattern(4096, 9))
	r.WriteAtFUA(buf, 0)
	r.WriteAt(buf, 8192)
	r.Flush()
	want := "write-fua off=0 len=4096\nwrite off=8192 len=4096 err=injected fault on write off=8192 len=4096: I/O error\nflush\n"
	if got := r.String(); got != want {
		t.Fatalf("record:\n%s\nwant:\n%s", got, want)
	}
	got := make([]byte, 4096)
	d.ReadAt(got, 8192)
	if !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("a failed write reached the medium")
	}
	d.ReadAt(got, 0)
	if !bytes.Equal(got, buf) {
		t.Fatal("FUA write lost")
	}
}
