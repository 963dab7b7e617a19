package raid

import (
	"bytes"
	"encoding/binary"
	"math/rand"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

// Allocation guards for the data path (issue 14): a 4 KiB read and a
// 4 KiB read-modify-write through a RAID-5 3+1 array of memory members,
// without and with Policy.IOTimeout (timed member requests run on a
// pooled buffer of their own, see callBuf). The limits are the counts
// measured when the guard was written (docs/RAID.md, "Allocations per
// request"); a change that allocates more per request fails here.
func allocArray(t *testing.T, timeout time.Duration) *Array {
	t.Helper()
	ds := make([]blockdev.Device, 4)
	for i := range ds {
		ds[i] = &ramDev{data: make([]byte, 16<<20)}
	}
	pol := quietPolicy(nil)
	pol.IOTimeout = timeout
	a, err := Create(ds, Config{Level: RAID5, ChunkSize: 64 << 10, AssumeClean: true, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func allocsPerRequest(t *testing.T, a *Array, write bool, off int64) float64 {
	t.Helper()
	buf := blockdev.AlignedBuffer(4096)
	var err error
	n := testing.AllocsPerRun(200, func() {
		if write {
			_, err = a.WriteAt(buf, off)
		} else {
			_, err = a.ReadAt(buf, off)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAllocsPerRequest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		degr    bool
		write   bool
		max     float64
	}{
		{"read", 0, false, false, 0},
		{"write-rmw", 0, false, true, 0},
		{"read/iotimeout", time.Minute, false, false, 0},
		{"write-rmw/iotimeout", time.Minute, false, true, 0},
		{"read-degraded", 0, true, false, 0},
		{"write-degraded", 0, true, true, 13},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := allocArray(t, tc.timeout)
			// 4 KiB at 8 KiB: inside data chunk 0 of stripe 0, whose
			// member is role 1 (left-symmetric, P on role 3).
			const off = 8 << 10
			if tc.degr {
				if err := a.FailMember(a.dataRole(0, 0), "alloc test"); err != nil {
					t.Fatal(err)
				}
			}
			got := allocsPerRequest(t, a, tc.write, off)
			t.Logf("%s: %.0f allocations per 4 KiB request", tc.name, got)
			if raceBuild {
				// -race: sync.Pool drops items at random; the limits hold
				// for the program as built without it.
				return
			}
			if got > tc.max {
				t.Errorf("%s: %.0f allocations per 4 KiB request, want at most %.0f (docs/RAID.md, allocations per request): find the new allocation with -memprofile and remove it, or raise the limit there and here with the reason", tc.name, got, tc.max)
			}
		})
	}
}

// The log entry header is written field by field (no allocation); its
// on-disk form must stay the one binary.Encode gives, which replay
// decodes.
func TestEntHeaderPutMatchesBinary(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for n := 0; n < 100; n++ {
		var h entHeader
		b := make([]byte, entHeaderSize)
		rng.Read(b)
		if _, err := binary.Decode(b, binary.LittleEndian, &h); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, entHeaderSize)
		if _, err := binary.Encode(want, binary.LittleEndian, &h); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, entHeaderSize)
		h.put(got)
		if !bytes.Equal(got, want) {
			t.Fatalf("entHeader.put differs from binary.Encode for %+v:\n got %x\nwant %x", h, got, want)
		}
	}
}
