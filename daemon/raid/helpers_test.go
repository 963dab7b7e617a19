package raid

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand"
	"sync"
	"testing"

	"tier0/daemon/blockdev"
)

// events collects events for assertions.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (e *events) listen(ev Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

func (e *events) count(k EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Kind == k {
			n++
		}
	}
	return n
}

func (e *events) last(k EventKind) (Event, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.all) - 1; i >= 0; i-- {
		if e.all[i].Kind == k {
			return e.all[i], true
		}
	}
	return Event{}, false
}

func quietPolicy(ev *events) Policy {
	p := Policy{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if ev != nil {
		p.Listener = ev.listen
	}
	return p
}

// testCfg is a small-geometry config: 8 KiB chunks, 8 log slots, 64 KiB
// bitmap regions.
func testCfg(level Level, ev *events) Config {
	return Config{Level: level, ChunkSize: 8 << 10, AssumeClean: true, LogSlots: 8, BitmapRegion: 64 << 10, Policy: quietPolicy(ev)}
}

func newMems(n int, size int64) []*blockdev.Mem {
	ms := make([]*blockdev.Mem, n)
	for i := range ms {
		ms[i] = blockdev.NewMem(size, 512)
	}
	return ms
}

func devs[T blockdev.Device](ms []T) []blockdev.Device {
	d := make([]blockdev.Device, len(ms))
	for i, m := range ms {
		d[i] = m
	}
	return d
}

// checked registers the end-of-test consistency check of an array (bbolt
// habit): background work finishes, parity is verified, the array closes.
// Arrays that were aborted (simulated crash) are skipped.
func checked(t testing.TB, a *Array) *Array {
	t.Helper()
	t.Cleanup(func() {
		if a.stopped.Load() {
			return
		}
		a.WaitIdle()
		if err := a.Check(); err != nil && !errors.Is(err, ErrTooManyFailed) && !errors.Is(err, blockdev.ErrFenced) {
			t.Errorf("consistency check at end of test: %v", err)
		}
		a.Close()
	})
	return a
}

func mustCreate(t testing.TB, members []blockdev.Device, cfg Config) *Array {
	t.Helper()
	a, err := Create(members, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return checked(t, a)
}

func mustAssemble(t testing.TB, members []blockdev.Device, opts AssembleOptions) *Array {
	t.Helper()
	a, rej, err := Assemble(members, opts)
	if err != nil {
		t.Fatalf("assemble: %v", err)
	}
	if len(rej) > 0 {
		t.Logf("assemble rejected %v", rej)
	}
	return checked(t, a)
}

func randBuf(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	rng.Read(b)
	return b
}

func mustRead(t testing.TB, a *Array, off int64, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := a.ReadAt(b, off); err != nil {
		t.Fatalf("read %d@%d: %v", n, off, err)
	}
	return b
}

func mustWrite(t testing.TB, a *Array, off int64, p []byte) {
	t.Helper()
	if _, err := a.WriteAt(p, off); err != nil {
		t.Fatalf("write %d@%d: %v", len(p), off, err)
	}
}

func expectEqual(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: differs from the expected data at byte %d of %d", what, i, len(want))
	}
}

// flushedArray creates an array over n memory members of 384 KiB with cfg,
// writes 8 stripes of random data from rng and flushes them: the durable
// starting point of the power-cut tests. It returns the array, its members
// and the data written.
func flushedArray(t *testing.T, rng *rand.Rand, n int, cfg Config) (*Array, []*blockdev.Mem, []byte) {
	t.Helper()
	ms := newMems(n, 384<<10)
	a, err := Create(devs(ms), cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := randBuf(rng, int(8*a.Geometry().StripeSize))
	mustWrite(t, a, 0, model)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	return a, ms, model
}
