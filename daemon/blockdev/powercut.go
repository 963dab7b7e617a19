package blockdev

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// PowerCut wraps a Device to model a drive's volatile write cache for
// power-loss tests. Writes that are neither flushed (Flush) nor Force Unit
// Access (WriteAtFUA) are kept apart from the device underneath, in this
// process's memory; reads see them at once. Flush writes them through and
// flushes the device underneath; a FUA write goes straight through with
// FUA. Cut drops every write kept apart, as a power loss would.
//
// For a real process the cut is kill -9: the kept-apart writes live only
// in the process's memory, so after a kill -9 and a restart every write
// that was not flushed or FUA is gone, and everything that was is on the
// device underneath (which Flush has synced).
//
// Like a real drive, PowerCut may destage on its own: when more than
// Limit blocks are kept apart it writes them all through (without a
// flush of the device underneath, which is then the device's business).
//
// For tests of slow and failing drives it also injects a delay before
// every request, or fails every request with ErrIO (SetFault), set by a
// test or read from a control file (Watch). With WriteThrough it keeps
// nothing apart and only injects those faults.
//
// Safe for concurrent use; concurrent overlapping writes have no defined
// order (the Device contract).
type PowerCut struct {
	dev Device
	bs  int64
	// Limit is how many blocks may be kept apart before PowerCut
	// destages them (default 16384: 64 MiB of 4 KiB blocks).
	Limit int
	// WriteThrough passes every write straight through (no power-loss
	// model); set it before use.
	WriteThrough bool

	fmu      sync.Mutex
	delay    time.Duration
	failErr  error
	stopOnce sync.Once
	stop     chan struct{}

	flushMu sync.Mutex // one Flush (or destage) at a time
	mu      sync.RWMutex
	overlay map[int64]*[]byte // block -> content kept apart; nil slice: zeroes
	cuts    int
}

// NewPowerCut wraps dev; nothing is kept apart yet.
func NewPowerCut(dev Device) *PowerCut {
	return &PowerCut{dev: dev, bs: int64(dev.BlockSize()), Limit: 16384, overlay: map[int64]*[]byte{}, stop: make(chan struct{})}
}

// SetFault makes every later request wait delay and then, when fail is
// set, fail with an error wrapping ErrIO. SetFault(0, false) clears it.
func (p *PowerCut) SetFault(delay time.Duration, fail bool) {
	p.fmu.Lock()
	defer p.fmu.Unlock()
	p.delay, p.failErr = delay, nil
	if fail {
		p.failErr = fmt.Errorf("power-cut device: injected media error: %w", ErrIO)
	}
}

// ParseFault reads a control file's text: empty (no fault), "slow D" (a
// delay D before every request, a time.Duration) or "error" (every
// request fails).
func ParseFault(text string) (time.Duration, bool, error) {
	f := strings.Fields(text)
	switch {
	case len(f) == 0:
		return 0, false, nil
	case f[0] == "error" && len(f) == 1:
		return 0, true, nil
	case f[0] == "slow" && len(f) == 2:
		d, err := time.ParseDuration(f[1])
		if err != nil || d < 0 {
			return 0, false, fmt.Errorf("fault %q: bad delay: want e.g. \"slow 500ms\"", text)
		}
		return d, false, nil
	}
	return 0, false, fmt.Errorf("fault %q unknown; expected empty, \"slow DURATION\" or \"error\"", text)
}

// Watch applies the fault named in the file at path (ParseFault; a
// missing file is no fault) every 100 ms until Close.
func (p *PowerCut) Watch(path string) {
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		last := "\x00"
		for {
			b, err := os.ReadFile(path)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				b = nil
			}
			if s := string(b); s != last {
				last = s
				if d, fail, err := ParseFault(s); err == nil {
					p.SetFault(d, fail)
				}
			}
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// fault applies the injected delay and error.
func (p *PowerCut) fault() error {
	p.fmu.Lock()
	d, err := p.delay, p.failErr
	p.fmu.Unlock()
	if d > 0 {
		select {
		case <-time.After(d):
		case <-p.stop:
		}
	}
	return err
}

// Inner returns the wrapped device.
func (p *PowerCut) Inner() Device { return p.dev }

// Size implements Device.
func (p *PowerCut) Size() int64 { return p.dev.Size() }

// BlockSize implements Device.
func (p *PowerCut) BlockSize() int { return p.dev.BlockSize() }

// Close implements Device: the kept-apart writes are dropped (a clean
// shutdown flushes first).
func (p *PowerCut) Close() error {
	p.stopOnce.Do(func() { close(p.stop) })
	p.Cut()
	return p.dev.Close()
}

// Unflushed is the number of blocks kept apart now.
func (p *PowerCut) Unflushed() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.overlay)
}

// Cuts is how many times Cut ran.
func (p *PowerCut) Cuts() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.cuts
}

// Cut loses every write that was not flushed or FUA.
func (p *PowerCut) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.overlay = map[int64]*[]byte{}
	p.cuts++
}

