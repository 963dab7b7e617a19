package history

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is an operation's kind.
type Kind uint8

const (
	Read Kind = iota
	Write
)

func (k Kind) String() string {
	if k == Write {
		return "write"
	}
	return "read"
}

// Outcome is how an operation ended.
type Outcome uint8

const (
	// OK: acknowledged (a write) or returned data (a read).
	OK Outcome = iota
	// Unknown: a write that returned an error; it may or may not have
	// landed.
	Unknown
)

// Special read values.
const (
	// Unwritten is the value of a unit that reads as zeroes.
	Unwritten uint64 = 0
	// Torn is a block that fails its CRC or has no magic.
	Torn uint64 = math.MaxUint64
	// Foreign is a valid block written for another device or unit.
	Foreign uint64 = math.MaxUint64 - 1
)

// Op is one operation on one unit. A write of n units is n operations
// with the same times.
type Op struct {
	Target int32 // index into the recorder's target names
	Unit   int32
	Kind   Kind
	// Value is the generation written, or the one read (Unwritten, Torn
	// and Foreign are read values).
	Value uint64
	// Client is the worker that issued it (-1: the final verification).
	Client int32
	// Call and Return are nanoseconds since the recorder was created.
	Call, Return int64
	Outcome      Outcome
}

// Event is one entry of the fault timeline.
type Event struct {
	At   int64 // ns since the recorder was created
	Text string
}

// Recorder collects operations and fault events. It is safe for
// concurrent use.
type Recorder struct {
	born    time.Time
	targets []string

	mu     sync.Mutex
	ops    []Op
	events []Event
}

// NewRecorder starts a record over the named targets (Op.Target indexes
// them).
func NewRecorder(targets []string) *Recorder {
	return &Recorder{born: time.Now(), targets: slices.Clone(targets)}
}

// Now is the recorder's clock: monotonic nanoseconds since it was created.
func (r *Recorder) Now() int64 { return int64(time.Since(r.born)) }

// Born is when the recorder's clock started.
func (r *Recorder) Born() time.Time { return r.born }

// Targets names the targets.
func (r *Recorder) Targets() []string { return slices.Clone(r.targets) }

// Add records operations.
func (r *Recorder) Add(ops ...Op) {
	r.mu.Lock()
	r.ops = append(r.ops, ops...)
	r.mu.Unlock()
}

// Note records a fault event now (for reports).
func (r *Recorder) Note(format string, args ...any) {
	e := Event{At: r.Now(), Text: fmt.Sprintf(format, args...)}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Ops returns a copy of the operations recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Events returns a copy of the fault timeline.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Len is the number of operations recorded.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops)
}

// Anomaly kinds.
const (
	Lost             = "lost"
	Stale            = "stale"
	Resurrected      = "resurrected"
	Corrupt          = "corrupt"
	Nonlinearizable  = "nonlinearizable"
	CheckTimeoutKind = "check-timeout" // porcupine gave up: not proven either way
)

// Anomaly is one unit whose history breaks the model.
type Anomaly struct {
	Kind   string `json:"kind"`
	Target string `json:"target"`
	Unit   int    `json:"unit"`
	// Op is the read that shows it (zero for Nonlinearizable).
	Op Op `json:"op"`
	// Detail says what was expected.
	Detail string `json:"detail"`
	// Around are the unit's operations near Op, by invoke time.
	Around []Op `json:"around"`
}

// Result is the outcome of Check.
type Result struct {
	// Ops checked and Units (registers) they touched.
	Ops   int `json:"ops"`
	Units int `json:"units"`
	// Linearizable is porcupine's verdict on the whole history (false
	// also when it timed out: see TimedOut).
	Linearizable bool `json:"linearizable"`
	TimedOut     bool `json:"timed_out,omitempty"`
	// Anomalies found (at most Options.MaxAnomalies listed), and the
	// count by kind of all of them.
	Anomalies []Anomaly      `json:"anomalies,omitempty"`
	ByKind    map[string]int `json:"by_kind,omitempty"`
	Elapsed   time.Duration  `json:"elapsed_ns"`
}

// OK reports whether the history is linearizable.
func (r Result) OK() bool { return r.Linearizable && len(r.ByKind) == 0 }

// Options tune Check.
type Options struct {
	// Timeout for porcupine (default 2 min); past it the result is
	// TimedOut and counted as a check-timeout anomaly.
	Timeout time.Duration
	// MaxAnomalies listed in detail (default 20).
	MaxAnomalies int
	// Context is how many of the unit's operations Around holds on each
	// side (default 6).
	Context int
}

type key struct{ t, u int32 }

// input is porcupine's view of an operation.
type input struct {
	write   bool
	unknown bool
	value   uint64
}

