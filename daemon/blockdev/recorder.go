package blockdev

import (
	"fmt"
	"strings"
	"sync"
)

// Event is one request seen by a Recorder.
type Event struct {
	Op       Op
	FUA      bool // a write made with WriteAtFUA
	Off, Len int64
	Err      error // what the device returned
}

// String formats the event as one line: "write off=4096 len=8192",
// "write-fua off=0 len=4096", "flush", "zeroes off=0 len=65536",
// "discard off=0 len=65536", with " err=..." appended when it failed.
func (e Event) String() string {
	var s string
	switch {
	case e.Op == OpFlush:
		s = "flush"
	case e.Op == OpWrite && e.FUA:
		s = fmt.Sprintf("write-fua off=%d len=%d", e.Off, e.Len)
	default:
		s = fmt.Sprintf("%s off=%d len=%d", e.Op, e.Off, e.Len)
	}
	if e.Err != nil {
		s += " err=" + e.Err.Error()
	}
	return s
}

// Recorder wraps a Device and records, in completion order, every request
// that changes the medium or its durability: writes, flushes, zeroes and
// discards (reads are passed through unrecorded). Tests use it to show the
// order of writes and flushes as text. Safe for concurrent use.
//
// Recorder always implements FUAWriter, like Fault.
type Recorder struct {
	dev    Device
	mu     sync.Mutex
	events []Event
}

// NewRecorder wraps dev with an empty record.
func NewRecorder(dev Device) *Recorder { return &Recorder{dev: dev} }

func (r *Recorder) add(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Events returns a copy of the record.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// Reset empties the record.
func (r *Recorder) Reset() {
	r.mu.Lock()
	r.events = nil
	r.mu.Unlock()
}

// String returns the record, one event per line, each line ending in "\n".
func (r *Recorder) String() string {
	var b strings.Builder
	for _, e := range r.Events() {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Inner returns the wrapped device.
func (r *Recorder) Inner() Device { return r.dev }

// ReadAt implements Device (not recorded).
func (r *Recorder) ReadAt(p []byte, off int64) (int, error) { return r.dev.ReadAt(p, off) }

// WriteAt implements Device.
func (r *Recorder) WriteAt(p []byte, off int64) (int, error) {
	n, err := r.dev.WriteAt(p, off)
	r.add(Event{Op: OpWrite, Off: off, Len: int64(len(p)), Err: err})
	return n, err
}

// WriteAtFUA implements FUAWriter. When the inner device has no FUA it
// writes and flushes, and records that as one write-fua event.
func (r *Recorder) WriteAtFUA(p []byte, off int64) (int, error) {
	var n int
	var err error
	if w, ok := r.dev.(FUAWriter); ok {
		n, err = w.WriteAtFUA(p, off)
	} else if n, err = r.dev.WriteAt(p, off); err == nil {
		err = r.dev.Flush()
	}
	r.add(Event{Op: OpWrite, FUA: true, Off: off, Len: int64(len(p)), Err: err})
	return n, err
}

// Flush implements Device.
func (r *Recorder) Flush() error {
	err := r.dev.Flush()
	r.add(Event{Op: OpFlush, Err: err})
	return err
}

// WriteZeroes implements Device.
func (r *Recorder) WriteZeroes(off, length int64) error {
	err := r.dev.WriteZeroes(off, length)
	r.add(Event{Op: OpZeroes, Off: off, Len: length, Err: err})
	return err
}

// Discard implements Device.
func (r *Recorder) Discard(off, length int64) error {
	err := r.dev.Discard(off, length)
	r.add(Event{Op: OpDiscard, Off: off, Len: length, Err: err})
	return err
}

// Size implements Device.
func (r *Recorder) Size() int64 { return r.dev.Size() }

// BlockSize implements Device.
func (r *Recorder) BlockSize() int { return r.dev.BlockSize() }

// Close implements Device (not recorded).
func (r *Recorder) Close() error { return r.dev.Close() }

var (
	_ Device    = (*Mem)(nil)
	_ FUAWriter = (*Mem)(nil)
	_ Device    = (*Fault)(nil)
	_ FUAWriter = (*Fault)(nil)
	_ Device    = (*Recorder)(nil)
	_ FUAWriter = (*Recorder)(nil)
)
