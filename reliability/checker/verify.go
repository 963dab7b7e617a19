package checker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"tier0/bench"
	"tier0/reliability/history"
)

// Report is the outcome of verifying units (Verify), or of the read-backs
// during a workload (Online).
type Report struct {
	// Acked writes acknowledged in all (copied from Progress); Failed
	// writes whose outcome was unknown.
	Acked, Failed int64 `json:"-"`
	// Checked units read and classified.
	Checked int64 `json:"checked"`
	// Verified units that hold what they must: their newest acknowledged
	// generation, or (InFlightLanded, counted here too) a newer one that
	// was in flight, or nothing when no write to them was acknowledged.
	Verified int64 `json:"verified"`
	// InFlightLanded units hold a generation newer than the newest
	// acknowledged one, from a write whose outcome was unknown (allowed).
	InFlightLanded int64 `json:"inflight_landed"`
	// Lost units read back as never written although a write to them was
	// acknowledged. Must be 0.
	Lost int64 `json:"lost"`
	// Stale units hold a valid block of an older generation than their
	// newest acknowledged one: an acknowledged write was lost, or a late
	// write (a fenced owner's) landed after it. Must be 0.
	Stale int64 `json:"stale"`
	// Corrupt units are torn (bad CRC), garbage (no magic), misplaced (a
	// valid block of another device or unit), or hold a generation that
	// was never written there. Must be 0.
	Corrupt int64 `json:"corrupt"`
	// Unreadable units could not be read (after retries). Must be 0 once
	// the cluster has recovered.
	Unreadable int64 `json:"unreadable"`
	// Problems describes the first problems found.
	Problems []string `json:"problems,omitempty"`
}

// OK reports whether nothing was lost, stale, corrupt or unreadable.
func (r Report) OK() bool { return r.Lost == 0 && r.Stale == 0 && r.Corrupt == 0 && r.Unreadable == 0 }

// ErrViolation is returned (wrapped) by Report.Err when a report holds a
// lost, stale, corrupt or unreadable unit.
var ErrViolation = errors.New("acknowledged-write check failed")

// Err is nil for a clean report, else an error wrapping ErrViolation that
// states the counts and the first problem.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}
	first := ""
	if len(r.Problems) > 0 {
		first = "; first: " + r.Problems[0]
	}
	return fmt.Errorf("%d lost, %d stale, %d corrupt, %d unreadable of %d units checked%s: %w",
		r.Lost, r.Stale, r.Corrupt, r.Unreadable, r.Checked, first, ErrViolation)
}

// String is a one-line summary.
func (r Report) String() string {
	return fmt.Sprintf("checked %d verified %d (in-flight landed %d) lost %d stale %d corrupt %d unreadable %d",
		r.Checked, r.Verified, r.InFlightLanded, r.Lost, r.Stale, r.Corrupt, r.Unreadable)
}

