package bench

import (
	"fmt"
	"sync"

	"tier0/daemon/blockdev"
)

// memDev is a small in-test RAM device honouring the blockdev contract, with
// a hook to fail requests.
type memDev struct {
	mu     sync.RWMutex
	data   []byte
	bs     int
	closed bool
	// fail, when set, decides whether a request fails (and with what).
	fail func(off int64, write bool) error
}

var _ blockdev.Device = (*memDev)(nil)

func newMemDev(size int64, bs int) *memDev { return &memDev{data: make([]byte, size), bs: bs} }

func (m *memDev) rw(p []byte, off int64, write bool) (int, error) {
	if err := blockdev.CheckRange(off, int64(len(p)), int64(len(m.data)), m.bs); err != nil {
		return 0, err
	}
	m.mu.RLock()
	f, closed := m.fail, m.closed
	m.mu.RUnlock()
	if closed {
		return 0, blockdev.ErrClosed
	}
	if f != nil {
		if err := f(off, write); err != nil {
			return 0, fmt.Errorf("mem offset %d: %w", off, err)
		}
	}
	// Workers never overlap, so copying under the read lock is safe; the
	// lock only orders against setFail/corrupt.
	m.mu.RLock()
	defer m.mu.RUnlock()
	if write {
		copy(m.data[off:], p)
	} else {
		copy(p, m.data[off:])
	}
	return len(p), nil
}

func (m *memDev) ReadAt(p []byte, off int64) (int, error)  { return m.rw(p, off, false) }
func (m *memDev) WriteAt(p []byte, off int64) (int, error) { return m.rw(p, off, true) }
func (m *memDev) Flush() error                             { return nil }
func (m *memDev) WriteZeroes(off, n int64) error {
	if err := blockdev.CheckRange(off, n, int64(len(m.data)), m.bs); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.data[off : off+n])
	return nil
}
func (m *memDev) Discard(off, n int64) error { return m.WriteZeroes(off, n) }
func (m *memDev) Size() int64                { return int64(len(m.data)) }
func (m *memDev) BlockSize() int             { return m.bs }
func (m *memDev) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}

func (m *memDev) setFail(f func(off int64, write bool) error) {
	m.mu.Lock()
	m.fail = f
	m.mu.Unlock()
}

// flip flips one byte at off (simulated silent corruption).
func (m *memDev) flip(off int64) {
	m.mu.Lock()
	m.data[off] ^= 0x5a
	m.mu.Unlock()
}
