package raid

import (
	"math/rand"
	"testing"
	"time"
)

// noteUnit keeps a floor of a member's time per 64 KiB: a stall of the
// host (one request taking milliseconds) barely moves it, a faster
// request lowers it at once, a member that really slows down is followed,
// and requests smaller than 64 KiB count as 64 KiB.
func TestNoteUnitIsAFloor(t *testing.T) {
	var m member
	m.noteUnit(3000, 64<<10, false)
	if u := m.unit.Load(); u != 3000 {
		t.Fatalf("first request of 3 µs per 64 KiB: unit %d ns, want 3000", u)
	}
	m.noteUnit(int64(5*time.Millisecond), 64<<10, false)
	if u := m.unit.Load(); u > 3000+3000/16 {
		t.Fatalf("one stalled request of 5 ms after 3 µs: unit %d ns, want at most %d (a stall is not the member's cost)", u, 3000+3000/16)
	}
	m.noteUnit(1000, 4096, false)
	if u := m.unit.Load(); u != 1000 {
		t.Fatalf("a 4 KiB request of 1 µs: unit %d ns, want 1000 (a small request counts as 64 KiB)", u)
	}
	m.noteUnit(8000, 512<<10, false)
	if u := m.unit.Load(); u != 1000 {
		t.Fatalf("a 512 KiB request of 8 µs (1 µs per 64 KiB): unit %d ns, want 1000", u)
	}
	n := 0
	for ; merges(&m) == false; n++ {
		if n > 100 {
			t.Fatalf("a member at 40 µs per 64 KiB still counts as memory after 100 requests (unit %d ns)", m.unit.Load())
		}
		m.noteUnit(40000, 64<<10, false)
	}
	// A drive whose merged 1 MiB requests take 9 µs per 64 KiB and its
	// single 64 KiB ones 40 µs mostly stays merged: merged requests lower
	// the floor only slowly, and a single request now and then raises it.
	var f member
	single := 0
	for i := 0; i < 200; i++ {
		if merges(&f) {
			f.noteUnit(9000*16, 1<<20, true)
		} else {
			f.noteUnit(40000, 64<<10, false)
			single++
		}
	}
	if single > 200/8 {
		t.Fatalf("a drive at 9 µs per 64 KiB merged and 40 µs single: %d of 200 requests unmerged, want at most 25", single)
	}
	var z member
	z.unit.Store(1)
	for i := 0; i < 20; i++ {
		z.noteUnit(40000, 64<<10, false)
	}
	if u := z.unit.Load(); u <= 1 {
		t.Fatalf("from a unit of 1 ns, 20 requests of 40 µs left it at %d ns: it must grow", u)
	}
}

// pinMemory makes every member of a count as memory (unit 1 ns: some 150
// requests of any length before it could count as a drive).
func pinMemory(a *Array) {
	for r := range a.members {
		a.member(r).unit.Store(1)
	}
}

// Consecutive chunks of one member go out as one merged request when the
// member costs like a drive, and each one straight from the caller's
// buffer when it is memory: merging saves a drive's cost per request,
// but for memory members it only added a copy through a bounce buffer of
// every byte (BenchmarkSeqWrite at 0.43 of the members' bandwidth,
// BenchmarkSeqRead at 0.70). The same with an IOTimeout ("timed"), where
// a merged request gathers its chunks into the timed request's own
// buffer and scatters a read from it (no bounce buffer).
func TestMergeOnlyForDriveMembers(t *testing.T) {
	for _, tc := range []struct{ drive, timed bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		drive := tc.drive
		name := "memory"
		if drive {
			name = "drive"
		}
		if tc.timed {
			name += "/timed"
		}
		t.Run(name, func(t *testing.T) {
			ms := newMems(4, 4<<20)
			cs := make([]*countingDev, 4)
			for i := range cs {
				cs[i] = &countingDev{Device: ms[i], drive: drive}
			}
			cfg := testCfg(RAID5, nil)
			if tc.timed {
				cfg.Policy.IOTimeout = 5 * time.Second
			}
			a := mustCreate(t, devs(cs), cfg)
			g := a.Geometry()
			for i := range cs {
				cs[i].from = g.DataOffset
				cs[i].writes.Store(0)
				cs[i].reads.Store(0)
			}
			if !drive {
				pinMemory(a)
			}
			const stripes = 8
			want := randBuf(rand.New(rand.NewSource(7)), int(stripes*g.StripeSize))
			mustWrite(t, a, 0, want)
			got := mustRead(t, a, 0, len(want))
			expectEqual(t, "read of the 8 stripes written", got, want)
			// Each member holds 8 chunks of the 8 stripes (6 data, 2 P):
			// memory members take a request per chunk, drives one write
			// and a read per run of data chunks between its P chunks.
			for r, c := range cs {
				wantW, wantR := int64(stripes), int64(0)
				for s := int64(0); s < stripes; s++ {
					if a.parityRole(s, 0) == r {
						continue
					}
					if !drive || s == 0 || a.parityRole(s-1, 0) == r {
						wantR++
					}
				}
				if drive {
					wantW = 1
				}
				if w, rd := c.writes.Load(), c.reads.Load(); w != wantW || rd != wantR {
					t.Errorf("member %d (%s) took %d writes and %d reads for a write and a read of 8 whole stripes, want %d and %d", r, name, w, rd, wantW, wantR)
				}
			}
		})
	}
}
