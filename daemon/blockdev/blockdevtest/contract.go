package blockdevtest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// Options tune the suite to a device's documented exceptions.
type Options struct {
	// NoClose skips the after-Close checks (a device whose Close belongs to
	// someone else, or that documents another behaviour).
	NoClose bool
	// Concurrency is the number of goroutines of the concurrent test
	// (default 8).
	Concurrency int
	// MaxIO bounds the largest request the suite issues (default 256 KiB).
	MaxIO int
}

// Open makes a fresh device for one subtest: at least 1 MiB, every byte
// zero (or never written). The suite closes it (unless Options.NoClose);
// Open registers any other cleanup with t.Cleanup.
type Open func(t *testing.T) blockdev.Device

// Run runs the contract suite against devices made by open.
func Run(t *testing.T, open Open, o Options) {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.MaxIO <= 0 {
		o.MaxIO = 256 << 10
	}
	tests := []struct {
		name string
		fn   func(*testing.T, blockdev.Device, Options)
	}{
		{"Geometry", testGeometry},
		{"RoundTrip", testRoundTrip},
		{"Misaligned", testMisaligned},
		{"OutOfRange", testOutOfRange},
		{"ZeroLength", testZeroLength},
		{"BufferOwnership", testBufferOwnership},
		{"Zeroes", testZeroes},
		{"FlushAndFUA", testFlushAndFUA},
		{"Concurrent", testConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := open(t)
			if !o.NoClose {
				defer d.Close()
			}
			tc.fn(t, d, o)
		})
	}
	if !o.NoClose {
		t.Run("Closed", func(t *testing.T) { testClosed(t, open(t)) })
	}
}

// pattern fills p with bytes derived from seed, so that two writes of the
// same range with different seeds differ everywhere.
func pattern(p []byte, seed int64) []byte {
	r := rand.New(rand.NewSource(seed))
	r.Read(p)
	return p
}

func buf(n int) []byte { return blockdev.AlignedBuffer(n) }

func mustWrite(t *testing.T, d blockdev.Device, p []byte, off int64) {
	t.Helper()
	n, err := d.WriteAt(p, off)
	if err != nil || n != len(p) {
		t.Fatalf("WriteAt(%d bytes at %d) = %d, %v; want %d, nil", len(p), off, n, err, len(p))
	}
}

func mustRead(t *testing.T, d blockdev.Device, n int, off int64) []byte {
	t.Helper()
	p := buf(n)
	got, err := d.ReadAt(p, off)
	if err != nil || got != n {
		t.Fatalf("ReadAt(%d bytes at %d) = %d, %v; want %d, nil", n, off, got, err, n)
	}
	return p
}

func testGeometry(t *testing.T, d blockdev.Device, _ Options) {
	bs := d.BlockSize()
	if bs != 512 && bs != 4096 {
		t.Errorf("BlockSize() = %d, want 512 or 4096", bs)
	}
	if sz := d.Size(); sz <= 0 || sz%int64(bs) != 0 {
		t.Errorf("Size() = %d, want a positive multiple of the block size %d", sz, bs)
	}
	if d.Size() < 1<<20 {
		t.Fatalf("Size() = %d: the suite needs a device of at least 1 MiB", d.Size())
	}
}

func testRoundTrip(t *testing.T, d blockdev.Device, o Options) {
	bs := int64(d.BlockSize())
	size := d.Size()
	n := int64(min(o.MaxIO, 64<<10))
	for i, off := range []int64{0, bs, size/2 - bs, size - n, size - bs} {
		l := min(n, size-off)
		p := pattern(buf(int(l)), int64(i+1))
		mustWrite(t, d, p, off)
		if got := mustRead(t, d, int(l), off); !bytes.Equal(got, p) {
			t.Errorf("%d bytes at %d read back differently from what was written", l, off)
		}
	}
	// A large request spanning several chunks/stripes, read in pieces.
	big := int64(o.MaxIO) / bs * bs
	off := size / 4 / bs * bs
	p := pattern(buf(int(big)), 99)
	mustWrite(t, d, p, off)
	for piece := int64(0); piece < big; piece += big / 4 {
		if got := mustRead(t, d, int(big/4), off+piece); !bytes.Equal(got, p[piece:piece+big/4]) {
			t.Errorf("piece at %d of a %d-byte write at %d reads back differently", piece, big, off)
		}
	}
}

// untouched checks that [off, off+len(want)) still holds want.
func untouched(t *testing.T, d blockdev.Device, want []byte, off int64, what string) {
	t.Helper()
	if got := mustRead(t, d, len(want), off); !bytes.Equal(got, want) {
		t.Errorf("%s changed the device at %d", what, off)
	}
}

