package raid

import (
	"math/bits"
	"sync"

	"tier0/daemon/blockdev"
)

// Aligned scratch buffers for stripe operations, pooled by power-of-two
// size class (4 KiB to 16 MiB) so that the hot path neither allocates nor
// zeroes chunk-sized buffers on every request.
const (
	minClass = 12
	maxClass = 24
)

var bufPools [maxClass + 1]sync.Pool

func sizeClass(n int64) int {
	if n <= 1<<minClass {
		return minClass
	}
	return bits.Len64(uint64(n - 1))
}

// getBuf returns an aligned buffer of n bytes with undefined content.
func getBuf(n int64) []byte {
	c := sizeClass(n)
	if c > maxClass {
		return blockdev.AlignedBuffer(int(n))
	}
	if v := bufPools[c].Get(); v != nil {
		return (*v.(*[]byte))[:n]
	}
	return blockdev.AlignedBuffer(1 << c)[:n]
}

// putBuf returns a buffer from getBuf to its pool.
func putBuf(b []byte) {
	c := cap(b)
	if c < 1<<minClass || c&(c-1) != 0 || c > 1<<maxClass {
		return
	}
	b = b[:c]
	bufPools[bits.Len(uint(c))-1].Put(&b)
}

// getBufRef is getBuf returning the pool's own reference, so that
// putBufRef gives it back without allocating.
func getBufRef(n int64) *[]byte {
	c := sizeClass(n)
	if c <= maxClass {
		if v := bufPools[c].Get(); v != nil {
			p := v.(*[]byte)
			*p = (*p)[:n]
			return p
		}
		b := blockdev.AlignedBuffer(1 << c)[:n]
		return &b
	}
	b := blockdev.AlignedBuffer(int(n))
	return &b
}

// putBufRef returns a buffer from getBufRef to its pool.
func putBufRef(p *[]byte) {
	c := cap(*p)
	if c < 1<<minClass || c&(c-1) != 0 || c > 1<<maxClass {
		return
	}
	*p = (*p)[:c]
	bufPools[bits.Len(uint(c))-1].Put(p)
}

// scratch collects the buffers of one operation for release. It keeps
// the pool's references so that release allocates nothing; a scratch
// kept in a pooled stripeWork reuses its list too.
type scratch struct{ refs []*[]byte }

func (s *scratch) get(n int64) []byte {
	r := getBufRef(n)
	s.refs = append(s.refs, r)
	return *r
}

func (s *scratch) zero(n int64) []byte {
	b := s.get(n)
	clear(b)
	return b
}

func (s *scratch) release() {
	for i, r := range s.refs {
		putBufRef(r)
		s.refs[i] = nil
	}
	s.refs = s.refs[:0]
}
