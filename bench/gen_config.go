package bench

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"tier0/daemon/blockdev"
)

// Pattern is an I/O pattern of the load generator.
type Pattern string

// The patterns. Sequential patterns give each worker its own contiguous
// share of the region and walk it in order; random patterns give worker w
// the I/O slots w, w+QD, w+2·QD… of the region and pick among them at random,
// so no two workers ever touch the same bytes (which is what lets verify
// mode run with writes and reads in flight at once).
const (
	SeqRead   Pattern = "seq-read"
	SeqWrite  Pattern = "seq-write"
	RandRead  Pattern = "rand-read"
	RandWrite Pattern = "rand-write"
	// Mixed is random I/O where each operation is a read with probability
	// Config.ReadFraction, otherwise a write.
	Mixed Pattern = "mixed"
)

func (p Pattern) valid() bool {
	switch p {
	case SeqRead, SeqWrite, RandRead, RandWrite, Mixed:
		return true
	}
	return false
}

func (p Pattern) sequential() bool { return p == SeqRead || p == SeqWrite }

// Target is one device under load and the region of it to use.
type Target struct {
	// ID names the device in results and in verify headers ("A1",
	// "array-b@A", "frontend:array-b"). It must be unique within a run and
	// the same between the run that writes and the run that verifies.
	ID  string
	Dev blockdev.Device
	// Offset and Length select the region in bytes, both multiples of
	// 4096. Length 0 means up to the end of the device.
	Offset, Length int64
}

// Config describes one load-generator run. The zero value is not valid: set
// Pattern, IOSize, and at least one of Duration, ByteLimit and Passes.
type Config struct {
	Pattern Pattern
	// IOSize is the size of every I/O in bytes: a multiple of the device
	// block size, and of VerifyUnit in verify mode.
	IOSize int
	// QueueDepth is the number of concurrent workers per target (each keeps
	// one I/O in flight). Default 1.
	QueueDepth int
	// ReadFraction is the share of reads for Mixed, in [0, 1].
	ReadFraction float64

	// Stop conditions; the run ends at the first one reached.
	// Duration bounds the wall time.
	Duration time.Duration
	// ByteLimit bounds the bytes issued per target.
	ByteLimit int64
	// Passes bounds how often each worker covers its share of the region:
	// for sequential patterns exactly that many sweeps, for random ones
	// that many times its slot count in I/Os.
	Passes int

	// Interval is the width of a time-series bucket. Default 1 s.
	Interval time.Duration

	// Verify makes writes carry verify blocks (see VerifyUnit) stamped with
	// Generation, and reads check them. A read unit older than
	// MinGeneration counts as stale; an all-zero unit counts as unwritten,
	// which is a failure unless AllowUnwritten.
	Verify         bool
	Generation     uint64
	MinGeneration  uint64
	AllowUnwritten bool

	// TolerateErrors keeps the run going through I/O errors, counting them
	// per interval and recording the first; a worker that hits an error
	// waits ErrorBackoff (default 1 ms) before its next I/O. Without it the
	// first error stops the run and Run returns it.
	TolerateErrors bool
	ErrorBackoff   time.Duration

	// Seed makes random offsets reproducible.
	Seed uint64
	// Now is the clock; default time.Now. Latencies are differences of two
	// Now readings.
	Now func() time.Time
	// Log receives run start/stop and first-error lines; default discards.
	Log *slog.Logger
}

// Sentinel errors of the generator.
var (
	// ErrConfig: the configuration or a target is unusable; the message
	// names the field and value.
	ErrConfig = errors.New("bench: invalid configuration")
	// ErrVerify: a verify-mode run found bad blocks (returned by
	// Result.VerifyErr, not by Run, so a run that tolerates them finishes).
	ErrVerify = errors.New("bench: verification failed")
)

const regionAlign = 4096

func (c *Config) check(targets []Target) error {
	if !c.Pattern.valid() {
		return fmt.Errorf("pattern %q: want one of seq-read, seq-write, rand-read, rand-write, mixed: %w", c.Pattern, ErrConfig)
	}
	if c.IOSize <= 0 || c.IOSize%512 != 0 {
		return fmt.Errorf("I/O size %d: want a positive multiple of 512: %w", c.IOSize, ErrConfig)
	}
	if c.Verify && c.IOSize%VerifyUnit != 0 {
		return fmt.Errorf("I/O size %d: verify mode needs a multiple of %d: %w", c.IOSize, VerifyUnit, ErrConfig)
	}
	if c.QueueDepth < 0 {
		return fmt.Errorf("queue depth %d: want at least 1: %w", c.QueueDepth, ErrConfig)
	}
	if c.ReadFraction < 0 || c.ReadFraction > 1 {
		return fmt.Errorf("read fraction %g: want a value in [0, 1]: %w", c.ReadFraction, ErrConfig)
	}
	if c.Duration <= 0 && c.ByteLimit <= 0 && c.Passes <= 0 {
		return fmt.Errorf("no stop condition: set Duration, ByteLimit or Passes: %w", ErrConfig)
	}
	if len(targets) == 0 {
		return fmt.Errorf("no targets: give at least one device: %w", ErrConfig)
	}
	seen := map[string]bool{}
	for _, t := range targets {
		if t.Dev == nil {
			return fmt.Errorf("target %q has no device: %w", t.ID, ErrConfig)
		}
		if seen[t.ID] {
			return fmt.Errorf("target id %q used twice: ids must be unique in a run: %w", t.ID, ErrConfig)
		}
		seen[t.ID] = true
		bs := t.Dev.BlockSize()
		if bs <= 0 || regionAlign%bs != 0 || c.IOSize%bs != 0 {
			return fmt.Errorf("target %q: block size %d must divide both 4096 and the I/O size %d: %w", t.ID, bs, c.IOSize, ErrConfig)
		}
		if t.Offset < 0 || t.Length < 0 || t.Offset%regionAlign != 0 || t.Length%regionAlign != 0 {
			return fmt.Errorf("target %q: region offset %d length %d must be non-negative multiples of 4096: %w", t.ID, t.Offset, t.Length, ErrConfig)
		}
		size := t.Dev.Size()
		l := t.Length
		if l == 0 {
			l = (size - t.Offset) / regionAlign * regionAlign
		}
		if t.Offset+l > size {
			return fmt.Errorf("target %q: region [%d, %d) extends past the device size %d: %w", t.ID, t.Offset, t.Offset+l, size, ErrConfig)
		}
		if l < int64(c.IOSize) {
			return fmt.Errorf("target %q: region of %d bytes is smaller than one %d-byte I/O: %w", t.ID, l, c.IOSize, ErrConfig)
		}
	}
	return nil
}

func (c *Config) logger() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}