func testMisaligned(t *testing.T, d blockdev.Device, _ Options) {
	bs := int64(d.BlockSize())
	before := pattern(buf(int(4*bs)), 7)
	mustWrite(t, d, before, 0)
	junk := pattern(make([]byte, 4*bs), 8)
	for _, c := range []struct {
		off int64
		n   int64
	}{{1, bs}, {bs / 2, bs}, {0, bs + 1}, {0, bs - 1}, {bs, 3}} {
		if _, err := d.WriteAt(junk[:c.n], c.off); !errors.Is(err, blockdev.ErrMisaligned) {
			t.Errorf("WriteAt(%d bytes at %d) = %v, want ErrMisaligned", c.n, c.off, err)
		}
		if _, err := d.ReadAt(make([]byte, c.n), c.off); !errors.Is(err, blockdev.ErrMisaligned) {
			t.Errorf("ReadAt(%d bytes at %d) = %v, want ErrMisaligned", c.n, c.off, err)
		}
		if err := d.WriteZeroes(c.off, c.n); !errors.Is(err, blockdev.ErrMisaligned) {
			t.Errorf("WriteZeroes(%d, %d) = %v, want ErrMisaligned", c.off, c.n, err)
		}
		if err := d.Discard(c.off, c.n); !errors.Is(err, blockdev.ErrMisaligned) {
			t.Errorf("Discard(%d, %d) = %v, want ErrMisaligned", c.off, c.n, err)
		}
	}
	untouched(t, d, before, 0, "a misaligned request")
}

func testOutOfRange(t *testing.T, d blockdev.Device, _ Options) {
	bs := int64(d.BlockSize())
	size := d.Size()
	last := pattern(buf(int(bs)), 11)
	mustWrite(t, d, last, size-bs)
	for _, c := range []struct {
		off int64
		n   int64
	}{{size, bs}, {size - bs, 2 * bs}, {size + 8*bs, bs}, {-bs, bs}} {
		if _, err := d.WriteAt(buf(int(c.n)), c.off); !errors.Is(err, blockdev.ErrOutOfRange) {
			t.Errorf("WriteAt(%d bytes at %d) on a %d-byte device = %v, want ErrOutOfRange", c.n, c.off, size, err)
		}
		if _, err := d.ReadAt(buf(int(c.n)), c.off); !errors.Is(err, blockdev.ErrOutOfRange) {
			t.Errorf("ReadAt(%d bytes at %d) on a %d-byte device = %v, want ErrOutOfRange", c.n, c.off, size, err)
		}
		if err := d.WriteZeroes(c.off, c.n); !errors.Is(err, blockdev.ErrOutOfRange) {
			t.Errorf("WriteZeroes(%d, %d) on a %d-byte device = %v, want ErrOutOfRange", c.off, c.n, size, err)
		}
		if err := d.Discard(c.off, c.n); !errors.Is(err, blockdev.ErrOutOfRange) {
			t.Errorf("Discard(%d, %d) on a %d-byte device = %v, want ErrOutOfRange", c.off, c.n, size, err)
		}
	}
	untouched(t, d, last, size-bs, "an out-of-range request")
}

func testZeroLength(t *testing.T, d blockdev.Device, _ Options) {
	if n, err := d.WriteAt(nil, 0); n != 0 || err != nil {
		t.Errorf("WriteAt(nil, 0) = %d, %v; want 0, nil", n, err)
	}
	if n, err := d.ReadAt(nil, 0); n != 0 || err != nil {
		t.Errorf("ReadAt(nil, 0) = %d, %v; want 0, nil", n, err)
	}
	if err := d.WriteZeroes(0, 0); err != nil {
		t.Errorf("WriteZeroes(0, 0) = %v, want nil", err)
	}
	if err := d.Discard(0, 0); err != nil {
		t.Errorf("Discard(0, 0) = %v, want nil", err)
	}
}

func testBufferOwnership(t *testing.T, d blockdev.Device, _ Options) {
	bs := d.BlockSize()
	p := pattern(buf(4*bs), 21)
	keep := bytes.Clone(p)
	mustWrite(t, d, p, 0)
	if !bytes.Equal(p, keep) {
		t.Error("WriteAt wrote into the caller's buffer")
	}
	// The device must not keep p: changing it now must not change the data.
	pattern(p, 22)
	if got := mustRead(t, d, 4*bs, 0); !bytes.Equal(got, keep) {
		t.Error("changing the buffer after WriteAt returned changed the device: the device kept the caller's buffer")
	}
	// Unaligned memory (not from AlignedBuffer) works too.
	raw := make([]byte, 4*bs+1)[1:]
	copy(raw, keep)
	mustWrite(t, d, raw, int64(8*bs))
	got := make([]byte, 4*bs+3)[3:]
	if n, err := d.ReadAt(got, int64(8*bs)); err != nil || n != len(got) || !bytes.Equal(got, keep) {
		t.Errorf("a write and read through unaligned memory: n %d, err %v, equal %v", n, err, bytes.Equal(got, keep))
	}
}

