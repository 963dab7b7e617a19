package blockdev

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func pcFill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

func readBlock(t *testing.T, d Device, blk int64) []byte {
	t.Helper()
	b := make([]byte, 4096)
	if _, err := d.ReadAt(b, blk*4096); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPowerCutLosesOnlyUnflushedWrites(t *testing.T) {
	base := NewMem(1<<20, 4096)
	p := NewPowerCut(base)
	var _ FUAWriter = p
	// Block 0: written and flushed. Block 1: FUA. Block 2: written, not
	// flushed. Block 3: flushed, then overwritten without a flush.
	must := func(_ int, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(p.WriteAt(pcFill(4096, 0xa0), 0))
	must(p.WriteAt(pcFill(4096, 0xa3), 3*4096))
	if err := p.Flush(); err != nil {
		t.Fatal(err)
	}
	must(p.WriteAtFUA(pcFill(4096, 0xa1), 4096))
	must(p.WriteAt(pcFill(4096, 0xa2), 2*4096))
	must(p.WriteAt(pcFill(4096, 0xb3), 3*4096))
	if err := p.WriteZeroes(0, 4096); err != nil { // unflushed zeroes over block 0
		t.Fatal(err)
	}
	// Before the cut every read sees the newest data.
	for blk, want := range map[int64]byte{0: 0, 1: 0xa1, 2: 0xa2, 3: 0xb3} {
		if got := readBlock(t, p, blk); !bytes.Equal(got, pcFill(4096, want)) {
			t.Fatalf("before the cut block %d reads %#x, want %#x", blk, got[0], want)
		}
	}
	// Nothing unflushed reached the device underneath.
	if got := readBlock(t, base, 2); !bytes.Equal(got, pcFill(4096, 0)) {
		t.Fatalf("unflushed block 2 reached the base device: %#x", got[0])
	}
	if p.Unflushed() != 3 {
		t.Fatalf("%d blocks kept apart, want 3 (0, 2, 3)", p.Unflushed())
	}
	p.Cut()
	for blk, want := range map[int64]byte{0: 0xa0, 1: 0xa1, 2: 0, 3: 0xa3} {
		if got := readBlock(t, p, blk); !bytes.Equal(got, pcFill(4096, want)) {
			t.Fatalf("after the cut block %d reads %#x, want %#x", blk, got[0], want)
		}
	}
	// The device underneath alone (a process restarted after kill -9
	// reopens only it) holds the same.
	for blk, want := range map[int64]byte{0: 0xa0, 1: 0xa1, 2: 0, 3: 0xa3} {
		if got := readBlock(t, base, blk); got[0] != want {
			t.Fatalf("base device block %d holds %#x, want %#x", blk, got[0], want)
		}
	}
	// Flush made it durable on the base too: a base crash keeps it.
	base.Crash()
	if got := readBlock(t, base, 0); got[0] != 0xa0 {
		t.Fatalf("flushed block 0 lost in the base's crash: %#x", got[0])
	}
}

func TestPowerCutFUADuringWriteBack(t *testing.T) {
	// Concurrent flushes, plain writes and FUA writes of the same blocks:
	// after the last FUA write of a block and a cut, the block holds
	// that FUA write (a write-back never puts older data over it).
	base := NewMem(64*4096, 4096)
	p := NewPowerCut(base)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				blk := int64((i*7 + w) % 16)
				switch i % 3 {
				case 0:
					_, _ = p.WriteAt(pcFill(4096, byte(i)), blk*4096)
				case 1:
					_ = p.Flush()
				case 2:
					_, _ = p.WriteAt(pcFill(4096, byte(i)), blk*4096)
				}
			}
		}()
	}
	wg.Wait()
	for blk := range int64(16) {
		if _, err := p.WriteAtFUA(pcFill(4096, 0xf0+byte(blk)), blk*4096); err != nil {
			t.Fatal(err)
		}
	}
	p.Cut()
	for blk := range int64(16) {
		if got := readBlock(t, p, blk); !bytes.Equal(got, pcFill(4096, 0xf0+byte(blk))) {
			t.Fatalf("block %d after FUA and a cut: %#x", blk, got[0])
		}
	}
}

func TestPowerCutDestagesPastLimit(t *testing.T) {
	base := NewMem(64*4096, 4096)
	p := NewPowerCut(base)
	p.Limit = 4
	for blk := range int64(5) {
		if _, err := p.WriteAt(pcFill(4096, 1+byte(blk)), blk*4096); err != nil {
			t.Fatal(err)
		}
	}
	if p.Unflushed() != 0 {
		t.Fatalf("%d blocks kept apart past the limit of 4", p.Unflushed())
	}
	p.Cut()
	if got := readBlock(t, p, 4); got[0] != 5 {
		t.Fatalf("destaged block 4 lost in the cut: %#x", got[0])
	}
	if _, err := p.ReadAt(make([]byte, 100), 0); err == nil {
		t.Fatal("misaligned read accepted")
	}
}

func TestPowerCutInjectedFaults(t *testing.T) {
	base := NewMem(64*4096, 4096)
	p := NewPowerCut(base)
	p.WriteThrough = true
	defer p.Close()
	if _, err := p.WriteAt(pcFill(4096, 7), 0); err != nil {
		t.Fatal(err)
	}
	if got := readBlock(t, base, 0); got[0] != 7 {
		t.Fatalf("write-through did not reach the base device: %#x", got[0])
	}
	p.Cut()
	if got := readBlock(t, p, 0); got[0] != 7 {
		t.Fatalf("write-through data lost in a cut: %#x", got[0])
	}
	p.SetFault(0, true)
	if _, err := p.ReadAt(make([]byte, 4096), 0); !errors.Is(err, ErrIO) {
		t.Fatalf("read with an injected error: %v, want ErrIO", err)
	}
	if _, err := p.WriteAtFUA(pcFill(4096, 8), 0); !errors.Is(err, ErrIO) {
		t.Fatalf("FUA write with an injected error: %v", err)
	}
	if err := p.Flush(); !errors.Is(err, ErrIO) {
		t.Fatalf("flush with an injected error: %v", err)
	}
	// A control file sets and clears the fault.
	path := filepath.Join(t.TempDir(), "A1")
	p.SetFault(0, false)
	p.Watch(path)
	if err := os.WriteFile(path, []byte("error\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := p.ReadAt(make([]byte, 4096), 0); return err != nil })
	if err := os.WriteFile(path, []byte(""), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := p.ReadAt(make([]byte, 4096), 0); return err == nil })
	for text, want := range map[string]time.Duration{"slow 250ms": 250 * time.Millisecond, "": 0} {
		if d, fail, err := ParseFault(text); err != nil || fail || d != want {
			t.Errorf("ParseFault(%q) = %v %v %v", text, d, fail, err)
		}
	}
	for _, bad := range []string{"slow", "slow -1s", "fire", "error now"} {
		if _, _, err := ParseFault(bad); err == nil {
			t.Errorf("ParseFault(%q) accepted", bad)
		}
	}
}

// waitFor polls cond (the watcher applies a control file within 100 ms).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("condition not reached in 5 s")
}
