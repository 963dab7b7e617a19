package local

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"tier0/daemon/blockdev"
)

// memChunkSize is the unit of a Memory's copy on write (see LendAt).
const memChunkSize = 64 << 10

// maxSpareChunks bounds the buffers of replaced chunks a Memory keeps for
// its next copies on write.
const maxSpareChunks = 64

// hugePageSize is the size of a transparent huge page (x86-64 and arm64
// with 4 KiB base pages).
const hugePageSize = 2 << 20

// Memory is a blockdev.Device held in process memory, for benchmarks
// (`tier0 fabric serve --ns mem:512M`) that measure the layers above a
// drive apart from any file system or medium. It keeps nothing across a
// restart and Flush has nothing to do; unlike blockdev.Mem it models no
// volatile cache, keeps no write history and allocates nothing per
// request, so that its own cost is a copy — or none: it lends its memory
// for reads (blockdev.Lender). NewMemory touches every page (the whole
// size is resident from the start), so that no request pays a page fault.
//
// Reads share a lock and writes hold it alone, so concurrent requests see
// whole writes (which is more than the Device contract asks). The memory
// is held in 64 KiB chunks; a write to a chunk that is lent writes a copy
// of it, which replaces it, and the lent one is kept unchanged until its
// last loan is returned (then it becomes the spare for the next copy).
type Memory struct {
	mu        sync.RWMutex
	data      []byte // the memory allocated at first; chunks not replaced lie in it
	chunks    []*memChunk
	size      int64
	blockSize int
	closed    bool
	loans     sync.Pool // *memLoan

	smu   sync.Mutex
	spare [][]byte // buffers of replaced chunks no longer lent
}

// memChunk is one chunk of a Memory. state is 2 per loan outstanding,
// plus 1 once the chunk was replaced by a write (it is then no longer in
// the table, so no new loan can take it).
type memChunk struct {
	b     []byte
	home  bool // b is its place in Memory.data (never replaced)
	state atomic.Int64
}

// memLoan is a loan of a Memory: the chunks it holds.
type memLoan struct {
	m  *Memory
	cs []*memChunk
}

// NewMemory returns a zero-filled Memory of size bytes (a positive
// multiple of blockSize, which is 512 or 4096).
func NewMemory(size int64, blockSize int) (*Memory, error) {
	if blockSize != 512 && blockSize != 4096 {
		return nil, fmt.Errorf("memory device: block size %d: expected 512 or 4096", blockSize)
	}
	if size <= 0 || size%int64(blockSize) != 0 {
		return nil, fmt.Errorf("memory device: size %d: expected a positive multiple of the %d-byte block size: %w", size, blockSize, blockdev.ErrMisaligned)
	}
	data := memoryBuffer(int(size))
	// Touch every page now: fresh memory from the OS is mapped on first
	// use, and a benchmark that pays a page fault (and the zeroing of a
	// page) inside its I/O measures the kernel's memory manager, not the
	// layers above the device.
	for i := 0; i < len(data); i += 4096 {
		data[i] = 0
	}
	m := &Memory{data: data, size: size, blockSize: blockSize}
	for off := 0; off < len(data); off += memChunkSize {
		end := min(off+memChunkSize, len(data))
		m.chunks = append(m.chunks, &memChunk{b: data[off:end:end], home: true})
	}
	m.loans.New = func() any { return &memLoan{m: m} }
	return m, nil
}

// memoryBuffer returns n zeroed bytes for a Memory, aligned to
// blockdev.Alignment. From one huge page up they start on a huge page and
// are advised to be backed by transparent huge pages (MADV_HUGEPAGE; the
// advice is all it is: where THP is "never" they stay in base pages).
// The kernel's copy out of a lent read walks the namespace's memory with
// its own page-table walks: with 4 KiB pages a 512 MiB namespace is
// 131072 translations, and on this project's virtual machines that copy
// ran at a tenth of the speed it reaches from a small buffer (148 against
// 1520 MiB/s for writes of 128 KiB to a loopback socket, cycling through
// 512 MiB); with huge pages it ran as fast as from the small buffer
// (docs/PERFORMANCE.md).
func memoryBuffer(n int) []byte {
	if n < hugePageSize {
		return blockdev.AlignedBuffer(n)
	}
	raw := make([]byte, n+hugePageSize)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&raw[0])) & (hugePageSize - 1)); r != 0 {
		skip = hugePageSize - r
	}
	b := raw[skip : skip+n : skip+n]
	_ = unix.Madvise(b[:n&^(hugePageSize-1)], unix.MADV_HUGEPAGE)
	return b
}

// Size implements blockdev.Device.
func (m *Memory) Size() int64 { return m.size }

// BlockSize implements blockdev.Device.
func (m *Memory) BlockSize() int { return m.blockSize }

func (m *Memory) check(off, length int64) error {
	if m.closed {
		return fmt.Errorf("memory device: %w", blockdev.ErrClosed)
	}
	if err := blockdev.CheckRange(off, length, m.size, m.blockSize); err != nil {
		return fmt.Errorf("memory device: %w", err)
	}
	return nil
}

