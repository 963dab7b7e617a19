package raid

import (
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
)

func faults(ms []*blockdev.Mem) []*blockdev.Fault {
	fs := make([]*blockdev.Fault, len(ms))
	for i, m := range ms {
		fs[i] = blockdev.NewFault(m)
	}
	return fs
}

// randomWrites writes n random pieces through a and into model.
func randomWrites(t *testing.T, a *Array, rng *rand.Rand, model []byte, n int) {
	t.Helper()
	for range n {
		l := (1 + rng.Intn(16)) * 512
		off := int64(rng.Intn(int(a.Size())-l)) / 512 * 512
		b := randBuf(rng, l)
		mustWrite(t, a, off, b)
		copy(model[off:], b)
	}
}

// Nemesis finding 2 (seeds 201–202): a member whose node stops answering
// (a partition longer than the member I/O timeout) is missing, not
// failed: its writes are tracked in the write-intent bitmap, and when it
// is back it is taken back through a resync — also by a re-assembly at
// a new epoch that finds another member away. Before, it was recorded
// failed, the re-assembly counted it against the array ("2 of 4 members
// usable, raid5 needs 3") and the array stayed down with its data on
// the drives.
func TestUnreachableMemberTakenBackAtAssembly(t *testing.T) {
	ev := &events{}
	ms := newMems(4, 4<<20)
	fs := faults(ms)
	cfg := testCfg(RAID5, ev)
	cfg.Epoch = 21
	cfg.IOTimeout = time.Second
	a, err := Create(devs(fs), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(201))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	a.Flush()
	a.Sweep()
	a.Sweep()

	// Member 3's node is partitioned: its requests hang past the timeout.
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Delay, Delay: time.Minute})
	randomWrites(t, a, rng, model, 12)
	fs[3].ClearRules() // the partition heals; nobody has re-added it yet
	st := a.Status()
	if st.State != "degraded" || st.Members[3].State != "missing" || !strings.Contains(st.Members[3].Reason, "timeout") {
		t.Errorf("after member 3 timed out: state %q, member 3 %+v; want degraded with member 3 missing (timeout), not failed", st.State, st.Members[3])
	}
	if e, ok := ev.last(MemberFailed); !ok || e.Member != 3 || !e.Missing {
		t.Errorf("MemberFailed event after member 3 timed out: %+v (found %v), want member 3 with Missing set", e, ok)
	}
	randomWrites(t, a, rng, model, 12)

	// Then member 2's node is killed: a read of its chunk finds it gone,
	// beyond RAID-5's redundancy, and the array fails.
	fs[2].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	if _, err := a.ReadAt(make([]byte, 512), chunkOn(a, 2)); err == nil {
		t.Fatal("read of member 2's chunk with members 2 and 3 away succeeded")
	}
	if st := a.Status(); st.State != "failed" {
		t.Fatalf("after losing member 2 too: %q, want failed", st.State)
	}
	// Its owner re-assembles it at epoch 22 while member 2 is still away.
	a.Abort()
	d := devs(fs)
	d[2] = nil
	b, rej, err := Assemble(d, AssembleOptions{UUID: a.UUID(), Epoch: 22, Policy: quietPolicy(ev)})
	if err != nil {
		t.Fatalf("re-assembly with the unreachable member back and member 2 away: %v", err)
	}
	checked(t, b)
	if len(rej) != 0 {
		t.Errorf("rejections %+v, want none: member 3 was only unreachable", rej)
	}
	if st := b.Status(); st.Members[3].State != "rebuilding" || st.Members[2].State != "missing" {
		t.Errorf("members %+v: want member 3 resyncing and member 2 missing", st.Members)
	}
	// Stripes that member 3 must catch up lack data until member 2
	// returns; every other stripe is served, and takes writes.
	served := 0
	ss := b.Geometry().StripeSize
	for off := int64(0); off < b.Size(); off += ss {
		got := make([]byte, ss)
		if _, err := b.ReadAt(got, off); err != nil {
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("read of stripe at %d: %v, want data or ErrUnavailable", off, err)
			}
			continue
		}
		expectEqual(t, "a stripe served with member 3 resyncing", got, model[off:off+ss])
		if served == 0 {
			w := randBuf(rng, int(ss))
			mustWrite(t, b, off, w)
			copy(model[off:], w)
		}
		served++
	}
	if served == 0 {
		t.Fatal("no stripe served with three of four members present")
	}

	// Member 2 returns: it missed only this run's writes.
	fs[2].ClearRules()
	if err := b.ReAdd(2, fs[2]); err != nil {
		t.Fatalf("re-add of member 2: %v", err)
	}
	b.WaitIdle()
	if st := b.Status(); st.State != "optimal" {
		t.Fatalf("after member 2 returned: %q (%s), want optimal", st.State, st.Reason)
	}
	expectEqual(t, "every acknowledged write", mustRead(t, b, 0, int(b.Size())), model)
	// Member 3 really carries its data again: lose another member.
	if err := b.FailMember(0, "test"); err != nil {
		t.Fatal(err)
	}
	expectEqual(t, "degraded read after the resync", mustRead(t, b, 0, int(b.Size())), model)
}

