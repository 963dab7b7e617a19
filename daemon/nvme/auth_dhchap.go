package nvme

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math/big"
	"strings"
	"sync"
)

// ErrSecret: a DH-HMAC-CHAP secret string is not valid.
var ErrSecret = errors.New("invalid DH-HMAC-CHAP secret")

// DH-HMAC-CHAP hash function identifiers (HashID of the Challenge; also the
// transformation hash of a secret, where 0 means "not transformed").
const (
	HashNone   uint8 = 0x00
	HashSHA256 uint8 = 0x01
	HashSHA384 uint8 = 0x02
	HashSHA512 uint8 = 0x03
)

// DH group identifiers (RFC 7919 finite-field groups).
const (
	DHGroupNull uint8 = 0x00
	DHGroup2048 uint8 = 0x01
	DHGroup3072 uint8 = 0x02
	DHGroup4096 uint8 = 0x03
	DHGroup6144 uint8 = 0x04
	DHGroup8192 uint8 = 0x05
)

// AllHashes and AllDHGroups list every identifier tier0 supports, in the
// order the Linux host offers them in AUTH_Negotiate.
var (
	AllHashes   = []uint8{HashSHA256, HashSHA384, HashSHA512}
	AllDHGroups = []uint8{DHGroupNull, DHGroup2048, DHGroup3072, DHGroup4096, DHGroup6144, DHGroup8192}
)

// HashLen returns the output length of hash id, 0 for an unknown id.
func HashLen(id uint8) int {
	switch id {
	case HashSHA256:
		return 32
	case HashSHA384:
		return 48
	case HashSHA512:
		return 64
	}
	return 0
}

func newHash(id uint8) func() hash.Hash {
	switch id {
	case HashSHA256:
		return sha256.New
	case HashSHA384:
		return sha512.New384
	case HashSHA512:
		return sha512.New
	}
	return nil
}

// HashName names a hash id ("sha256", ...).
func HashName(id uint8) string {
	switch id {
	case HashSHA256:
		return "sha256"
	case HashSHA384:
		return "sha384"
	case HashSHA512:
		return "sha512"
	}
	return fmt.Sprintf("hash-%#x", id)
}

// ParseHashName accepts "sha256", "sha384", "sha512" (also "hmac(sha256)"
// as Linux writes them).
func ParseHashName(s string) (uint8, error) {
	n := strings.TrimSuffix(strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "hmac("), ")")
	for _, id := range AllHashes {
		if HashName(id) == n {
			return id, nil
		}
	}
	return 0, fmt.Errorf("hash %q: want sha256, sha384 or sha512", s)
}

// DHGroupName names a DH group id ("null", "ffdhe2048", ...).
func DHGroupName(id uint8) string {
	if id == DHGroupNull {
		return "null"
	}
	if g := dhGroup(id); g != nil {
		return fmt.Sprintf("ffdhe%d", g.bits)
	}
	return fmt.Sprintf("dhgroup-%#x", id)
}

// ParseDHGroupName accepts "null", "ffdhe2048", ..., "ffdhe8192".
func ParseDHGroupName(s string) (uint8, error) {
	n := strings.ToLower(strings.TrimSpace(s))
	for _, id := range AllDHGroups {
		if DHGroupName(id) == n {
			return id, nil
		}
	}
	return 0, fmt.Errorf("DH group %q: want null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192", s)
}

// DHCHAPKey is a parsed DH-HMAC-CHAP secret: the key bytes and the hash
// with which it is transformed before use (HashNone: used as it is).
type DHCHAPKey struct {
	Key  []byte
	Hash uint8
}

