package local

import (
	"fmt"
	"sync"

	"tier0/daemon/blockdev"
)

// Memory is a blockdev.Device held in process memory, for benchmarks
// (`tier0 fabric serve --ns mem:512M`) that measure the layers above a
// drive apart from any file system or medium. It keeps nothing across a
// restart and Flush has nothing to do; unlike blockdev.Mem it models no
// volatile cache, keeps no write history and allocates nothing per
// request, so that its own cost is a copy. NewMemory touches every page
// (the whole size is resident from the start), so that no request pays a
// page fault.
//
// Reads share a lock and writes hold it alone, so concurrent requests see
// whole writes (which is more than the Device contract asks).
type Memory struct {
	mu        sync.RWMutex
	data      []byte
	blockSize int
	closed    bool
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
	data := blockdev.AlignedBuffer(int(size))
	// Touch every page now: fresh memory from the OS is mapped on first
	// use, and a benchmark that pays a page fault (and the zeroing of a
	// page) inside its I/O measures the kernel's memory manager, not the
	// layers above the device.
	for i := 0; i < len(data); i += 4096 {
		data[i] = 0
	}
	return &Memory{data: data, blockSize: blockSize}, nil
}

// Size implements blockdev.Device.
func (m *Memory) Size() int64 { return int64(len(m.data)) }

// BlockSize implements blockdev.Device.
func (m *Memory) BlockSize() int { return m.blockSize }

func (m *Memory) check(off, length int64) error {
	if m.closed {
		return fmt.Errorf("memory device: %w", blockdev.ErrClosed)
	}
	if err := blockdev.CheckRange(off, length, int64(len(m.data)), m.blockSize); err != nil {
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
	return copy(p, m.data[off:]), nil
}

// WriteAt implements blockdev.Device.
func (m *Memory) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(off, int64(len(p))); err != nil {
		return 0, err
	}
	return copy(m.data[off:], p), nil
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
	clear(m.data[off : off+length])
	return nil
}

// Discard implements blockdev.Device; the range reads back zeroes.
func (m *Memory) Discard(off, length int64) error { return m.WriteZeroes(off, length) }

// Close implements blockdev.Device.
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
)
