package blockdev

import (
	"bytes"
	"errors"
	"math/rand"
	"sync"
	"testing"
	"time"
)

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

func TestAlignedBuffer(t *testing.T) {
	for _, n := range []int{0, 1, 511, 4096, 1 << 20} {
		p := AlignedBuffer(n)
		if len(p) != n || cap(p) != n {
			t.Fatalf("AlignedBuffer(%d): len %d cap %d", n, len(p), cap(p))
		}
		if !IsAligned(p) {
			t.Fatalf("AlignedBuffer(%d) not aligned", n)
		}
	}
	p := AlignedBuffer(8192)
	if IsAligned(p[1:]) {
		t.Fatal("IsAligned(p[1:]) = true")
	}
}

func TestCheckRangeErrors(t *testing.T) {
	m := NewMem(1<<16, 4096)
	if _, err := m.ReadAt(make([]byte, 4096), 100); !errors.Is(err, ErrMisaligned) {
		t.Fatalf("misaligned offset: %v", err)
	}
	if _, err := m.WriteAt(make([]byte, 100), 0); !errors.Is(err, ErrMisaligned) {
		t.Fatalf("misaligned length: %v", err)
	}
	if _, err := m.WriteAt(make([]byte, 8192), 1<<16-4096); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("past end: %v", err)
	}
	if err := m.WriteZeroes(-4096, 4096); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("negative: %v", err)
	}
	if n, err := m.ReadAt(nil, 1<<16); n != 0 || err != nil {
		t.Fatalf("zero-length at end: %d %v", n, err)
	}
	m.Close()
	if _, err := m.ReadAt(make([]byte, 4096), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

func TestMemCrashKeepsOnlyFlushed(t *testing.T) {
	m := NewMem(64<<10, 4096)
	m.WriteAt(fill(8192, 1), 0)
	m.Flush()
	m.WriteAt(fill(4096, 2), 4096)  // overwrites a flushed block
	m.WriteAt(fill(4096, 3), 16384) // fresh block
	m.WriteZeroes(0, 4096)
	m.WriteAtFUA(fill(4096, 4), 32768) // durable on its own
	if got := m.Unflushed(); got != 3 {
		t.Fatalf("Unflushed = %d, want 3", got)
	}
	m.Crash()
	s := m.Snapshot()
	want := make([]byte, 64<<10)
	copy(want, fill(8192, 1))
	copy(want[32768:], fill(4096, 4))
	if !bytes.Equal(s, want) {
		t.Fatalf("after crash: block0 %d block1 %d block4 %d block8 %d", s[0], s[4096], s[16384], s[32768])
	}
	if m.Unflushed() != 0 {
		t.Fatal("dirty after crash")
	}
	// A closed device reopens after a crash.
	m.Close()
	m.Crash()
	if _, err := m.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("read after power cycle: %v", err)
	}
}

func TestMemCrashRandomTorn(t *testing.T) {
	// Each dirty block ends up as its durable content or one of the
	// versions written since; across seeds every choice appears.
	seen := map[string]bool{}
	for seed := int64(0); seed < 64; seed++ {
		m := NewMem(16<<10, 4096)
		m.WriteAt(fill(16<<10, 1), 0)
		m.Flush()
		m.WriteAt(fill(8192, 2), 0)
		m.WriteAt(fill(4096, 3), 0)
		m.CrashRandom(rand.New(rand.NewSource(seed)))
		s := m.Snapshot()
		b0, b1 := s[0], s[4096]
		if b0 != 1 && b0 != 2 && b0 != 3 || b1 != 1 && b1 != 2 {
			t.Fatalf("seed %d: impossible state %d %d", seed, b0, b1)
		}
		if s[8192] != 1 || s[12288] != 1 {
			t.Fatalf("seed %d: untouched blocks changed", seed)
		}
		for i := 0; i < len(s); i += 4096 {
			if !bytes.Equal(s[i:i+4096], fill(4096, s[i])) {
				t.Fatalf("seed %d: block %d torn inside a block", seed, i/4096)
			}
		}
		seen[string([]byte{b0, b1})] = true
	}
	if len(seen) != 6 {
		t.Fatalf("only %d of 6 torn states seen: %v", len(seen), seen)
	}
	// Reproducible with the same seed.
	run := func() []byte {
		m := NewMem(64<<10, 512)
		for i := 0; i < 16; i++ {
			m.WriteAt(fill(4096, byte(i+1)), int64(i)*4096)
		}
		m.CrashRandom(rand.New(rand.NewSource(7)))
		return m.Snapshot()
	}
	if !bytes.Equal(run(), run()) {
		t.Fatal("CrashRandom not reproducible with the same seed")
	}
}