// chunkOn returns the array offset of a data chunk on role r.
func chunkOn(a *Array, r int) int64 {
	for s := int64(0); ; s++ {
		for i := 0; i < a.geo.DataDisks; i++ {
			if a.dataRole(s, i) == r {
				return s*a.geo.StripeSize + int64(i)*a.geo.ChunkSize
			}
		}
	}
}

// syncedChunkOn returns the array offset of a data chunk on role r in a
// stripe that role also holds in sync.
func syncedChunkOn(a *Array, r, also int) int64 {
	for s := int64(0); s < a.geo.Stripes; s++ {
		if !a.inSync(a.member(also), s) {
			continue
		}
		for i := 0; i < a.geo.DataDisks; i++ {
			if a.dataRole(s, i) == r {
				return s*a.geo.StripeSize + int64(i)*a.geo.ChunkSize
			}
		}
	}
	panic("no such chunk")
}

// A device error (the drive itself refused a request) still fails the
// member: it is rejected as stale at assembly, not taken back.
func TestDeviceErrorFailsMember(t *testing.T) {
	ev := &events{}
	ms := newMems(4, 4<<20)
	fs := faults(ms)
	a := mustCreate(t, devs(fs), testCfg(RAID5, ev))
	rng := rand.New(rand.NewSource(5))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	fs[1].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Action: blockdev.Fail, Err: blockdev.ErrIO})
	randomWrites(t, a, rng, model, 8)
	if st := a.Status(); st.Members[1].State != "failed" {
		t.Fatalf("member 1 after a media error: %+v, want failed", st.Members[1])
	}
	// The daemon tells the coordinator a drive to replace by this event.
	if e, ok := ev.last(MemberFailed); !ok || e.Member != 1 || e.Missing {
		t.Errorf("MemberFailed event after a media error: %+v (found %v), want member 1 without Missing", e, ok)
	}
	fs[1].ClearRules()
	a.Abort()
	b, rej, err := Assemble(devs(fs), AssembleOptions{UUID: a.UUID(), Policy: quietPolicy(nil)})
	if err != nil {
		t.Fatal(err)
	}
	checked(t, b)
	if len(rej) != 1 || rej[0].Role != 1 || !errors.Is(rej[0].Err, ErrStale) {
		t.Fatalf("rejections %+v, want member 1 as stale", rej)
	}
	expectEqual(t, "degraded read", mustRead(t, b, 0, int(b.Size())), model)
}

