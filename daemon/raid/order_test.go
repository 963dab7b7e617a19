package raid

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"

	"tier0/daemon/blockdev"
)

// TestWriteOrderTranscript shows, per member, the requests of one partial
// stripe write on RAID-5 as text: the partial parity log entry reaches the
// parity member with FUA before the data and parity writes are issued.
func TestWriteOrderTranscript(t *testing.T) {
	ms := newMems(4, memSize)
	recs := make([]*blockdev.Recorder, len(ms))
	for i := range ms {
		recs[i] = blockdev.NewRecorder(ms[i])
	}
	a := mustCreate(t, devs(recs), testCfg(RAID5, nil))
	g := a.Geometry()
	mustWrite(t, a, 0, make([]byte, 4096)) // dirty superblock, bitmap bit
	for _, r := range recs {
		r.Reset()
	}
	const s = 1
	mustWrite(t, a, s*g.StripeSize+4096, bytes.Repeat([]byte{7}, 4096))
	var got strings.Builder
	for r, rec := range recs {
		for _, e := range rec.Events() {
			kind := "data"
			switch {
			case e.Off < bitmapOffset:
				kind = "superblock"
			case e.Off < a.jl.off:
				kind = "bitmap"
			case e.Off < g.DataOffset:
				kind = "log"
			}
			fmt.Fprintf(&got, "member %d: %s %s\n", r, kind, e)
		}
	}
	p, d0 := a.parityRole(s, 0), a.dataRole(s, 0)
	want := fmt.Sprintf("member %d: data write off=%d len=4096\n", d0, g.DataOffset+s*g.ChunkSize+4096)
	want = fmt.Sprintf("member %d: log write-fua off=%d len=8192\nmember %d: data write off=%d len=4096\n",
		p, a.jl.slotOff(0), p, g.DataOffset+s*g.ChunkSize+4096) + want
	// Members print in role order; sort the expected lines the same way.
	lines := strings.Split(strings.TrimSpace(want), "\n")
	if p > d0 {
		lines = append(lines[2:], lines[:2]...)
	}
	if exp := strings.Join(lines, "\n") + "\n"; got.String() != exp {
		t.Fatalf("member requests of a 4 KiB partial write:\n%s\nwant:\n%s", got.String(), exp)
	}
}

// TestFlushAndFUADurable: a write acknowledged with FUA, or followed by a
// successful Flush, survives a power cut of every member.
func TestFlushAndFUADurable(t *testing.T) {
	for _, level := range []Level{RAID1, RAID5, RAID6} {
		n := map[Level]int{RAID1: 2, RAID5: 4, RAID6: 5}[level]
		ms := newMems(n, memSize)
		a, err := Create(devs(ms), testCfg(level, nil))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewSource(11))
		x, y := randBuf(rng, 12288), randBuf(rng, 20480)
		if _, err := a.WriteAtFUA(x, 8192); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, a, 65536, y)
		if err := a.Flush(); err != nil {
			t.Fatal(err)
		}
		a.Abort()
		for _, m := range ms {
			m.Crash()
		}
		b := mustAssemble(t, devs(ms), AssembleOptions{Policy: quietPolicy(nil)})
		expectEqual(t, level.String()+" FUA write after power cut", mustRead(t, b, 8192, len(x)), x)
		expectEqual(t, level.String()+" flushed write after power cut", mustRead(t, b, 65536, len(y)), y)
	}
}

// TestOverlappingWritesSerialize: concurrent writes to the same stripes
// never interleave inside a stripe, and parity stays consistent.
func TestOverlappingWritesSerialize(t *testing.T) {
	ms := newMems(5, memSize)
	a := mustCreate(t, devs(ms), testCfg(RAID6, nil))
	g := a.Geometry()
	const writers = 8
	size := int(g.StripeSize) - 4096 // partial stripes: the RMW/RCW paths
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := bytes.Repeat([]byte{byte(w + 1)}, size)
			for i := 0; i < 20; i++ {
				for s := int64(0); s < 4; s++ {
					if _, err := a.WriteAt(p, s*g.StripeSize+2048); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for s := int64(0); s < 4; s++ {
		got := mustRead(t, a, s*g.StripeSize+2048, size)
		for i := range got {
			if got[i] != got[0] {
				t.Fatalf("stripe %d mixes writers %d and %d", s, got[0], got[i])
			}
		}
	}
	if err := a.Check(); err != nil {
		t.Fatal(err)
	}
}
