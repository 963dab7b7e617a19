package local

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"tier0/daemon/blockdev"
)

func TestMemoryDevice(t *testing.T) {
	m, err := NewMemory(4<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, m)
	w := pattern(8192, 3)
	if _, err := m.WriteAtFUA(w, 8192); err != nil {
		t.Fatal(err)
	}
	r := make([]byte, 8192)
	if _, err := m.ReadAt(r, 8192); err != nil || !bytes.Equal(r, w) {
		t.Fatalf("FUA write did not read back: %v", err)
	}
	if _, err := m.ReadAt(r[:4096], 4<<20); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Fatalf("read past the end: %v, want ErrOutOfRange", err)
	}
	if _, err := m.WriteAt(r[:100], 0); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Fatalf("misaligned write: %v, want ErrMisaligned", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReadAt(r, 0); !errors.Is(err, blockdev.ErrClosed) {
		t.Fatalf("read after close: %v, want ErrClosed", err)
	}
	for _, c := range []struct {
		size int64
		bs   int
	}{{0, 4096}, {4097, 4096}, {1 << 20, 1024}} {
		if _, err := NewMemory(c.size, c.bs); err == nil {
			t.Errorf("NewMemory(%d, %d) accepted", c.size, c.bs)
		}
	}
}

// TestMemoryResidentFromStart: every page of a new Memory is resident, so
// that a benchmark's requests never pay the first-touch page fault (which
// made a 4 KiB read through the target look twice as expensive as it is).
func TestMemoryResidentFromStart(t *testing.T) {
	m, err := NewMemory(16<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	// mincore wants a page-aligned start; AlignedBuffer gives one.
	p := m.data
	if uintptr(unsafe.Pointer(&p[0]))%4096 != 0 {
		t.Fatal("memory device buffer is not page-aligned")
	}
	vec := make([]byte, len(p)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	missing := 0
	for _, v := range vec {
		if v&1 == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d pages of a new 16 MiB memory device are not resident; every request to one of them pays a page fault", missing, len(vec))
	}
}