// model is the per-unit register with writes of unknown outcome.
var model = (&porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[key][]porcupine.Operation{}
		var keys []key
		for _, op := range h {
			k := op.Metadata.(key)
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{Unwritten} },
	Step: func(state, in, out interface{}) []interface{} {
		s, i := state.(uint64), in.(input)
		switch {
		case i.write && i.unknown:
			if s == i.value {
				return []interface{}{s}
			}
			return []interface{}{s, i.value}
		case i.write:
			return []interface{}{i.value}
		case out.(uint64) == s:
			return []interface{}{s}
		}
		return nil
	},
	Hash: func(state interface{}) uint64 { return state.(uint64) },
	DescribeOperation: func(in, out interface{}) string {
		i := in.(input)
		if i.write {
			return fmt.Sprintf("write %d (unknown %v)", i.value, i.unknown)
		}
		return fmt.Sprintf("read -> %d", out.(uint64))
	},
}).ToModel()

// windows returns each write's effective end: its Return when
// acknowledged, else the Call of the first write to the unit invoked after
// it returned, else the end of time. ops are one unit's, sorted by Call.
func windows(ops []Op) []int64 {
	end := make([]int64, len(ops))
	for i, op := range ops {
		end[i] = op.Return
		if op.Kind != Write || op.Outcome == OK {
			continue
		}
		end[i] = math.MaxInt64
		for j := i + 1; j < len(ops); j++ {
			if ops[j].Kind == Write && ops[j].Call > op.Return {
				// Strictly before it: porcupine's intervals are closed.
				end[i] = ops[j].Call - 1
				break
			}
		}
	}
	return end
}

// Check checks ops (any order) for linearizability per unit and
// classifies what breaks it. targets names Op.Target (nil: numbers).
func Check(ops []Op, targets []string, o Options) Result {
	start := time.Now()
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.MaxAnomalies <= 0 {
		o.MaxAnomalies = 20
	}
	if o.Context <= 0 {
		o.Context = 6
	}
	by := map[key][]Op{}
	for _, op := range ops {
		k := key{op.Target, op.Unit}
		by[k] = append(by[k], op)
	}
	keys := make([]key, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].t != keys[j].t {
			return keys[i].t < keys[j].t
		}
		return keys[i].u < keys[j].u
	})
	res := Result{Ops: len(ops), Units: len(keys), ByKind: map[string]int{}}
	hist := make([]porcupine.Operation, 0, len(ops))
	for _, k := range keys {
		u := by[k]
		sort.SliceStable(u, func(i, j int) bool { return u[i].Call < u[j].Call })
		end := windows(u)
		for i, op := range u {
			hist = append(hist, porcupine.Operation{
				ClientId: int(op.Client) + 1,
				Input:    input{write: op.Kind == Write, unknown: op.Outcome == Unknown, value: op.Value},
				Call:     op.Call,
				Output:   op.Value,
				Return:   end[i],
				Metadata: k,
			})
		}
	}
	verdict := porcupine.CheckOperationsTimeout(model, hist, o.Timeout)
	res.Linearizable = verdict == porcupine.Ok
	res.TimedOut = verdict == porcupine.Unknown
	name := func(t int32) string {
		if int(t) < len(targets) {
			return targets[t]
		}
		return fmt.Sprintf("target%d", t)
	}
	add := func(a Anomaly, u []Op, at int) {
		res.ByKind[a.Kind]++
		if len(res.Anomalies) >= o.MaxAnomalies {
			return
		}
		lo, hi := max(0, at-o.Context), min(len(u), at+o.Context+1)
		a.Around = slices.Clone(u[lo:hi])
		res.Anomalies = append(res.Anomalies, a)
	}
	if res.TimedOut {
		res.ByKind[CheckTimeoutKind]++
	}
	if verdict != porcupine.Illegal {
		// Torn and foreign reads are illegal in the model, so an Ok
		// verdict means there are none.
		res.Elapsed = time.Since(start)
		if len(res.ByKind) == 0 {
			res.ByKind = nil
		}
		return res
	}
	for _, k := range keys {
		u := by[k]
		found := classify(u, func(kind string, at int, detail string) {
			add(Anomaly{Kind: kind, Target: name(k.t), Unit: int(k.u), Op: u[at], Detail: detail}, u, at)
		})
		if found {
			continue
		}
		// Not one of the named patterns: ask porcupine about this unit.
		var one []porcupine.Operation
		for _, op := range hist {
			if op.Metadata.(key) == k {
				one = append(one, op)
			}
		}
		if porcupine.CheckOperationsTimeout(model, one, o.Timeout) == porcupine.Illegal {
			add(Anomaly{Kind: Nonlinearizable, Target: name(k.t), Unit: int(k.u),
				Detail: "no order of these operations explains what the reads returned"}, u, 0)
		}
	}
	res.Elapsed = time.Since(start)
	return res
}