// Nemesis finding 3 (seed 411): a repair must always end with an event.
// A member re-added while its connection dies again (the superblock
// write of the re-add fails) used to leave ReAdd returning nil and a
// queued rebuild that found the member failed and returned without a
// RebuildDone or TaskFailed: the daemon waited for it for ever
// ("repair already running").
func TestReAddOfMemberLostAgainEnds(t *testing.T) {
	ev := &events{}
	ms := newMems(4, 4<<20)
	fs := faults(ms)
	a := mustCreate(t, devs(fs), testCfg(RAID5, ev))
	rng := rand.New(rand.NewSource(411))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	randomWrites(t, a, rng, model, 8)
	fs[3].ClearRules()
	// The node of member 3 restarts again while it is re-added: its
	// superblock writes fail.
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: 0, Len: 2 * sbSlotSize, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	err := a.ReAdd(3, fs[3])
	a.WaitIdle()
	ended := ev.count(RebuildDone) + ev.count(TaskFailed)
	if err == nil && ended == 0 {
		t.Fatalf("ReAdd of a member lost again returned nil and its rebuild ended without RebuildDone or TaskFailed (member %+v)", a.Status().Members[3])
	}
	fs[3].ClearRules()
	if err := a.ReAdd(3, fs[3]); err != nil {
		t.Fatalf("second re-add: %v", err)
	}
	a.WaitIdle()
	if st := a.Status(); st.State != "optimal" {
		t.Fatalf("after the second re-add: %q (%s)", st.State, st.Reason)
	}
	expectEqual(t, "data after the re-add", mustRead(t, a, 0, int(a.Size())), model)
}

// A queued rebuild whose member is lost before the rebuild starts ends
// with TaskFailed for that member (it returned nil before, silently).
func TestQueuedRebuildOfLostMemberReportsIt(t *testing.T) {
	ev := &events{}
	ms := newMems(6, 4<<20)
	fs := faults(ms)
	a := mustCreate(t, devs(fs), testCfg(RAID6, ev))
	rng := rand.New(rand.NewSource(412))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	// Flushed before members 2 and 3 go, so that each misses only the
	// writes made while it was away (an unreachable member also catches
	// up what it held unflushed when it left: its node may have lost
	// power, docs/RELIABILITY.md known problem 8), and stripes outside
	// those writes stay in sync on both.
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []int{2, 3} {
		fs[r].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	}
	randomWrites(t, a, rng, model, 8)
	fs[2].ClearRules()
	fs[3].ClearRules()
	// Member 2's rebuild holds the worker (its writes wait) while the
	// rebuild of member 3 is queued behind it.
	dataOff := a.Geometry().DataOffset
	fs[2].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: dataOff, Len: 1 << 40, Action: blockdev.Delay, Delay: time.Minute})
	if err := a.ReAdd(2, fs[2]); err != nil {
		t.Fatal(err)
	}
	if err := a.ReAdd(3, fs[3]); err != nil {
		t.Fatal(err)
	}
	// Member 3 is lost again before its rebuild starts (a read of its
	// in-sync stripes finds it gone; reads of member 2 pass).
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	// (a chunk of member 3 in a stripe that both members hold in sync:
	// read without the stripe locks the waiting rebuild holds)
	read := false
	C := a.Geometry().ChunkSize
	for s := int64(0); s < a.Geometry().Stripes && !read; s++ {
		if !a.inSync(a.member(2), s) || !a.inSync(a.member(3), s) {
			continue
		}
		for i := 0; i < a.Geometry().DataDisks; i++ {
			if a.dataRole(s, i) == 3 {
				off := s*a.Geometry().StripeSize + int64(i)*C
				expectEqual(t, "read of a chunk of member 3", mustRead(t, a, off, int(C)), model[off:off+C])
				read = true
				break
			}
		}
	}
	if st := a.Status(); st.Members[3].State == "rebuilding" {
		t.Fatalf("member 3 %+v: the writes did not reach it", st.Members[3])
	}
	fs[2].ClearRules()
	a.WaitIdle()
	found := false
	ev.mu.Lock()
	for _, e := range ev.all {
		if e.Kind == TaskFailed && e.Member == 3 {
			found = true
		}
	}
	ev.mu.Unlock()
	if !found {
		t.Fatalf("no TaskFailed for member 3, whose queued rebuild found it lost; members %+v", a.Status().Members)
	}
	fs[3].ClearRules()
	if err := a.ReAdd(3, fs[3]); err != nil {
		t.Fatal(err)
	}
	a.WaitIdle()
	expectEqual(t, "data after both re-adds", mustRead(t, a, 0, int(a.Size())), model)
}