func testZeroes(t *testing.T, d blockdev.Device, _ Options) {
	bs := int64(d.BlockSize())
	p := pattern(buf(int(16*bs)), 31)
	mustWrite(t, d, p, 0)
	if err := d.WriteZeroes(2*bs, 4*bs); err != nil {
		t.Fatalf("WriteZeroes: %v", err)
	}
	if err := d.Discard(10*bs, 2*bs); err != nil {
		t.Fatalf("Discard: %v", err)
	}
	got := mustRead(t, d, int(16*bs), 0)
	want := bytes.Clone(p)
	clear(want[2*bs : 6*bs])
	clear(want[10*bs : 12*bs])
	for b := int64(0); b < 16; b++ {
		if !bytes.Equal(got[b*bs:(b+1)*bs], want[b*bs:(b+1)*bs]) {
			t.Errorf("block %d after WriteZeroes [2,6) and Discard [10,12): wrong content (zeroed %v)", b, bytes.Count(got[b*bs:(b+1)*bs], []byte{0}) == int(bs))
		}
	}
}

func testFlushAndFUA(t *testing.T, d blockdev.Device, _ Options) {
	bs := d.BlockSize()
	mustWrite(t, d, pattern(buf(bs), 41), 0)
	if err := d.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	f, ok := d.(blockdev.FUAWriter)
	if !ok {
		return
	}
	p := pattern(buf(2*bs), 42)
	if n, err := f.WriteAtFUA(p, int64(bs)); err != nil || n != len(p) {
		t.Fatalf("WriteAtFUA = %d, %v", n, err)
	}
	if got := mustRead(t, d, 2*bs, int64(bs)); !bytes.Equal(got, p) {
		t.Error("a FUA write reads back differently")
	}
}

func testConcurrent(t *testing.T, d blockdev.Device, o Options) {
	bs := int64(d.BlockSize())
	per := d.Size() / int64(o.Concurrency) / bs * bs
	n := min(per, int64(16<<10)) / bs * bs
	if n == 0 {
		t.Fatalf("device too small for %d goroutines", o.Concurrency)
	}
	var wg sync.WaitGroup
	errs := make(chan error, o.Concurrency)
	for g := 0; g < o.Concurrency; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := int64(g) * per
			for round := 0; round < 8; round++ {
				off := base + int64(round)*n%per
				p := pattern(buf(int(n)), int64(g*100+round))
				if w, err := d.WriteAt(p, off); err != nil || w != len(p) {
					errs <- fmt.Errorf("goroutine %d: WriteAt at %d = %d, %v", g, off, w, err)
					return
				}
				q := buf(int(n))
				if r, err := d.ReadAt(q, off); err != nil || r != len(q) {
					errs <- fmt.Errorf("goroutine %d: ReadAt at %d = %d, %v", g, off, r, err)
					return
				}
				if !bytes.Equal(p, q) {
					errs <- fmt.Errorf("goroutine %d: %d bytes at %d read back differently under concurrency", g, n, off)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func testClosed(t *testing.T, d blockdev.Device) {
	bs := d.BlockSize()
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := d.WriteAt(buf(bs), 0); !errors.Is(err, blockdev.ErrClosed) {
		t.Errorf("WriteAt after Close = %v, want ErrClosed", err)
	}
	if _, err := d.ReadAt(buf(bs), 0); !errors.Is(err, blockdev.ErrClosed) {
		t.Errorf("ReadAt after Close = %v, want ErrClosed", err)
	}
	if err := d.Flush(); !errors.Is(err, blockdev.ErrClosed) {
		t.Errorf("Flush after Close = %v, want ErrClosed", err)
	}
}

// NoLeaks registers a cleanup that fails t when goroutines started during
// the test are still running a while after it ended (connections, readers,
// timers of a device that Close did not stop). Call it first, so that its
// cleanup runs last.
func NoLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			now := runtime.NumGoroutine()
			if now <= before {
				return
			}
			if time.Now().After(deadline) {
				b := make([]byte, 1<<20)
				b = b[:runtime.Stack(b, true)]
				t.Errorf("%d goroutines before the test, %d five seconds after it ended: leaked goroutines:\n%s", before, now, b)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