// classify reports the named anomalies of one unit's operations (sorted by
// Call) and whether it found any.
func classify(u []Op, report func(kind string, at int, detail string)) bool {
	end := windows(u)
	// writer of each value
	wr := map[uint64]int{}
	for i, op := range u {
		if op.Kind == Write {
			wr[op.Value] = i
		}
	}
	found := false
	for ri, r := range u {
		if r.Kind != Read {
			continue
		}
		// newestAcked: the latest Call among acknowledged writes that
		// returned before r was invoked; seen: the latest writer Call
		// among values returned by reads that completed before r.
		newestAcked, ackedIdx := int64(math.MinInt64), -1
		newestSeen, seenIdx := int64(math.MinInt64), -1
		for j, op := range u {
			if op.Return >= r.Call {
				continue
			}
			switch {
			case op.Kind == Write && op.Outcome == OK && op.Call > newestAcked:
				newestAcked, ackedIdx = op.Call, j
			case op.Kind == Read:
				if w, ok := wr[op.Value]; ok && u[w].Call > newestSeen {
					newestSeen, seenIdx = u[w].Call, j
				}
			}
		}
		switch v := r.Value; {
		case v == Torn:
			found = true
			report(Corrupt, ri, "torn or garbage block (bad magic or CRC32C)")
		case v == Foreign:
			found = true
			report(Corrupt, ri, "a block written for another device or unit")
		case v == Unwritten:
			if ackedIdx >= 0 {
				found = true
				report(Lost, ri, fmt.Sprintf("reads as never written, but generation %d was acknowledged at %s", u[ackedIdx].Value, ts(u[ackedIdx].Return)))
			} else if seenIdx >= 0 {
				found = true
				report(Resurrected, ri, fmt.Sprintf("reads as never written, but a read completed at %s returned generation %d", ts(u[seenIdx].Return), u[seenIdx].Value))
			}
		default:
			w, ok := wr[v]
			switch {
			case !ok:
				found = true
				report(Corrupt, ri, fmt.Sprintf("generation %d was never written to this unit", v))
			case u[w].Call > r.Return:
				found = true
				report(Corrupt, ri, fmt.Sprintf("generation %d was written only after this read returned (at %s)", v, ts(u[w].Call)))
			case ackedIdx >= 0 && end[w] < newestAcked:
				found = true
				report(Stale, ri, fmt.Sprintf("returns generation %d, but the newer generation %d was acknowledged at %s, before the read was invoked", v, u[ackedIdx].Value, ts(u[ackedIdx].Return)))
			case seenIdx >= 0 && end[w] < newestSeen:
				found = true
				report(Resurrected, ri, fmt.Sprintf("returns generation %d, but a read completed at %s already returned the newer generation %d", v, ts(u[seenIdx].Return), u[seenIdx].Value))
			}
		}
	}
	return found
}

func ts(ns int64) string {
	if ns == math.MaxInt64 {
		return "never"
	}
	return fmt.Sprintf("+%.6fs", float64(ns)/1e9)
}

// String describes one operation with its times.
func (op Op) String() string {
	out := ""
	if op.Kind == Write && op.Outcome == Unknown {
		out = " FAILED (outcome unknown)"
	}
	who := fmt.Sprintf("worker %d", op.Client)
	if op.Client < 0 {
		who = "verify"
	}
	val := fmt.Sprint(op.Value)
	switch op.Value {
	case Torn:
		val = "TORN"
	case Foreign:
		val = "FOREIGN"
	case Unwritten:
		val = "0 (zeroes)"
	}
	return fmt.Sprintf("[%s .. %s] %-8s %-5s gen %s%s", ts(op.Call), ts(op.Return), who, op.Kind, val, out)
}

// Report is the human-readable account of the anomalies: per anomaly the
// unit, the operations around it with their times, then the fault
// timeline and the seed to replay.
func (r Result) Report(events []Event, seed uint64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "history: %d operations on %d units checked in %v; linearizable %v", r.Ops, r.Units, r.Elapsed.Round(time.Millisecond), r.Linearizable)
	if r.TimedOut {
		b.WriteString(" (porcupine timed out: not proven)")
	}
	b.WriteString("\n")
	kinds := make([]string, 0, len(r.ByKind))
	for k := range r.ByKind {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "  anomalies %s: %d\n", k, r.ByKind[k])
	}
	for _, a := range r.Anomalies {
		fmt.Fprintf(&b, "ANOMALY %s: %s unit %d (byte offset %d in the checked region): %s\n", a.Kind, a.Target, a.Unit, int64(a.Unit)*4096, a.Detail)
		if a.Kind != Nonlinearizable {
			fmt.Fprintf(&b, "  the read:   %s\n", a.Op)
		}
		for _, op := range a.Around {
			fmt.Fprintf(&b, "    %s\n", op)
		}
	}
	if len(r.Anomalies) > 0 || !r.OK() {
		b.WriteString("fault timeline:\n")
		for _, e := range events {
			fmt.Fprintf(&b, "  %s %s\n", ts(e.At), e.Text)
		}
		fmt.Fprintf(&b, "replay: seed %d\n", seed)
	}
	return b.String()
}