// The open limit, and its safety: member 3 is under resync when member 1
// goes away, then member 3 is lost too and the array fails. Both were
// only unreachable, so both are taken back under a resync of the same
// bitmap regions; where they overlap the stripes lack data (who missed
// what there was recorded in memory only), everywhere else the array is
// served — and no stripe is ever read from a member that missed a write.
func TestTwoMissingMembersNeverServeStaleData(t *testing.T) {
	ev := &events{}
	ms := newMems(4, 4<<20)
	fs := faults(ms)
	cfg := testCfg(RAID5, ev)
	a, err := Create(devs(fs), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(202))
	model := randBuf(rng, int(a.Size()))
	mustWrite(t, a, 0, model)
	a.Flush()
	a.Sweep()
	a.Sweep()
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	randomWrites(t, a, rng, model, 16)
	fs[3].ClearRules()
	// Member 3 returns; its resync's first write waits a while.
	g := a.Geometry()
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: g.DataOffset, Len: 1 << 40, Action: blockdev.Delay, Delay: 2 * time.Second, Count: 1})
	if err := a.ReAdd(3, fs[3]); err != nil {
		t.Fatal(err)
	}
	for fs[3].Fired() == 0 {
		time.Sleep(time.Millisecond) // until the resync's write is held
	}
	// Member 1 goes away meanwhile (a read of its chunk in a stripe that
	// member 3 holds in sync finds it gone).
	fs[1].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	off := syncedChunkOn(a, 1, 3)
	expectEqual(t, "read around member 1", mustRead(t, a, off, 512), model[off:off+512])
	if st := a.Status(); st.Members[3].State != "rebuilding" {
		t.Fatalf("members %+v: want 3 rebuilding", st.Members)
	} else if st.Members[1].State != "missing" {
		t.Errorf("member 1 %+v: want missing", st.Members[1])
	}
	// Then member 3 is lost as well: the array fails. Which of its I/Os
	// finds it gone first — the held resync write or the read below —
	// depends on timing, so the read's offset is chosen while member 3
	// still holds stripes in sync.
	off3 := syncedChunkOn(a, 3, 3)
	fs[3].AddRule(blockdev.Rule{Op: blockdev.OpAny, Action: blockdev.Fail, Err: blockdev.ErrClosed})
	a.WaitIdle()
	_, _ = a.ReadAt(make([]byte, 512), off3)
	if st := a.Status(); st.State != "failed" {
		t.Fatalf("after losing member 3 again: %q (%+v), want failed", st.State, st.Members)
	}
	a.Abort()
	fs[1].ClearRules()
	fs[3].ClearRules()
	b, rej, err := Assemble(devs(fs), AssembleOptions{UUID: a.UUID(), Epoch: 2, Policy: quietPolicy(ev)})
	if err != nil {
		t.Fatalf("re-assembly with every member back: %v", err)
	}
	checked(t, b)
	if len(rej) != 0 {
		t.Errorf("rejections %+v, want none", rej)
	}
	b.WaitIdle()
	served := 0
	for o := int64(0); o < b.Size(); o += g.StripeSize {
		got := make([]byte, g.StripeSize)
		if _, err := b.ReadAt(got, o); err != nil {
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("read of the stripe at %d: %v, want data or ErrUnavailable", o, err)
			}
			continue
		}
		expectEqual(t, "a stripe served after both returned", got, model[o:o+g.StripeSize])
		served++
	}
	if served == 0 {
		t.Fatal("no stripe served with every member back")
	}
}
