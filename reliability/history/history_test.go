package history

import (
	"strings"
	"testing"
)

// w and r build operations on unit u of target 0 with times in ms.
func w(u int32, gen uint64, call, ret int64, out Outcome) Op {
	return Op{Unit: u, Kind: Write, Value: gen, Call: call * 1e6, Return: ret * 1e6, Outcome: out}
}

func r(u int32, gen uint64, call, ret int64) Op {
	return Op{Unit: u, Kind: Read, Value: gen, Call: call * 1e6, Return: ret * 1e6, Client: 1}
}

func check(t *testing.T, ops ...Op) Result {
	t.Helper()
	res := Check(ops, []string{"A"}, Options{})
	t.Log("\n" + res.Report([]Event{{At: 5e6, Text: "kill -9 B"}}, 42))
	return res
}

func wantAnomaly(t *testing.T, res Result, kind string, unit int) {
	t.Helper()
	if res.OK() || res.Linearizable {
		t.Fatalf("history accepted; want a %s anomaly on unit %d", kind, unit)
	}
	if res.ByKind[kind] != 1 || len(res.Anomalies) != 1 {
		t.Fatalf("anomalies %v: want exactly one %s", res.ByKind, kind)
	}
	if a := res.Anomalies[0]; a.Unit != unit || a.Target != "A" || len(a.Around) == 0 {
		t.Fatalf("anomaly %+v: want unit %d of A with the operations around it", a, unit)
	}
	rep := res.Report(nil, 42)
	if !strings.Contains(rep, "ANOMALY "+kind) || !strings.Contains(rep, "replay: seed 42") {
		t.Fatalf("report does not name the anomaly and the seed:\n%s", rep)
	}
}

func TestStaleRead(t *testing.T) {
	// gen 2 acknowledged at 20 ms; a read invoked at 30 ms returns gen 1.
	res := check(t,
		w(3, 1, 0, 10, OK), w(3, 2, 11, 20, OK), r(3, 1, 30, 40),
		w(4, 3, 0, 10, OK), r(4, 3, 30, 40))
	wantAnomaly(t, res, Stale, 3)
}

func TestLostAcknowledgedWrite(t *testing.T) {
	// The only write was acknowledged; the unit reads back as zeroes.
	res := check(t, w(7, 5, 0, 10, OK), r(7, Unwritten, 20, 21))
	wantAnomaly(t, res, Lost, 7)
}

func TestResurrectedOlderGeneration(t *testing.T) {
	// gen 2's write failed but landed (a read saw it); a later read
	// sees gen 1 again: old data came back.
	res := check(t, w(1, 1, 0, 10, OK), w(1, 2, 11, 20, Unknown), r(1, 2, 30, 31), r(1, 1, 40, 41))
	wantAnomaly(t, res, Resurrected, 1)
}

func TestTornBlock(t *testing.T) {
	res := check(t, w(2, 1, 0, 10, OK), w(2, 2, 11, 20, Unknown), r(2, Torn, 30, 31))
	wantAnomaly(t, res, Corrupt, 2)
}

func TestPhantomAndFutureGenerations(t *testing.T) {
	res := check(t, w(2, 1, 0, 10, OK), r(2, 9, 30, 31))
	wantAnomaly(t, res, Corrupt, 2)
	res = check(t, r(2, 1, 0, 5), w(2, 1, 10, 20, OK))
	wantAnomaly(t, res, Corrupt, 2)
}

func TestLateWriteOfDeadConnection(t *testing.T) {
	// gen 1's write failed; the caller wrote gen 2, acknowledged; a read
	// then returns gen 1: the failed write landed after its successor
	// (the dead connection's queued write), which the model forbids.
	res := check(t, w(5, 1, 0, 10, Unknown), w(5, 2, 11, 20, OK), r(5, 1, 30, 31))
	wantAnomaly(t, res, Stale, 5)
}

func TestLegalHistories(t *testing.T) {
	for name, ops := range map[string][]Op{
		"concurrent overlapping writes, either order": {
			w(0, 1, 0, 20, OK), w(0, 2, 5, 15, OK), r(0, 1, 30, 31),
			w(1, 3, 0, 20, OK), w(1, 4, 5, 15, OK), r(1, 4, 30, 31),
		},
		"read concurrent with a write sees old or new": {
			w(0, 1, 0, 10, OK), w(0, 2, 20, 30, OK), r(0, 1, 21, 25), r(0, 2, 22, 26), r(0, 2, 31, 32),
		},
		"failed write that landed": {
			w(0, 1, 0, 10, OK), w(0, 2, 11, 20, Unknown), r(0, 2, 30, 31), r(0, 2, 40, 41),
		},
		"failed write that did not land": {
			w(0, 1, 0, 10, OK), w(0, 2, 11, 20, Unknown), r(0, 1, 30, 31), r(0, 2, 40, 41),
		},
		"failed write lands late, before the next write": {
			w(0, 1, 0, 10, Unknown), r(0, Unwritten, 12, 13), r(0, 1, 14, 15), w(0, 2, 20, 30, Unknown), r(0, 1, 40, 41),
		},
		"never written": {r(0, Unwritten, 0, 1)},
	} {
		t.Run(name, func(t *testing.T) {
			res := check(t, ops...)
			if !res.OK() {
				t.Fatalf("legal history rejected: %v", res.ByKind)
			}
		})
	}
}

func TestRecorder(t *testing.T) {
	rec := NewRecorder([]string{"A"})
	a := rec.Now()
	rec.Add(w(0, 1, 0, 1, OK))
	rec.Note("freeze %s", "B")
	if b := rec.Now(); b < a || rec.Len() != 1 || len(rec.Events()) != 1 || rec.Events()[0].Text != "freeze B" {
		t.Fatalf("recorder: now %d..%d, %d ops, events %v", a, b, rec.Len(), rec.Events())
	}
}