// ReadAt implements blockdev.Device.
func (m *Memory) ReadAt(p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		i, o := int((off+int64(n))/memChunkSize), int((off+int64(n))%memChunkSize)
		n += copy(p[n:], m.chunks[i].b[o:])
	}
	return n, nil
}

// LendAt implements blockdev.Lender: the chunks that hold the range are
// lent as they are, without a copy; neighbours that still lie side by
// side in the first allocation come as one slice (a writev of one 128 KiB
// slice instead of two or three 64 KiB ones: with spdk_nvme_perf as the
// client the split one served 128 KiB reads at a third of the bandwidth).
func (m *Memory) LendAt(iov [][]byte, off, length int64) (blockdev.Loan, [][]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if err := m.check(off, length); err != nil {
		return nil, iov, err
	}
	l := m.loans.Get().(*memLoan)
	run := int64(-1) // start of the slice iov ends with, when it lies in m.data
	for end := off + length; off < end; {
		i, o := int(off/memChunkSize), int(off%memChunkSize)
		c := m.chunks[i]
		c.state.Add(2) // no write runs meanwhile (m.mu), so c stays in the table
		b := c.b[o:min(len(c.b), o+int(end-off))]
		switch {
		case c.home && run >= 0:
			e := off + int64(len(b))
			iov[len(iov)-1] = m.data[run:e:e]
		case c.home:
			run = off
			iov = append(iov, b)
		default:
			run = -1
			iov = append(iov, b)
		}
		l.cs = append(l.cs, c)
		off += int64(len(b))
	}
	return l, iov, nil
}

// Return implements blockdev.Loan.
func (l *memLoan) Return() {
	for i, c := range l.cs {
		if c.state.Add(-2) == 1 { // replaced, and this was its last loan
			l.m.putSpare(c.b)
		}
		l.cs[i] = nil
	}
	l.cs = l.cs[:0]
	l.m.loans.Put(l)
}

func (m *Memory) putSpare(b []byte) {
	m.smu.Lock()
	if len(m.spare) < maxSpareChunks && len(b) == memChunkSize {
		m.spare = append(m.spare, b)
	}
	m.smu.Unlock()
}

// writable returns the memory of chunk i for a write of its bytes
// [lo, hi) (m.mu held for writing): the chunk's own, or, while it is
// lent, a copy (holding the rest of its bytes) that replaces it.
func (m *Memory) writable(i, lo, hi int) []byte {
	c := m.chunks[i]
	for {
		v := c.state.Load()
		if v == 0 {
			return c.b // not lent, and no loan can start (m.mu)
		}
		if c.state.CompareAndSwap(v, v|1) {
			break // lent: the last Return recycles it
		}
	}
	var b []byte
	m.smu.Lock()
	if n := len(m.spare); n > 0 && len(c.b) == memChunkSize {
		b, m.spare = m.spare[n-1], m.spare[:n-1]
	}
	m.smu.Unlock()
	if b == nil {
		b = make([]byte, len(c.b))
	}
	copy(b[:lo], c.b[:lo])
	copy(b[hi:], c.b[hi:])
	m.chunks[i] = &memChunk{b: b}
	return b
}

// update calls fn for each chunk's part of [off, off+length), with the
// memory to write it to (m.mu held for writing).
func (m *Memory) update(off, length int64, fn func(dst []byte)) {
	for end := off + length; off < end; {
		i, o := int(off/memChunkSize), int(off%memChunkSize)
		hi := min(len(m.chunks[i].b), o+int(end-off))
		fn(m.writable(i, o, hi)[o:hi])
		off += int64(hi - o)
	}
}

// WriteAt implements blockdev.Device.
func (m *Memory) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	n := 0
	m.update(off, int64(len(p)), func(dst []byte) { n += copy(dst, p[n:]) })
	return n, nil
}

// WriteAtFUA implements blockdev.FUAWriter (memory is as durable as it gets).
func (m *Memory) WriteAtFUA(p []byte, off int64) (int, error) { return m.WriteAt(p, off) }

// Flush implements blockdev.Device.
func (m *Memory) Flush() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.check(0, 0)
}

// WriteZeroes implements blockdev.Device.
func (m *Memory) WriteZeroes(off, length int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, length); err != nil {
		return err
	}
	m.update(off, length, func(dst []byte) { clear(dst) })
	return nil
}

// Discard implements blockdev.Device; the range reads back zeroes.
func (m *Memory) Discard(off, length int64) error { return m.WriteZeroes(off, length) }

// Close implements blockdev.Device. Loans outstanding stay valid.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("memory device: close twice: %w", blockdev.ErrClosed)
	}
	m.closed = true
	return nil
}

var (
	_ blockdev.Device    = (*Memory)(nil)
	_ blockdev.FUAWriter = (*Memory)(nil)
	_ blockdev.Lender    = (*Memory)(nil)
)