// ParseDHCHAPSecret parses the representation nvme-cli and Linux use:
// "DHHC-1:<hh>:<base64 of key || CRC-32 of key, little-endian>:", where hh
// is 00 (no transformation), 01 (SHA-256), 02 (SHA-384) or 03 (SHA-512) and
// the key is 32, 48 or 64 bytes. A key transformed with a hash must be as
// long as that hash's output.
func ParseDHCHAPSecret(s string) (DHCHAPKey, error) {
	const prefix = "DHHC-1:"
	fail := func(why string) (DHCHAPKey, error) {
		return DHCHAPKey{}, fmt.Errorf("secret %.12q...: %s (expected DHHC-1:<00..03>:<base64>:, e.g. from `nvme gen-dhchap-key`): %w", s, why, ErrSecret)
	}
	if !strings.HasPrefix(s, prefix) {
		return fail("does not start with DHHC-1:")
	}
	rest := s[len(prefix):]
	if len(rest) < 3 || rest[2] != ':' {
		return fail("the transformation hash is not two digits")
	}
	var h uint8
	switch rest[:2] {
	case "00":
		h = HashNone
	case "01":
		h = HashSHA256
	case "02":
		h = HashSHA384
	case "03":
		h = HashSHA512
	default:
		return fail(fmt.Sprintf("transformation hash %q is not 00, 01, 02 or 03", rest[:2]))
	}
	enc := strings.TrimSuffix(rest[3:], ":")
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return fail("the key is not valid base64")
	}
	if n := len(raw) - 4; n != 32 && n != 48 && n != 64 {
		return fail(fmt.Sprintf("the key is %d bytes, want 32, 48 or 64", len(raw)-4))
	}
	key, sum := raw[:len(raw)-4], binary.LittleEndian.Uint32(raw[len(raw)-4:])
	if crc32.ChecksumIEEE(key) != sum {
		return fail("the CRC-32 of the key does not match (mistyped?)")
	}
	if h != HashNone && len(key) != HashLen(h) {
		return fail(fmt.Sprintf("a %d-byte key cannot be transformed with %s (%d bytes)", len(key), HashName(h), HashLen(h)))
	}
	return DHCHAPKey{Key: key, Hash: h}, nil
}

// String formats k in the DHHC-1 representation.
func (k DHCHAPKey) String() string {
	raw := binary.LittleEndian.AppendUint32(append([]byte{}, k.Key...), crc32.ChecksumIEEE(k.Key))
	return fmt.Sprintf("DHHC-1:%02d:%s:", k.Hash, base64.StdEncoding.EncodeToString(raw))
}

// GenerateDHCHAPSecret returns a new random secret of keyLen bytes (32, 48
// or 64) with transformation hash h, as `nvme gen-dhchap-key` does.
func GenerateDHCHAPSecret(keyLen int, h uint8) (string, error) {
	if keyLen != 32 && keyLen != 48 && keyLen != 64 {
		return "", fmt.Errorf("key length %d: want 32, 48 or 64: %w", keyLen, ErrSecret)
	}
	if h != HashNone && HashLen(h) != keyLen {
		return "", fmt.Errorf("hash %s needs a %d-byte key, not %d: %w", HashName(h), HashLen(h), keyLen, ErrSecret)
	}
	if h > HashSHA512 {
		return "", fmt.Errorf("transformation hash %d: want 0..3: %w", h, ErrSecret)
	}
	k := DHCHAPKey{Key: make([]byte, keyLen), Hash: h}
	if _, err := rand.Read(k.Key); err != nil {
		return "", err
	}
	return k.String(), nil
}

// Transform returns the key used in the HMACs: the key itself when it is
// not transformed, else HMAC-hash(key, nqn || "NVMe-over-Fabrics"). The
// host's key is transformed with the host NQN, the controller's with the
// subsystem NQN.
func (k DHCHAPKey) Transform(nqn string) []byte {
	if k.Hash == HashNone {
		return append([]byte{}, k.Key...)
	}
	m := hmac.New(newHash(k.Hash), k.Key)
	m.Write([]byte(nqn))
	m.Write([]byte("NVMe-over-Fabrics"))
	return m.Sum(nil)
}

// AugmentChallenge returns the challenge to hash when a DH exchange took
// place: HMAC-hash(H(sessionKey), challenge).
func AugmentChallenge(hashID uint8, sessionKey, challenge []byte) []byte {
	h := newHash(hashID)()
	h.Write(sessionKey)
	m := hmac.New(newHash(hashID), h.Sum(nil))
	m.Write(challenge)
	return m.Sum(nil)
}

// DHCHAPResponse computes a DH-HMAC-CHAP response value with the negotiated
// hash, keyed by the transformed key:
// HMAC(key, C || SEQ (le32) || TID (le16) || 0x00 || role || nqn1 || 0x00 || nqn2).
// The host's response (R1) uses role "HostHost", nqn1 the host NQN and nqn2
// the subsystem NQN; the controller's (R2) role "Controller", nqn1 the
// subsystem NQN and nqn2 the host NQN. challenge is already augmented when
// a DH group is in use. It returns nil for an unknown hash.
func DHCHAPResponse(hashID uint8, key, challenge []byte, seq uint32, tid uint16, role, nqn1, nqn2 string) []byte {
	nh := newHash(hashID)
	if nh == nil {
		return nil
	}
	m := hmac.New(nh, key)
	m.Write(challenge)
	var b [7]byte
	binary.LittleEndian.PutUint32(b[:], seq)
	binary.LittleEndian.PutUint16(b[4:], tid)
	m.Write(b[:7])
	m.Write([]byte(role))
	m.Write([]byte(nqn1))
	m.Write([]byte{0})
	m.Write([]byte(nqn2))
	return m.Sum(nil)
}