func (c *Checker) problem(r *Report, format string, args ...any) {
	if len(r.Problems) < c.opts.MaxProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// classify checks one unit's content against its record and counts it in
// r. online: a read-back during the workload (same rules).
func (c *Checker) classify(r *Report, t *target, i int, u []byte, online bool) {
	r.Checked++
	st := &t.units[i]
	lba := t.lba(i)
	where := fmt.Sprintf("%s unit %d (byte %d)", t.Name, i, t.Offset+int64(i)*UnitSize)
	if online {
		where = fmt.Sprintf("read-back at +%.1fs of %s", time.Since(c.born).Seconds(), where)
	}
	gen := binary.LittleEndian.Uint64(u[24:32])
	switch err := bench.CheckUnit(u, t.id, lba, 0); {
	case errors.Is(err, bench.ErrVerifyUnwritten):
		if st.acked == 0 {
			r.Verified++
			return
		}
		r.Lost++
		c.problem(r, "%s: reads as never written, but generation %d was acknowledged", where, st.acked)
		return
	case errors.Is(err, bench.ErrVerifyCorrupt):
		r.Corrupt++
		c.problem(r, "%s: torn or garbage (bad magic or CRC32C); newest acknowledged generation %d, in flight %v", where, st.acked, st.pending)
		return
	case errors.Is(err, bench.ErrVerifyMisplaced):
		r.Corrupt++
		c.problem(r, "%s: holds a block written for device %#x LBA %d", where,
			binary.LittleEndian.Uint64(u[8:16]), binary.LittleEndian.Uint64(u[16:24]))
		return
	case err != nil:
		r.Corrupt++
		c.problem(r, "%s: %v", where, err)
		return
	}
	switch {
	case gen == st.acked:
		r.Verified++
	case gen < st.acked:
		r.Stale++
		c.problem(r, "%s: holds generation %d, older than the acknowledged generation %d", where, gen, st.acked)
	case slices.Contains(st.pending, gen):
		r.Verified++
		r.InFlightLanded++
	default:
		r.Corrupt++
		c.problem(r, "%s: holds generation %d, which was never written there (acknowledged %d, in flight %v)", where, gen, st.acked, st.pending)
	}
}

// classifyShared checks unit i's content u, read while other workers may
// have been writing it, against snap, the newest generation acknowledged
// before the read was issued; gen is u's history value.
func (c *Checker) classifyShared(r *Report, t *target, i int, u []byte, snap, gen uint64) {
	r.Checked++
	where := fmt.Sprintf("read at +%.1fs of %s unit %d (byte %d)", time.Since(c.born).Seconds(), t.Name, i, t.Offset+int64(i)*UnitSize)
	switch {
	case gen == history.Unwritten && snap != 0:
		r.Lost++
		c.problem(r, "%s: reads as never written, but generation %d was acknowledged before the read was issued", where, snap)
	case gen == history.Torn:
		r.Corrupt++
		c.problem(r, "%s: torn or garbage (bad magic or CRC32C); generation %d was acknowledged before the read", where, snap)
	case gen == history.Foreign:
		r.Corrupt++
		c.problem(r, "%s: holds a block written for device %#x LBA %d", where,
			binary.LittleEndian.Uint64(u[8:16]), binary.LittleEndian.Uint64(u[16:24]))
	case gen < snap:
		r.Stale++
		c.problem(r, "%s: returns generation %d, older than generation %d acknowledged before the read was issued", where, gen, snap)
	default:
		// Newer ones are checked against the writes by the history.
		r.Verified++
	}
}

// VerifyOptions tune Verify.
type VerifyOptions struct {
	// ReadRetries is how often a failed read is retried (default 5), with
	// RetryDelay between tries (default 1 s): the cluster may still be
	// finishing a failover.
	ReadRetries int
	RetryDelay  time.Duration
	// ChunkUnits is how many units one read covers (default 64).
	ChunkUnits int
}

// Verify reads every unit of every target and checks it against the
// record. It must not run while Run does. Blocks that cannot be read after
// the retries count as Unreadable; once a read of a target failed every
// retry, the rest of that target counts as unreadable without being read
// (a device with no path may hold every read for a long time). The
// returned error is only ctx's.
func (c *Checker) Verify(ctx context.Context, vo VerifyOptions) (Report, error) {
	c.running.Lock()
	defer c.running.Unlock()
	if vo.ReadRetries <= 0 {
		vo.ReadRetries = 5
	}
	if vo.RetryDelay <= 0 {
		vo.RetryDelay = time.Second
	}
	if vo.ChunkUnits <= 0 {
		vo.ChunkUnits = 64
	}
	r := Report{Acked: c.acked.Load(), Failed: c.failed.Load()}
	buf := make([]byte, vo.ChunkUnits*UnitSize)
	for _, t := range c.targets {
		retries := vo.ReadRetries
		dead := false
		for first := 0; first < t.Units; first += vo.ChunkUnits {
			n := min(vo.ChunkUnits, t.Units-first)
			b := buf[:n*UnitSize]
			if dead {
				// One read already failed every retry: the rest of the
				// device counts as unreadable without waiting more.
				r.Unreadable += int64(n)
				r.Checked += int64(n)
				continue
			}
			var err error
			var call int64
			for try := 0; ; try++ {
				call = c.hist.Now()
				if _, err = t.Dev.ReadAt(b, t.Offset+int64(first)*UnitSize); err == nil || try >= retries {
					break
				}
				select {
				case <-ctx.Done():
					return r, ctx.Err()
				case <-time.After(vo.RetryDelay):
				}
			}
			if err != nil {
				dead = true
				r.Unreadable += int64(n)
				r.Checked += int64(n)
				c.problem(&r, "%s units %d..%d: unreadable: %v", t.Name, first, first+n-1, err)
				continue
			}
			ret := c.hist.Now()
			ops := make([]history.Op, n)
			for i := range n {
				u := b[i*UnitSize : (i+1)*UnitSize]
				c.classify(&r, t, first+i, u, false)
				ops[i] = history.Op{Target: t.idx, Unit: int32(first + i), Kind: history.Read, Value: t.value(first+i, u), Client: -1, Call: call, Return: ret}
			}
			c.hist.Add(ops...)
		}
	}
	return r, nil
}

// Online returns what the read-backs during Run found.
func (c *Checker) Online() Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.online
	r.Problems = slices.Clone(r.Problems)
	return r
}

// Summary is a multi-line description of the record: per target, units
// with an acknowledged write and units with writes in flight.
func (c *Checker) Summary() string {
	var b strings.Builder
	for _, t := range c.targets {
		acked, pend := 0, 0
		t.mu.Lock()
		for i := range t.units {
			if t.units[i].acked != 0 {
				acked++
			}
			if len(t.units[i].pending) > 0 {
				pend++
			}
		}
		t.mu.Unlock()
		fmt.Fprintf(&b, "%s: %d units, %d with an acknowledged write, %d with a write of unknown outcome\n", t.Name, t.Units, acked, pend)
	}
	return b.String()
}
