package blockdev

import (
	"fmt"
	"math/rand"
	"slices"
	"sync"
)

// Mem is an in-memory Device for tests that models a drive with a volatile
// write cache, so that crash consistency can be tested without a power cut.
//
// Every completed write (WriteAt, WriteZeroes, Discard) is visible to reads
// at once but is only durable after Flush, or immediately when written with
// WriteAtFUA. Crash drops every write that is not durable; CrashRandom keeps
// a random subset of them, block by block, the torn state a real drive may
// leave behind. Both also reopen a closed Mem, as a power cycle would.
//
// All methods are safe for concurrent use. Requests are atomic with respect
// to each other (one mutex), which is stronger than the Device contract asks.
type Mem struct {
	mu        sync.Mutex
	blockSize int
	data      []byte // what reads return now
	closed    bool
	// For each block written since the last flush: its durable content
	// (nil means all zeroes) and every version written since, oldest first
	// (nil entries are zeroes).
	durable  map[int64][]byte
	versions map[int64][][]byte
	flushes  int
}

// maxVersions bounds the unflushed versions kept per block for
// CrashRandom, so that a long test without flushes stays small.
const maxVersions = 8

// NewMem returns a zero-filled Mem of size bytes with the given logical
// block size. size must be a positive multiple of blockSize and blockSize a
// power of two of at least 512; NewMem panics otherwise (a test bug).
func NewMem(size int64, blockSize int) *Mem {
	if blockSize < 512 || blockSize&(blockSize-1) != 0 {
		panic(fmt.Sprintf("blockdev.NewMem: block size %d is not a power of two >= 512", blockSize))
	}
	if size <= 0 || size%int64(blockSize) != 0 {
		panic(fmt.Sprintf("blockdev.NewMem: size %d is not a positive multiple of the block size %d", size, blockSize))
	}
	return &Mem{
		blockSize: blockSize,
		data:      make([]byte, size),
		durable:   map[int64][]byte{},
		versions:  map[int64][][]byte{},
	}
}

// Size implements Device.
func (m *Mem) Size() int64 { return int64(len(m.data)) }

// BlockSize implements Device.
func (m *Mem) BlockSize() int { return m.blockSize }

func (m *Mem) check(off, length int64) error {
	if m.closed {
		return fmt.Errorf("mem device: %w", ErrClosed)
	}
	return CheckRange(off, length, int64(len(m.data)), m.blockSize)
}

// ReadAt implements Device.
func (m *Mem) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	return copy(p, m.data[off:]), nil
}

// WriteAt implements Device. The write is volatile until the next Flush.
func (m *Mem) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.write(p, off, int64(len(p)), false)
	return len(p), nil
}

// WriteAtFUA implements FUAWriter: the written blocks are durable when it
// returns; other unflushed writes stay volatile.
func (m *Mem) WriteAtFUA(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	m.write(p, off, int64(len(p)), true)
	return len(p), nil
}

// write stores p (or zeroes when p is nil) over [off, off+length), which the
// caller has checked.
func (m *Mem) write(p []byte, off, length int64, durable bool) {
	bs := int64(m.blockSize)
	for b := off / bs; b < (off+length)/bs; b++ {
		blk := m.data[b*bs : (b+1)*bs]
		if durable {
			delete(m.durable, b)
			delete(m.versions, b)
		} else {
			if _, ok := m.durable[b]; !ok {
				m.durable[b] = cloneOrNil(blk)
			}
		}
		if p == nil {
			clear(blk)
		} else {
			copy(blk, p[b*bs-off:])
		}
		if !durable {
			vs := m.versions[b]
			if len(vs) == maxVersions {
				// Forget the oldest intermediate version; the
				// durable one and the latest are always kept.
				vs = append(vs[:0], vs[1:]...)
			}
			m.versions[b] = append(vs, cloneOrNil(blk))
		}
	}
}

// cloneOrNil copies b, or returns nil when b is all zeroes (saving memory
// for zeroed and discarded ranges).
func cloneOrNil(b []byte) []byte {
	for _, c := range b {
		if c != 0 {
			return slices.Clone(b)
		}
	}
	return nil
}

// Flush implements Device: every completed write becomes durable.
func (m *Mem) Flush() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("mem device: %w", ErrClosed)
	}
	clear(m.durable)
	clear(m.versions)
	m.flushes++
	return nil
}

// WriteZeroes implements Device. Like a write, it is volatile until Flush.
func (m *Mem) WriteZeroes(off, length int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, length); err != nil {
		return err
	}
	m.write(nil, off, length, false)
	return nil
}

// Discard implements Device; the range reads back as zeroes. Like a write,
// it is volatile until Flush.
func (m *Mem) Discard(off, length int64) error { return m.WriteZeroes(off, length) }

// Close implements Device. The content is kept: Crash or CrashRandom reopen
// the device, and Snapshot still works.
func (m *Mem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("mem device: close twice: %w", ErrClosed)
	}
	m.closed = true
	return nil
}

// Crash simulates a power loss and restart: every write that was not
// flushed (or written with FUA) is lost, and the device is open again.
func (m *Mem) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	bs := int64(m.blockSize)
	for b, d := range m.durable {
		setBlock(m.data[b*bs:(b+1)*bs], d)
	}
	clear(m.durable)
	clear(m.versions)
	m.closed = false
}

// CrashRandom simulates a power loss that leaves a torn state: each block
// written since the last flush independently ends up with its durable
// content or any one of the versions written to it since (the last 8 of
// them), chosen with r.
// Blocks are visited in order, so a seeded r gives a reproducible result.
func (m *Mem) CrashRandom(r *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	bs := int64(m.blockSize)
	blocks := make([]int64, 0, len(m.durable))
	for b := range m.durable {
		blocks = append(blocks, b)
	}
	slices.Sort(blocks)
	for _, b := range blocks {
		vs := m.versions[b]
		i := r.Intn(len(vs) + 1)
		if i == 0 {
			setBlock(m.data[b*bs:(b+1)*bs], m.durable[b])
		} else {
			setBlock(m.data[b*bs:(b+1)*bs], vs[i-1])
		}
	}
	clear(m.durable)
	clear(m.versions)
	m.closed = false
}

func setBlock(dst, src []byte) {
	if src == nil {
		clear(dst)
	} else {
		copy(dst, src)
	}
}

// Snapshot returns a copy of what reads would return now.
func (m *Mem) Snapshot() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.data)
}

// Unflushed returns how many blocks hold writes that a Crash would drop.
func (m *Mem) Unflushed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.durable)
}

// Flushes returns how many times Flush succeeded.
func (m *Mem) Flushes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.flushes
}