// Roles of DHCHAPResponse.
const (
	RoleHost       = "HostHost"
	RoleController = "Controller"
)

// DH is one side of a finite-field Diffie-Hellman exchange in an RFC 7919
// group.
type DH struct {
	g    *ffdhe
	priv *big.Int
	// Public is this side's public value, as long as the group's prime.
	Public []byte
}

// ffdhe is an RFC 7919 group: p = 2^b - 2^(b-64) + (floor(2^(b-130) e) + X) * 2^64 - 1, g = 2.
type ffdhe struct {
	id   uint8
	bits int
	x    int64
	once sync.Once
	p    *big.Int
}

var ffdheGroups = []*ffdhe{
	{id: DHGroup2048, bits: 2048, x: 560316},
	{id: DHGroup3072, bits: 3072, x: 2625351},
	{id: DHGroup4096, bits: 4096, x: 5736041},
	{id: DHGroup6144, bits: 6144, x: 15705020},
	{id: DHGroup8192, bits: 8192, x: 10965728},
}

func dhGroup(id uint8) *ffdhe {
	for _, g := range ffdheGroups {
		if g.id == id {
			return g
		}
	}
	return nil
}

// prime returns p, computed once from the RFC 7919 formula (the test checks
// it against the RFC's hex and that p and (p-1)/2 are prime).
func (g *ffdhe) prime() *big.Int {
	g.once.Do(func() {
		b := g.bits
		e := eScaled(uint(b - 130))
		p := new(big.Int).Lsh(big.NewInt(1), uint(b))
		p.Sub(p, new(big.Int).Lsh(big.NewInt(1), uint(b-64)))
		t := new(big.Int).Add(e, big.NewInt(g.x))
		p.Add(p, t.Lsh(t, 64))
		g.p = p.Sub(p, big.NewInt(1))
	})
	return g.p
}

// eScaled returns floor(2^n * e), summing 1/k! with enough terms that the
// truncation error is far below 1.
func eScaled(n uint) *big.Int {
	// sum_{k=0}^{K} K!/k! / K!, with K! > 2^(n+64)
	k := int64(1)
	fact := big.NewInt(1)
	limit := new(big.Int).Lsh(big.NewInt(1), n+64)
	for fact.Cmp(limit) < 0 {
		k++
		fact.Mul(fact, big.NewInt(k))
	}
	// S = sum_{j=0}^{k} k!/j! computed backwards: term_k = 1, term_{j} = term_{j+1} * (j+1)
	sum := new(big.Int)
	term := big.NewInt(1)
	for j := k; j >= 0; j-- {
		sum.Add(sum, term)
		term.Mul(term, big.NewInt(j))
	}
	sum.Lsh(sum, n)
	return sum.Div(sum, fact)
}

// DHGroupSize returns the length in bytes of a public value of group id,
// 0 for the null group or an unknown id.
func DHGroupSize(id uint8) int {
	if g := dhGroup(id); g != nil {
		return g.bits / 8
	}
	return 0
}

// NewDH makes a key pair in group id (not the null group), reading
// randomness from r (crypto/rand when nil). The private exponent has 512
// bits, twice the strength of the largest group.
func NewDH(id uint8, r io.Reader) (*DH, error) {
	g := dhGroup(id)
	if g == nil {
		return nil, fmt.Errorf("DH group %s: not a finite-field group", DHGroupName(id))
	}
	if r == nil {
		r = rand.Reader
	}
	var buf [64]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return nil, err
	}
	x := new(big.Int).SetBytes(buf[:])
	x.SetBit(x, 511, 1)
	pub := new(big.Int).Exp(big.NewInt(2), x, g.prime())
	return &DH{g: g, priv: x, Public: pub.FillBytes(make([]byte, g.bits/8))}, nil
}

// Shared returns the shared secret with the peer's public value, as long as
// the prime. The peer value must be exactly that long and lie in 2..p-2.
func (d *DH) Shared(peer []byte) ([]byte, error) {
	p := d.g.prime()
	if len(peer) != d.g.bits/8 {
		return nil, fmt.Errorf("DH public value of %d bytes, group %s needs %d", len(peer), DHGroupName(d.g.id), d.g.bits/8)
	}
	y := new(big.Int).SetBytes(peer)
	pm1 := new(big.Int).Sub(p, big.NewInt(1))
	if y.Cmp(big.NewInt(1)) <= 0 || y.Cmp(pm1) >= 0 {
		return nil, fmt.Errorf("DH public value out of range for group %s", DHGroupName(d.g.id))
	}
	z := new(big.Int).Exp(y, d.priv, p)
	return z.FillBytes(make([]byte, d.g.bits/8)), nil
}
