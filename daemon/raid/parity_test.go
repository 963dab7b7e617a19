package raid

import (
	"bytes"
	"math/rand"
	"testing"
)

// plainMul is the textbook GF(2^8) multiply with md's polynomial 0x11d,
// by shift and add; the oracle for the table and SIMD paths.
func plainMul(a, b byte) byte {
	var p byte
	for b != 0 {
		if b&1 != 0 {
			p ^= a
		}
		hi := a & 0x80
		a <<= 1
		if hi != 0 {
			a ^= 0x1d
		}
		b >>= 1
	}
	return p
}

// plainPQ computes md's syndromes the slow way: P = xor D_i, Q = sum g^i D_i
// with g = 2, by Horner's rule as md's C code does (Q = ((D_{n-1}·g +
// D_{n-2})·g + ...)).
func plainPQ(data [][]byte) (p, q []byte) {
	n := len(data[0])
	p, q = make([]byte, n), make([]byte, n)
	for x := 0; x < n; x++ {
		var pp, qq byte
		for i := len(data) - 1; i >= 0; i-- {
			pp ^= data[i][x]
			qq = plainMul(qq, 2) ^ data[i][x]
		}
		p[x], q[x] = pp, qq
	}
	return
}

func TestGFTablesMatchPlainMultiply(t *testing.T) {
	for a := 0; a < 256; a++ {
		for b := 0; b < 256; b++ {
			if got, want := gfMul(byte(a), byte(b)), plainMul(byte(a), byte(b)); got != want {
				t.Fatalf("gfMul(%#x,%#x) = %#x, plain multiply says %#x", a, b, got, want)
			}
			if b != 0 {
				if got := gfMul(gfDiv(byte(a), byte(b)), byte(b)); got != byte(a) {
					t.Fatalf("gfDiv(%#x,%#x)·%#x = %#x", a, b, b, got)
				}
			}
		}
	}
}

// TestMDKnownVector: syndromes of a vector computed by hand with md's
// algorithm. D0=0x01 D1=0x02 D2=0x03 D3=0x80:
// P = 01^02^03^80 = 0x80;
// Q = 1·01 ^ 2·02 ^ 4·03 ^ 8·80 = 01 ^ 04 ^ 0c ^ 74 = 0x7d
// (8·0x80: 0x80·2 = 0x100^0x11d = 0x1d, ·2 = 0x3a, ·2 = 0x74).
func TestMDKnownVector(t *testing.T) {
	c, err := newCoder(RAID6, 4)
	if err != nil {
		t.Fatal(err)
	}
	data := [][]byte{{0x01, 0xff}, {0x02, 0x00}, {0x03, 0x00}, {0x80, 0x00}}
	par := [][]byte{make([]byte, 2), make([]byte, 2)}
	c.encode(data, par)
	// Second byte: only D0=0xff, so P = 0xff, Q = 1·0xff = 0xff.
	if want := []byte{0x80, 0xff}; !bytes.Equal(par[0], want) {
		t.Errorf("P = %x, md gives %x", par[0], want)
	}
	if want := []byte{0x7d, 0xff}; !bytes.Equal(par[1], want) {
		t.Errorf("Q = %x, md gives %x", par[1], want)
	}
	p, q := plainPQ(data)
	if !bytes.Equal(p, par[0]) || !bytes.Equal(q, par[1]) {
		t.Errorf("plain Horner P,Q = %x,%x; coder %x,%x", p, q, par[0], par[1])
	}
}

func TestParityMatchesOracleRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, nd := range []int{2, 3, 4, 7, 14} {
		for _, level := range []Level{RAID5, RAID6} {
			c, err := newCoder(level, nd)
			if err != nil {
				t.Fatal(err)
			}
			n := 4096 + 64*rng.Intn(20)
			data := make([][]byte, nd)
			for i := range data {
				data[i] = make([]byte, n)
				rng.Read(data[i])
			}
			par := make([][]byte, c.np)
			for k := range par {
				par[k] = make([]byte, n)
			}
			c.encode(data, par)
			p, q := plainPQ(data)
			if !bytes.Equal(par[0], p) {
				t.Fatalf("%s nd=%d: P differs from xor oracle", level, nd)
			}
			if level == RAID6 && !bytes.Equal(par[1], q) {
				t.Fatalf("raid6 nd=%d: Q differs from the md oracle", nd)
			}
			// mulXor (the RMW path) agrees with the oracle too.
			for k := 0; k < c.np; k++ {
				acc := make([]byte, n)
				for i := range data {
					c.mulXor(k, i, data[i], acc)
				}
				if !bytes.Equal(acc, par[k]) {
					t.Fatalf("%s nd=%d: mulXor parity %d differs from encode", level, nd, k)
				}
			}
			// Any np lost data shards come back.
			shards := append(append([][]byte{}, data...), par...)
			lost := rng.Perm(nd)[:c.np]
			for _, l := range lost {
				shards[l] = nil
			}
			if err := c.reconstruct(shards); err != nil {
				t.Fatal(err)
			}
			for _, l := range lost {
				if !bytes.Equal(shards[l], data[l]) {
					t.Fatalf("%s nd=%d: reconstructed shard %d differs", level, nd, l)
				}
			}
		}
	}
}

func TestLocateQFindsSingleBadChunk(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	nd := 6
	c, _ := newCoder(RAID6, nd)
	data := make([][]byte, nd)
	for i := range data {
		data[i] = make([]byte, 512)
		rng.Read(data[i])
	}
	par := [][]byte{make([]byte, 512), make([]byte, 512)}
	c.encode(data, par)
	for z := 0; z < nd; z++ {
		bad := append([]byte{}, data[z]...)
		bad[7] ^= 0x5a
		bad[100] ^= 0x01
		syn := [][]byte{append([]byte{}, par[0]...), append([]byte{}, par[1]...)}
		for i := range data {
			d := data[i]
			if i == z {
				d = bad
			}
			c.mulXor(0, i, d, syn[0])
			c.mulXor(1, i, d, syn[1])
		}
		if got := locateQ(syn[0], syn[1], nd); got != z {
			t.Fatalf("corrupted data %d, locateQ says %d", z, got)
		}
	}
}
