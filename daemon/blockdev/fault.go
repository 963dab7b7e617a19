package blockdev

import (
	"fmt"
	"sync"
	"time"
)

// Op names a kind of request, for fault rules and recorded events.
type Op int

// Request kinds. OpAny matches every kind in a Rule.
const (
	OpAny     Op = iota
	OpRead       // ReadAt
	OpWrite      // WriteAt and WriteAtFUA
	OpFlush      // Flush
	OpZeroes     // WriteZeroes
	OpDiscard    // Discard
)

func (o Op) String() string {
	switch o {
	case OpAny:
		return "any"
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpFlush:
		return "flush"
	case OpZeroes:
		return "zeroes"
	case OpDiscard:
		return "discard"
	}
	return fmt.Sprintf("op(%d)", int(o))
}

// Action is what a matching Rule does to a request.
type Action int

// Fault actions.
const (
	// Fail fails the request with Rule.Err (ErrIO when nil) without
	// passing it to the device underneath.
	Fail Action = iota
	// Delay waits Rule.Delay (or until ClearRules) and then lets the
	// request proceed, subject to the remaining rules.
	Delay
	// Corrupt flips every bit of the first byte of each block of a read's
	// data (after the device returned it) or of a write's data (in a copy,
	// before it reaches the device) inside the rule's range. It has no
	// effect on flush, zeroes and discard requests.
	Corrupt
)

func (a Action) String() string {
	switch a {
	case Fail:
		return "fail"
	case Delay:
		return "delay"
	case Corrupt:
		return "corrupt"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// Rule selects requests and says what to do to them.
type Rule struct {
	// Op selects the kind of request; OpAny matches all.
	Op Op
	// Off and Len select requests that overlap [Off, Off+Len). Len 0
	// matches every offset. Flush requests have no range and match any
	// Off/Len.
	Off, Len int64
	// Action is what to do.
	Action Action
	// Err is the error a Fail action returns; nil means ErrIO. It is
	// wrapped with the request's values.
	Err error
	// Delay is how long a Delay action waits.
	Delay time.Duration
	// After skips the first After matching requests.
	After int
	// Count is how many times the action fires after that; 0 is forever.
	Count int
}

type faultRule struct {
	Rule
	seen, fired int
}

// Fault wraps a Device and injects failures, delays and corruption chosen
// by rules. Rules are checked in the order they were added; every matching
// rule counts the request; delays and corruption accumulate, and the first
// matching Fail rule ends the request. Safe for concurrent use; rules may
// change while requests are in flight.
//
// Fault always implements FUAWriter: it calls the inner device's
// WriteAtFUA, or WriteAt followed by Flush when the inner device has none.
type Fault struct {
	dev   Device
	mu    sync.Mutex
	rules []*faultRule
	fired int
	wake  chan struct{} // closed by ClearRules to end pending delays
}

// NewFault wraps dev with no rules: every request passes through.
func NewFault(dev Device) *Fault {
	return &Fault{dev: dev, wake: make(chan struct{})}
}

// AddRule appends a rule.
func (f *Fault) AddRule(r Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &faultRule{Rule: r})
}

// ClearRules removes every rule and ends every delay in progress.
func (f *Fault) ClearRules() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
	close(f.wake)
	f.wake = make(chan struct{})
}

// Fired returns how many times any rule's action has fired.
func (f *Fault) Fired() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// Inner returns the wrapped device.
func (f *Fault) Inner() Device { return f.dev }

// verdict is what the rules decided for one request.
type verdict struct {
	err     error
	delay   time.Duration
	corrupt []Rule // corrupt rules that fired (for their ranges)
	wake    chan struct{}
}

func (f *Fault) decide(op Op, off, length int64) verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	v := verdict{wake: f.wake}
	for _, r := range f.rules {
		if r.Op != OpAny && r.Op != op {
			continue
		}
		if op != OpFlush && r.Len != 0 && (off+length <= r.Off || off >= r.Off+r.Len) {
			continue
		}
		r.seen++
		if r.seen <= r.After || (r.Count > 0 && r.fired >= r.Count) {
			continue
		}
		r.fired++
		f.fired++
		switch r.Action {
		case Fail:
			err := r.Err
			if err == nil {
				err = ErrIO
			}
			v.err = fmt.Errorf("injected fault on %s off=%d len=%d: %w", op, off, length, err)
			return v
		case Delay:
			v.delay += r.Delay
		case Corrupt:
			v.corrupt = append(v.corrupt, r.Rule)
		}
	}
	return v
}

// wait sleeps for the delay, cut short by ClearRules.
func (v verdict) wait() {
	if v.delay <= 0 {
		return
	}
	t := time.NewTimer(v.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-v.wake:
	}
}

// corruptData flips the first byte of each block of p (at device offset off)
// that lies inside a fired corrupt rule's range.
func (v verdict) corruptData(p []byte, off int64, bs int) {
	for _, r := range v.corrupt {
		for i := 0; i < len(p); i += bs {
			o := off + int64(i)
			if r.Len == 0 || (o+int64(bs) > r.Off && o < r.Off+r.Len) {
				p[i] ^= 0xff
			}
		}
	}
}

func (f *Fault) pre(op Op, off, length int64) verdict {
	v := f.decide(op, off, length)
	if v.err == nil {
		v.wait()
	}
	return v
}

// ReadAt implements Device.
func (f *Fault) ReadAt(p []byte, off int64) (int, error) {
	v := f.pre(OpRead, off, int64(len(p)))
	if v.err != nil {
		return 0, v.err
	}
	n, err := f.dev.ReadAt(p, off)
	v.corruptData(p[:n], off, f.dev.BlockSize())
	return n, err
}

func (f *Fault) write(p []byte, off int64, fua bool) (int, error) {
	v := f.pre(OpWrite, off, int64(len(p)))
	if v.err != nil {
		return 0, v.err
	}
	if len(v.corrupt) > 0 {
		q := AlignedBuffer(len(p))
		copy(q, p)
		v.corruptData(q, off, f.dev.BlockSize())
		p = q
	}
	if !fua {
		return f.dev.WriteAt(p, off)
	}
	if w, ok := f.dev.(FUAWriter); ok {
		return w.WriteAtFUA(p, off)
	}
	n, err := f.dev.WriteAt(p, off)
	if err != nil {
		return n, err
	}
	return n, f.dev.Flush()
}

// WriteAt implements Device.
func (f *Fault) WriteAt(p []byte, off int64) (int, error) { return f.write(p, off, false) }

// WriteAtFUA implements FUAWriter.
func (f *Fault) WriteAtFUA(p []byte, off int64) (int, error) { return f.write(p, off, true) }

// Flush implements Device.
func (f *Fault) Flush() error {
	if v := f.pre(OpFlush, 0, 0); v.err != nil {
		return v.err
	}
	return f.dev.Flush()
}

// WriteZeroes implements Device.
func (f *Fault) WriteZeroes(off, length int64) error {
	if v := f.pre(OpZeroes, off, length); v.err != nil {
		return v.err
	}
	return f.dev.WriteZeroes(off, length)
}

// Discard implements Device.
func (f *Fault) Discard(off, length int64) error {
	if v := f.pre(OpDiscard, off, length); v.err != nil {
		return v.err
	}
	return f.dev.Discard(off, length)
}

// Size implements Device.
func (f *Fault) Size() int64 { return f.dev.Size() }

// BlockSize implements Device.
func (f *Fault) BlockSize() int { return f.dev.BlockSize() }

// Close implements Device; it closes the inner device. Rules do not apply.
func (f *Fault) Close() error { return f.dev.Close() }