// ReadAt implements Device: the device's content with the kept-apart
// writes on top.
func (p *PowerCut) ReadAt(b []byte, off int64) (int, error) {
	if err := CheckRange(off, int64(len(b)), p.Size(), p.BlockSize()); err != nil {
		return 0, fmt.Errorf("power-cut device: %w", err)
	}
	if err := p.fault(); err != nil {
		return 0, err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	n, err := p.dev.ReadAt(b, off)
	if err != nil {
		return n, err
	}
	if len(p.overlay) == 0 {
		return n, nil
	}
	for blk := off / p.bs; blk < (off+int64(len(b)))/p.bs; blk++ {
		if d, ok := p.overlay[blk]; ok {
			dst := b[blk*p.bs-off : (blk+1)*p.bs-off]
			if *d == nil {
				clear(dst)
			} else {
				copy(dst, *d)
			}
		}
	}
	return n, nil
}

// keep stores b (nil: zeroes) over [off, off+length) apart from the device.
func (p *PowerCut) keep(b []byte, off, length int64) error {
	if err := CheckRange(off, length, p.Size(), p.BlockSize()); err != nil {
		return fmt.Errorf("power-cut device: %w", err)
	}
	if err := p.fault(); err != nil {
		return err
	}
	if p.WriteThrough {
		switch {
		case b != nil:
			_, err := p.dev.WriteAt(b, off)
			return err
		default:
			return p.dev.WriteZeroes(off, length)
		}
	}
	p.mu.Lock()
	for blk := off / p.bs; blk < (off+length)/p.bs; blk++ {
		var d []byte
		if b != nil {
			d = append([]byte(nil), b[blk*p.bs-off:(blk+1)*p.bs-off]...)
		}
		p.overlay[blk] = &d
	}
	over := len(p.overlay) > p.Limit
	p.mu.Unlock()
	if over {
		return p.writeBack()
	}
	return nil
}

// WriteAt implements Device: the write is kept apart until Flush.
func (p *PowerCut) WriteAt(b []byte, off int64) (int, error) {
	if err := p.keep(b, off, int64(len(b))); err != nil {
		return 0, err
	}
	return len(b), nil
}

// WriteZeroes implements Device: kept apart until Flush, like a write.
func (p *PowerCut) WriteZeroes(off, length int64) error { return p.keep(nil, off, length) }

// Discard implements Device: kept apart until Flush, like a write of
// zeroes.
func (p *PowerCut) Discard(off, length int64) error { return p.keep(nil, off, length) }

// WriteAtFUA implements FUAWriter: the write goes through to the device
// with FUA (or a write and a flush) and is durable when it returns.
func (p *PowerCut) WriteAtFUA(b []byte, off int64) (int, error) {
	if err := CheckRange(off, int64(len(b)), p.Size(), p.BlockSize()); err != nil {
		return 0, fmt.Errorf("power-cut device: %w", err)
	}
	if err := p.fault(); err != nil {
		return 0, err
	}
	// No write-back may run meanwhile (it could put an older kept-apart
	// block over this one), and no read may see the older kept-apart
	// block over the newer durable one.
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int
	var err error
	if f, ok := p.dev.(FUAWriter); ok {
		n, err = f.WriteAtFUA(b, off)
	} else if n, err = p.dev.WriteAt(b, off); err == nil {
		err = p.dev.Flush()
	}
	if err != nil {
		return n, err
	}
	for blk := off / p.bs; blk < (off+int64(len(b)))/p.bs; blk++ {
		delete(p.overlay, blk)
	}
	return n, nil
}

// Flush implements Device: every write kept apart when it was called is
// written through, then the device is flushed.
func (p *PowerCut) Flush() error {
	if err := p.fault(); err != nil {
		return err
	}
	if err := p.writeBack(); err != nil {
		return err
	}
	return p.dev.Flush()
}

// writeBack writes the kept-apart blocks through, in runs, and forgets
// those not rewritten meanwhile.
func (p *PowerCut) writeBack() error {
	p.flushMu.Lock()
	defer p.flushMu.Unlock()
	p.mu.RLock()
	snap := make(map[int64]*[]byte, len(p.overlay))
	for k, v := range p.overlay {
		snap[k] = v
	}
	p.mu.RUnlock()
	blks := make([]int64, 0, len(snap))
	for k := range snap {
		blks = append(blks, k)
	}
	sort.Slice(blks, func(i, j int) bool { return blks[i] < blks[j] })
	for i := 0; i < len(blks); {
		j := i + 1
		for j < len(blks) && blks[j] == blks[j-1]+1 && j-i < 256 {
			j++
		}
		buf := make([]byte, int64(j-i)*p.bs)
		for k := i; k < j; k++ {
			if d := *snap[blks[k]]; d != nil {
				copy(buf[int64(k-i)*p.bs:], d)
			}
		}
		if _, err := p.dev.WriteAt(buf, blks[i]*p.bs); err != nil {
			return fmt.Errorf("power-cut device: writing back blocks %d..%d: %w", blks[i], blks[j-1], err)
		}
		i = j
	}
	p.mu.Lock()
	for k, v := range snap {
		if p.overlay[k] == v {
			delete(p.overlay, k)
		}
	}
	p.mu.Unlock()
	return nil
}
