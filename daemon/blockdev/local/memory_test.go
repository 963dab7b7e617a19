package local

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
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
	p := unsafe.Slice(&m.chunks[0].b[0], int(m.size)) // one allocation, chunked
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

// TestMemoryLoanKeepsItsBytes: the memory a read borrows (LendAt) holds
// what was there when it was lent, whatever is written over it before the
// loan is returned, while reads see the writes; a write beside a loan
// writes in place; a returned chunk is the spare of the next copy.
func TestMemoryLoanKeepsItsBytes(t *testing.T) {
	m, err := NewMemory(1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	old := pattern(192<<10, 1)
	if _, err := m.WriteAt(old, 32<<10); err != nil { // chunks 0-3, unaligned to them
		t.Fatal(err)
	}
	loan, iov, err := m.LendAt(nil, 32<<10, 128<<10)
	if err != nil {
		t.Fatal(err)
	}
	if len(iov) != 1 {
		t.Fatalf("a 128 KiB loan at 32 KiB of fresh memory came in %d slices, want 1 (its chunks lie side by side)", len(iov))
	}
	next := pattern(192<<10, 2)
	if _, err := m.WriteAt(next[:4096], 36<<10); err != nil { // 4 KiB inside chunk 0
		t.Fatal(err)
	}
	if _, err := m.WriteAt(next[:64<<10], 64<<10); err != nil { // all of chunk 1
		t.Fatal(err)
	}
	if err := m.WriteZeroes(128<<10, 8192); err != nil { // start of chunk 2
		t.Fatal(err)
	}
	beside := m.chunks[4]
	if _, err := m.WriteAt(next[:4096], 256<<10); err != nil { // chunk 4, not lent
		t.Fatal(err)
	}
	if m.chunks[4] != beside {
		t.Fatal("a write to a chunk no loan holds copied it")
	}
	if got := bytes.Join(iov, nil); !bytes.Equal(got, old[:128<<10]) {
		t.Fatal("writes over lent memory changed what the loan holds")
	}
	want := append([]byte(nil), old[:160<<10]...)
	copy(want[4<<10:], next[:4096])
	copy(want[32<<10:], next[:64<<10])
	clear(want[96<<10 : 104<<10])
	got := make([]byte, 160<<10)
	if _, err := m.ReadAt(got, 32<<10); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a read after writes over a loan does not see them (err %v)", err)
	}
	l3, iov3, _ := m.LendAt(nil, 32<<10, 128<<10)
	if len(iov3) != 3 || !bytes.Equal(bytes.Join(iov3, nil), want[:128<<10]) {
		t.Fatalf("a loan over replaced chunks came in %d slices (want 3: copies are elsewhere), data equal %v", len(iov3), bytes.Equal(bytes.Join(iov3, nil), want[:128<<10]))
	}
	l3.Return()
	loan.Return()
	if len(m.spare) != 3 {
		t.Fatalf("%d spare chunks after the loan of 3 replaced chunks was returned, want 3", len(m.spare))
	}
	l2, _, _ := m.LendAt(nil, 0, 4096)
	if _, err := m.WriteAt(next[:4096], 0); err != nil {
		t.Fatal(err)
	}
	l2.Return()
	if len(m.spare) != 3 {
		t.Fatalf("%d spare chunks after a copy on write and a return, want 3 (the copy took a spare)", len(m.spare))
	}
	if _, _, err := m.LendAt(nil, 1<<20, 4096); !errors.Is(err, blockdev.ErrOutOfRange) {
		t.Fatalf("loan past the end: %v, want ErrOutOfRange", err)
	}
	if _, _, err := m.LendAt(nil, 100, 4096); !errors.Is(err, blockdev.ErrMisaligned) {
		t.Fatalf("misaligned loan: %v, want ErrMisaligned", err)
	}
}

// TestMemoryLoansSeeWholeWrites: loans taken while other goroutines
// write whole 128 KiB patterns over the same range always hold one write,
// never a mix (run with -race: Return and the copy on write race by
// design, on atomics).
func TestMemoryLoansSeeWholeWrites(t *testing.T) {
	const size = 128 << 10
	m, err := NewMemory(1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(32 << 10) // three chunks
	if _, err := m.WriteAt(bytes.Repeat([]byte{0}, size), off); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	errc := make(chan error, 3)
	for w := 1; w <= 2; w++ {
		go func() {
			p := make([]byte, size)
			for i := 0; ; i++ {
				select {
				case <-done:
					errc <- nil
					return
				default:
				}
				v := byte(w*100 + i%50)
				for j := range p {
					p[j] = v
				}
				if _, err := m.WriteAt(p, off); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			loan, iov, err := m.LendAt(nil, off, size)
			if err != nil {
				errc <- err
				return
			}
			first := iov[0][0]
			runtime.Gosched() // let the writers run while the loan is out
			for _, b := range iov {
				if n := bytes.Count(b, []byte{first}); n != len(b) {
					errc <- errors.New("a loan holds a mix of two writes")
					loan.Return()
					return
				}
			}
			loan.Return()
		}
		errc <- nil
	}()
	for i := 0; i < 3; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

// TestMemoryNoAllocPerRequest: reads, writes, loans and their return
// allocate nothing once warm (a copy on write allocates only when no
// spare is left).
func TestMemoryNoAllocPerRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	m, err := NewMemory(1<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 128<<10)
	iov := make([][]byte, 0, 4)
	n := testing.AllocsPerRun(100, func() {
		_, _ = m.WriteAt(p, 4096)
		_, _ = m.ReadAt(p, 8192)
		l, _, _ := m.LendAt(iov[:0], 4096, 128<<10)
		l.Return()
	})
	if n != 0 {
		t.Fatalf("%v allocations per write+read+loan, want 0", n)
	}
}

// A Memory of a huge page or more lies on huge pages and is advised to be
// backed by transparent huge pages: the kernel's copy out of a lent read
// then walks 2 MiB translations (docs/PERFORMANCE.md, session 7).
func TestMemoryAdvisesHugePages(t *testing.T) {
	thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		t.Skipf("no transparent huge pages on this kernel (%v): nothing to advise", err)
	}
	if strings.Contains(string(thp), "[never]") {
		t.Skipf("transparent huge pages are %q here: the advice has no effect", strings.TrimSpace(string(thp)))
	}
	m, err := NewMemory(8<<20, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	addr := uintptr(unsafe.Pointer(&m.data[0]))
	if addr%hugePageSize != 0 {
		t.Fatalf("memory starts at %#x: want a multiple of %d (a huge page)", addr, hugePageSize)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	eligible, found := "", false
	for _, line := range strings.Split(string(smaps), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			lo, hi, ok := strings.Cut(f[0], "-")
			a, err1 := strconv.ParseUint(lo, 16, 64)
			b, err2 := strconv.ParseUint(hi, 16, 64)
			found = ok && err1 == nil && err2 == nil && uint64(addr) >= a && uint64(addr) < b
			continue
		}
		if found && strings.HasPrefix(line, "THPeligible:") {
			eligible = strings.TrimSpace(strings.TrimPrefix(line, "THPeligible:"))
			break
		}
	}
	if eligible != "1" {
		t.Fatalf("the mapping holding the memory at %#x: THPeligible %q, want 1 (MADV_HUGEPAGE); THP mode %q",
			addr, eligible, strings.TrimSpace(string(thp)))
	}
	runtime.KeepAlive(m)
}
