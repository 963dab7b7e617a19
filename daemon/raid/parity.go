package raid

import (
	"crypto/subtle"
	"fmt"

	"github.com/klauspost/reedsolomon"
)

// GF(2^8) with md's polynomial x^8+x^4+x^3+x^2+1 (0x11d), generator 2.
var gfExp [512]byte
var gfLog [256]int

func init() {
	x := 1
	for i := 0; i < 255; i++ {
		gfExp[i] = byte(x)
		gfLog[x] = i
		x <<= 1
		if x&0x100 != 0 {
			x ^= 0x11d
		}
	}
	for i := 255; i < 512; i++ {
		gfExp[i] = gfExp[i-255]
	}
}

// gfPow2 returns g^i = 2^i, md's Q coefficient of data disk i.
func gfPow2(i int) byte { return gfExp[i%255] }

func gfMul(a, b byte) byte {
	if a == 0 || b == 0 {
		return 0
	}
	return gfExp[gfLog[a]+gfLog[b]]
}

func gfDiv(a, b byte) byte {
	if a == 0 {
		return 0
	}
	if b == 0 {
		panic("raid: GF division by zero")
	}
	return gfExp[gfLog[a]+255-gfLog[b]]
}

// coder computes and checks parity for one geometry. Its methods are safe
// for concurrent use.
type coder struct {
	nd, np int
	enc    reedsolomon.Encoder // nil for RAID-0 and RAID-1
	ll     reedsolomon.LowLevel
}

func newCoder(level Level, nd int) (*coder, error) {
	c := &coder{nd: nd}
	var err error
	switch level {
	case RAID5:
		c.np = 1
		c.enc, err = reedsolomon.New(nd, 1, reedsolomon.WithFastOneParityMatrix(), reedsolomon.WithMaxGoroutines(1))
	case RAID6:
		c.np = 2
		m := [][]byte{make([]byte, nd), make([]byte, nd)}
		for i := 0; i < nd; i++ {
			m[0][i] = 1
			m[1][i] = gfPow2(i)
		}
		c.enc, err = reedsolomon.New(nd, 2, reedsolomon.WithCustomMatrix(m), reedsolomon.WithMaxGoroutines(1))
	}
	if err != nil {
		return nil, fmt.Errorf("raid: parity coder for %d data disks: %w", nd, err)
	}
	return c, nil
}

// encode computes parity[k] from data; all slices have one length.
func (c *coder) encode(data, parity [][]byte) {
	if c.np == 1 {
		xorParity(parity[0], data)
		return
	}
	shards := make([][]byte, 0, c.nd+c.np)
	shards = append(shards, data...)
	shards = append(shards, parity...)
	if err := c.enc.Encode(shards); err != nil {
		panic(fmt.Sprintf("raid: encode: %v", err)) // equal-length shards: cannot fail
	}
}

// encodeShards computes the parity shards (the last np) of shards from
// the data (the first nd); all have one length. It allocates nothing.
func (c *coder) encodeShards(shards [][]byte) {
	if c.np == 1 {
		xorParity(shards[c.nd], shards[:c.nd])
		return
	}
	if err := c.enc.Encode(shards); err != nil {
		panic(fmt.Sprintf("raid: encode: %v", err)) // equal-length shards: cannot fail
	}
}

// mulXor does dst ^= coef(k,i) * src where k is the parity index (0 = P,
// 1 = Q) and i the data index.
func (c *coder) mulXor(k, i int, src, dst []byte) {
	if k == 0 {
		xorInto(dst, src)
		return
	}
	c.ll.GalMulSliceXor(gfPow2(i), src, dst)
}

// reconstruct fills the nil data shards (first nd) of shards from the
// others. shards has nd+np entries; nil means missing.
func (c *coder) reconstruct(shards [][]byte) error {
	return c.enc.ReconstructData(shards)
}

// xorParity sets p to the XOR of data (RAID-5's P), in blocks that stay
// in the core's first-level cache while every data chunk is added. The
// Reed–Solomon encoder computes the same, but spends about as long
// setting up each call as computing a 64 KiB chunk's parity with data
// that is not in the cache (docs/PERFORMANCE.md, "RAID engine").
func xorParity(p []byte, data [][]byte) {
	if len(data) == 1 {
		copy(p, data[0])
		return
	}
	var ll reedsolomon.LowLevel
	for lo := 0; lo < len(p); lo += xorBlock {
		hi := min(lo+xorBlock, len(p))
		subtle.XORBytes(p[lo:hi], data[0][lo:hi], data[1][lo:hi])
		for _, d := range data[2:] {
			ll.GalMulSliceXor(1, d[lo:hi], p[lo:hi]) // AVX2, 64 bytes a step
		}
	}
}

// xorBlock is xorParity's block.
const xorBlock = 16 << 10

func xorInto(dst, src []byte) { subtle.XORBytes(dst[:len(src)], dst[:len(src)], src) }

func isZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// locateQ finds, for RAID-6 syndromes dp = P ^ xor(D) and dq = Q ^ sum
// g^i D_i that are both non-zero, the single data index z with dq = g^z dp
// at every byte, or -1 when no single data chunk explains them.
func locateQ(dp, dq []byte, nd int) int {
	z := -1
	for i := range dp {
		if dp[i] == 0 && dq[i] == 0 {
			continue
		}
		if dp[i] == 0 || dq[i] == 0 {
			return -1
		}
		e := (gfLog[dq[i]] - gfLog[dp[i]] + 255) % 255
		if z == -1 {
			z = e
		} else if z != e {
			return -1
		}
	}
	if z >= nd {
		return -1
	}
	return z
}