func TestMemConcurrent(t *testing.T) {
	m := NewMem(1<<20, 4096)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; i < 100; i++ {
				off := int64((g*100+i)%256) * 4096
				m.WriteAt(fill(4096, byte(g)), off)
				m.ReadAt(buf, off)
				if i%10 == 0 {
					m.Flush()
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestFaultRules(t *testing.T) {
	m := NewMem(64<<10, 4096)
	f := NewFault(m)
	custom := errors.New("custom")
	f.AddRule(Rule{Op: OpWrite, Off: 8192, Len: 4096, Action: Fail, After: 1, Count: 2})
	f.AddRule(Rule{Op: OpFlush, Action: Fail, Err: custom, Count: 1})

	// Writes outside the range pass.
	if _, err := f.WriteAt(fill(4096, 1), 0); err != nil {
		t.Fatal(err)
	}
	var errs []bool
	for i := 0; i < 5; i++ {
		_, err := f.WriteAt(fill(8192, 1), 4096) // overlaps the rule's range
		if err != nil && !errors.Is(err, ErrIO) {
			t.Fatalf("want ErrIO, got %v", err)
		}
		errs = append(errs, err != nil)
	}
	if want := []bool{false, true, true, false, false}; !equalBools(errs, want) {
		t.Fatalf("After/Count: failures %v, want %v", errs, want)
	}
	if err := f.Flush(); !errors.Is(err, custom) {
		t.Fatalf("flush: %v", err)
	}
	if err := f.Flush(); err != nil {
		t.Fatalf("second flush: %v", err)
	}
	if f.Fired() != 3 {
		t.Fatalf("Fired = %d", f.Fired())
	}
	// A failed write never reaches the device.
	f.AddRule(Rule{Op: OpAny, Action: Fail})
	if _, err := f.WriteAt(fill(4096, 9), 32768); err == nil {
		t.Fatal("OpAny rule did not fail write")
	}
	if err := f.Discard(0, 4096); err == nil {
		t.Fatal("OpAny rule did not fail discard")
	}
	if m.Snapshot()[32768] != 0 {
		t.Fatal("failed write reached the device")
	}
	f.ClearRules()
	if _, err := f.WriteAt(fill(4096, 9), 32768); err != nil {
		t.Fatalf("after ClearRules: %v", err)
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFaultCorrupt(t *testing.T) {
	m := NewMem(64<<10, 4096)
	f := NewFault(m)
	m.WriteAt(fill(16384, 0x5a), 0)
	f.AddRule(Rule{Op: OpRead, Off: 4096, Len: 4096, Action: Corrupt, Count: 1})
	p := make([]byte, 16384)
	f.ReadAt(p, 0)
	if p[0] != 0x5a || p[4096] != 0xa5 || p[4097] != 0x5a || p[8192] != 0x5a {
		t.Fatalf("read corruption wrong: %x %x %x %x", p[0], p[4096], p[4097], p[8192])
	}
	f.ReadAt(p, 0)
	if p[4096] != 0x5a {
		t.Fatal("Count 1 corrupted twice")
	}
	f.AddRule(Rule{Op: OpWrite, Action: Corrupt})
	src := fill(4096, 0x11)
	f.WriteAt(src, 32768)
	if src[0] != 0x11 {
		t.Fatal("corrupt write modified the caller's buffer")
	}
	if s := m.Snapshot(); s[32768] != 0xee || s[32769] != 0x11 {
		t.Fatalf("write corruption wrong: %x %x", s[32768], s[32769])
	}
}

func TestFaultDelay(t *testing.T) {
	f := NewFault(NewMem(64<<10, 4096))
	f.AddRule(Rule{Op: OpRead, Action: Delay, Delay: 30 * time.Millisecond})
	start := time.Now()
	f.ReadAt(make([]byte, 4096), 0)
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("delay too short: %v", d)
	}
	// ClearRules ends a long delay at once.
	f.AddRule(Rule{Op: OpWrite, Action: Delay, Delay: time.Hour})
	done := make(chan error)
	go func() { _, err := f.WriteAt(make([]byte, 4096), 0); done <- err }()
	time.Sleep(10 * time.Millisecond)
	f.ClearRules()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ClearRules did not end the delay")
	}
}

func TestRecorder(t *testing.T) {
	r := NewRecorder(NewFault(NewMem(64<<10, 4096)))
	r.WriteAt(make([]byte, 8192), 4096)
	r.Flush()
	r.WriteAtFUA(make([]byte, 4096), 0)
	r.WriteZeroes(0, 16384)
	r.Discard(16384, 8192)
	r.ReadAt(make([]byte, 4096), 0)
	r.WriteAt(make([]byte, 4096), 1<<20)
	want := "write off=4096 len=8192\nflush\nwrite-fua off=0 len=4096\nzeroes off=0 len=16384\ndiscard off=16384 len=8192\n" +
		"write off=1048576 len=4096 err=offset 1048576 length 4096: ends at byte 1052672, past the device end at 65536: request out of range\n"
	if got := r.String(); got != want {
		t.Fatalf("record:\n%s\nwant:\n%s", got, want)
	}
	if len(r.Events()) != 6 {
		t.Fatal("Events length")
	}
	r.Reset()
	if r.String() != "" {
		t.Fatal("Reset")
	}
}

// TestMemModel drives Mem with random writes, zeroes, FUA writes and
// flushes against a plain model of "current" and "durable" content, and
// checks reads, Crash and CrashRandom against it, over a ladder of seeds.
func TestMemModel(t *testing.T) {
	const bs, blocks = 512, 64
	for seed := int64(0); seed < 50; seed++ {
		rng := rand.New(rand.NewSource(seed))
		m := NewMem(bs*blocks, bs)
		cur := make([]byte, bs*blocks)
		durable := make([]byte, bs*blocks)
		seen := map[int][][]byte{} // block -> versions since last flush
		for step := 0; step < 200; step++ {
			b := rng.Intn(blocks)
			n := 1 + rng.Intn(min(4, blocks-b))
			off := int64(b * bs)
			switch op := rng.Intn(10); {
			case op < 5:
				p := fill(n*bs, byte(1+rng.Intn(255)))
				m.WriteAt(p, off)
				copy(cur[off:], p)
				for i := b; i < b+n; i++ {
					seen[i] = append(seen[i], p[:bs])
				}
			case op < 6:
				m.WriteZeroes(off, int64(n*bs))
				clear(cur[off : off+int64(n*bs)])
				for i := b; i < b+n; i++ {
					seen[i] = append(seen[i], make([]byte, bs))
				}
			case op < 7:
				p := fill(n*bs, byte(1+rng.Intn(255)))
				m.WriteAtFUA(p, off)
				copy(cur[off:], p)
				copy(durable[off:], p)
				for i := b; i < b+n; i++ {
					delete(seen, i)
				}
			case op < 8:
				m.Flush()
				copy(durable, cur)
				clear(seen)
			default:
				got := make([]byte, n*bs)
				m.ReadAt(got, off)
				if !bytes.Equal(got, cur[off:off+int64(n*bs)]) {
					t.Fatalf("seed %d step %d: read differs from model", seed, step)
				}
			}
		}
		if seed%2 == 0 {
			m.Crash()
			if !bytes.Equal(m.Snapshot(), durable) {
				t.Fatalf("seed %d: after Crash the content is not the durable model", seed)
			}
			continue
		}
		m.CrashRandom(rng)
		s := m.Snapshot()
		for i := 0; i < blocks; i++ {
			blk := s[i*bs : (i+1)*bs]
			ok := bytes.Equal(blk, durable[i*bs:(i+1)*bs])
			for _, v := range seen[i] {
				ok = ok || bytes.Equal(blk, v)
			}
			if !ok {
				t.Fatalf("seed %d: block %d after CrashRandom is neither durable nor a written version", seed, i)
			}
		}
	}
}
