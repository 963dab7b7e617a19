package target

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// sharedResv is a reservation store shared by several targets, as a
// cluster's control plane is: compare-and-swap on a version, and every
// change applied on the other targets before Store returns (what the
// cluster's owner acknowledgement gives).
type sharedResv struct {
	mu      sync.Mutex
	states  map[string]ReservationState
	version int64
	views   []*resvView
}

// resvView is one target's handle on the shared store.
type resvView struct {
	s  *sharedResv
	tg *Target
}

func (s *sharedResv) view() *resvView {
	v := &resvView{s: s}
	s.mu.Lock()
	s.views = append(s.views, v)
	s.mu.Unlock()
	return v
}

func (v *resvView) PTPL() PTPLMode { return PTPLAlways }

func (v *resvView) Load(subnqn string, nsid uint32) (ReservationState, error) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	st, ok := v.s.states[fmt.Sprint(subnqn, nsid)]
	if !ok {
		return ReservationState{Registrants: map[[16]byte]uint64{}, PTPL: true}, nil
	}
	return st.clone(), nil
}

func (v *resvView) Store(subnqn string, nsid uint32, prev, next ReservationState) (ReservationState, error) {
	v.s.mu.Lock()
	k := fmt.Sprint(subnqn, nsid)
	if cur := v.s.states[k]; cur.Version != prev.Version {
		v.s.mu.Unlock()
		return ReservationState{}, &StaleReservationError{Current: cur.clone()}
	}
	v.s.version++
	next.Version = v.s.version
	v.s.states[k] = next.clone()
	var others []*Target
	for _, o := range v.s.views {
		if o != v && o.tg != nil {
			others = append(others, o.tg)
		}
	}
	v.s.mu.Unlock()
	for _, tg := range others {
		if err := tg.ApplyReservation(subnqn, nsid, next); err != nil {
			return ReservationState{}, err
		}
	}
	return next, nil
}

// newPathTarget serves testSubNQN's namespace 1 over dev with the shared
// reservation store, in the given ANA state.
func newPathTarget(t *testing.T, s *sharedResv, dev blockdev.Device, cntlBase uint16, state nvme.ANAState) (*Target, string) {
	t.Helper()
	tg, err := New(Config{Listen: "127.0.0.1:0", CntlIDBase: cntlBase, CntlIDCount: 16, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	v := s.view()
	if err := tg.AddSubsystem(SubsystemConfig{NQN: testSubNQN, AllowedHosts: []string{testHostNQN, testHostNQN2},
		ANAStates: map[uint32]nvme.ANAState{1: state}, Reservations: v}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 1, Device: dev, NGUID: testNGUID, ANAGroup: 1}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	v.tg = tg
	s.mu.Unlock()
	return tg, tg.Addr().String()
}

// pathClient is one host's controller with one I/O queue on one target.
func pathClient(t *testing.T, addr, hostnqn string, hostid [16]byte) (adm, io *rawClient) {
	t.Helper()
	adm, id := adminConnect(t, addr, 0, hostnqn, hostid)
	return adm, ioConnect(t, addr, 0, hostnqn, hostid, id, 1)
}

// TestReservationOneStateAcrossPaths: two targets serve one namespace (the
// owner optimized, the other inaccessible) over one shared reservation
// store. A registration through one path shows in the Reservation Report
// of the other, byte for byte; a reservation held through one path
// conflicts on the other; a preempt-and-abort through the inaccessible
// path fences the preempted host's writes on the owner and leaves it a
// registration-preempted notification; and a new owner (a target started
// afresh over the same store) enforces the same state.
func TestReservationOneStateAcrossPaths(t *testing.T) {
	dev := blockdev.NewMem(testSize, testBS)
	shared := &sharedResv{states: map[string]ReservationState{}}
	owner, ownerAddr := newPathTarget(t, shared, dev, 0x10, nvme.ANAOptimized)
	_, otherAddr := newPathTarget(t, shared, dev, 0x20, nvme.ANAInaccessible)
	adm1, h1owner := pathClient(t, ownerAddr, testHostNQN, testHostID)
	_, h1other := pathClient(t, otherAddr, testHostNQN, testHostID)
	_, h2owner := pathClient(t, ownerAddr, testHostNQN2, testHostID2)
	_, h2other := pathClient(t, otherAddr, testHostNQN2, testHostID2)
	blk := make([]byte, testBS)

	// host 1 registers and takes Write Exclusive through the owner's path
	if st := resvCmd(h1owner, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 0x11}); !st.OK() {
		t.Fatalf("register through the owner: %v", st)
	}
	if st := resvCmd(h1owner, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 0x11}); !st.OK() {
		t.Fatalf("acquire through the owner: %v", st)
	}
	// host 2 registers through the other path
	if st := resvCmd(h2other, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 0x22}); !st.OK() {
		t.Fatalf("register through the inaccessible path: %v, want success (reservations are the subsystem's)", st)
	}
	rawReport := func(q *rawClient) []byte {
		r := q.do(nvme.SQE{Opcode: nvme.CmdResvReport, NSID: 1, CDW10: 4096/4 - 1, CDW11: nvme.ResvReportEDS, DPTR: nvme.SGL{Length: 4096}}, nil, false)
		if !r.cqe.Status.OK() {
			t.Fatalf("report: %v", r.cqe.Status)
		}
		return r.data
	}
	want := rawReport(h1owner)
	for name, q := range map[string]*rawClient{"host 1 other path": h1other, "host 2 owner": h2owner, "host 2 other path": h2other} {
		if got := rawReport(q); string(got) != string(want) {
			t.Errorf("Reservation Report through %s differs from the owner's", name)
		}
	}
	rep, _ := nvme.ParseResvStatus(want)
	if rep.Type != nvme.ResvWriteExclusive || len(rep.Registrants) != 2 || !rep.PTPLS {
		t.Fatalf("report %+v, want write exclusive, two registrants, PTPLS", rep)
	}
	// the reservation held through the owner's path conflicts on the other
	if st := resvCmd(h2other, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 0x22}); st != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("acquire through the other path while host 1 holds: %v, want reservation conflict", st)
	}
	if r := h2owner.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("host 2 write on the owner: %v, want reservation conflict", r.cqe.Status)
	}
	if r := h1owner.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("holder's write: %v", r.cqe.Status)
	}
	// host 2 fences host 1 through the inaccessible path
	if st := resvCmd(h2other, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvPreemptAndAbort, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 0x22, Key2: 0x11}); !st.OK() {
		t.Fatalf("preempt and abort through the other path: %v", st)
	}
	if r := h1owner.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("fenced host 1's write on the owner: %v, want reservation conflict", r.cqe.Status)
	}
	if r := h2owner.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("new holder's write on the owner: %v", r.cqe.Status)
	}
	n, _ := nvme.ParseResvNotification(adm1.getLog(nvme.LogResvNotification, 0, nvme.ResvNotifLogLen, 0).data)
	if n.Type != nvme.ResvNotifRegPreempted || n.NSID != 1 || n.LogPageCount == 0 {
		t.Fatalf("host 1's reservation notification on the owner: %+v, want registration preempted of namespace 1", n)
	}
	if n, _ := nvme.ParseResvNotification(adm1.getLog(nvme.LogResvNotification, 0, nvme.ResvNotifLogLen, 0).data); n.Type != nvme.ResvNotifEmpty {
		t.Fatalf("second read of the notification log: %+v, want empty", n)
	}
	before := rawReport(h2owner)
	// the owner goes; a new owner starts over the same store
	owner.Close()
	_, newAddr := newPathTarget(t, shared, dev, 0x30, nvme.ANAOptimized)
	_, h1new := pathClient(t, newAddr, testHostNQN, testHostID)
	_, h2new := pathClient(t, newAddr, testHostNQN2, testHostID2)
	if got := rawReport(h1new); string(got) != string(before) {
		t.Fatalf("Reservation Report on the new owner differs from before the owner change")
	}
	if r := h1new.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("fenced host 1's write on the new owner: %v, want reservation conflict", r.cqe.Status)
	}
	if r := h2new.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("holder's write on the new owner: %v", r.cqe.Status)
	}
}

// TestReservationStaleDecisionRetried: a change decided on a state that
// another path changed meanwhile (its notice not yet here) is decided
// again on the newer state.
func TestReservationStaleDecisionRetried(t *testing.T) {
	shared := &sharedResv{states: map[string]ReservationState{}}
	_, addr := newPathTarget(t, shared, nil2Mem(), 0x10, nvme.ANAOptimized)
	_, q := pathClient(t, addr, testHostNQN, testHostID)
	// another path registered host 2 and took Exclusive Access; this
	// target has not been told
	shared.mu.Lock()
	shared.version = 5
	shared.states[fmt.Sprint(testSubNQN, uint32(1))] = ReservationState{Generation: 1, Type: nvme.ResvExclusiveAccess, Holder: testHostID2, Held: true,
		Registrants: map[[16]byte]uint64{testHostID2: 0x22}, PTPL: true, Version: 5}
	shared.mu.Unlock()
	if st := resvCmd(q, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 0x11}); !st.OK() {
		t.Fatal(st)
	}
	if st := resvCmd(q, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 0x11}); st != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("acquire while host 2 holds (through another path): %v, want reservation conflict", st)
	}
	if r := q.read(1, 0, 1, testBS); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("read under another host's Exclusive Access: %v", r.cqe.Status)
	}
	shared.mu.Lock()
	st := shared.states[fmt.Sprint(testSubNQN, uint32(1))]
	shared.mu.Unlock()
	if len(st.Registrants) != 2 || st.Generation != 2 {
		t.Fatalf("stored state %+v, want both registrants, generation 2", st)
	}
}

func nil2Mem() blockdev.Device { return blockdev.NewMem(testSize, testBS) }

// TestPTPLHonoured: RESCAP advertises PTPLS (and IEKEY) where the state
// survives a restart; with PTPL cleared by Register CPTPL 10b a restart
// drops reservations and registrants; a target without a state directory
// refuses CPTPL 11b (it cannot persist).
func TestPTPLHonoured(t *testing.T) {
	dir := t.TempDir()
	dev := blockdev.NewMem(testSize, testBS)
	tg, addr := newTarget(t, Config{StateDir: dir}, dev)
	a, id := adminConnect(t, addr, 0, testHostNQN, testHostID)
	in, _ := nvme.ParseIdentifyNamespace(a.identify(nvme.CNSNamespace, 1).data)
	if in.RESCAP&nvme.RescapPTPL == 0 || in.RESCAP&nvme.RescapIEKey == 0 {
		t.Fatalf("RESCAP %#x with a state directory, want PTPLS and IEKEY", in.RESCAP)
	}
	q := ioConnect(t, addr, 0, testHostNQN, testHostID, id, 1)
	resvCmd(q, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 7})
	getPTPL := func() uint32 {
		return a.do(nvme.SQE{Opcode: nvme.AdminGetFeatures, NSID: 1, CDW10: uint32(nvme.FeatResvPersistence)}, nil, false).cqe.DW0()
	}
	if p := getPTPL(); p != 1 {
		t.Fatalf("PTPL %d, want 1 by default with a state directory", p)
	}
	// the same registration again, clearing PTPL
	if st := resvCmd(q, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister, CPTPL: 2}, nvme.ResvKeys{Key2: 7}); !st.OK() {
		t.Fatalf("register with CPTPL 10b: %v", st)
	}
	if p, rep := getPTPL(), resvReport(t, q); p != 0 || rep.PTPLS || len(rep.Registrants) != 1 {
		t.Fatalf("after CPTPL 10b: PTPL %d, report %+v; want PTPL 0 and the registration kept until a restart", p, rep)
	}
	tg.Close()
	_, addr2 := newTarget(t, Config{StateDir: dir}, dev)
	_, id = adminConnect(t, addr2, 0, testHostNQN, testHostID)
	q = ioConnect(t, addr2, 0, testHostNQN, testHostID, id, 1)
	if rep := resvReport(t, q); len(rep.Registrants) != 0 || rep.PTPLS {
		t.Fatalf("after a restart with PTPL cleared: %+v, want no registrants, PTPLS clear", rep)
	}
	// memory only
	_, addr3 := newTarget(t, Config{}, nil)
	a3, id3 := adminConnect(t, addr3, 0, testHostNQN, testHostID)
	if in, _ := nvme.ParseIdentifyNamespace(a3.identify(nvme.CNSNamespace, 1).data); in.RESCAP&nvme.RescapPTPL != 0 {
		t.Fatalf("RESCAP %#x without a state directory advertises PTPLS", in.RESCAP)
	}
	q3 := ioConnect(t, addr3, 0, testHostNQN, testHostID, id3, 1)
	if st := resvCmd(q3, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister, CPTPL: 3}, nvme.ResvKeys{Key2: 7}); st != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("CPTPL 11b without persistence: %v, want invalid field", st)
	}
}

// TestReservationNotifications: a release of a registrants-only
// reservation leaves the other registrant a reservation-released page,
// announced by one I/O-command-specific asynchronous event; the mask
// (feature 0x82) suppresses that type; a clear leaves a
// reservation-preempted page.
func TestReservationNotifications(t *testing.T) {
	_, addr := newTarget(t, Config{}, nil)
	_, q1 := pathClient(t, addr, testHostNQN, testHostID)
	a2, q2 := pathClient(t, addr, testHostNQN2, testHostID2)
	resvCmd(q1, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 1})
	resvCmd(q2, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 2})
	acquireRelease := func() {
		t.Helper()
		if st := resvCmd(q1, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusiveRO}, nvme.ResvKeys{CRKey: 1}); !st.OK() {
			t.Fatal(st)
		}
		if st := resvCmd(q1, nvme.CmdResvRelease, nvme.ResvCmd{Action: nvme.ResvRelease, Type: nvme.ResvWriteExclusiveRO}, nvme.ResvKeys{CRKey: 1}); !st.OK() {
			t.Fatal(st)
		}
	}
	readLog := func() nvme.ResvNotification {
		n, _ := nvme.ParseResvNotification(a2.getLog(nvme.LogResvNotification, 0, nvme.ResvNotifLogLen, 0).data)
		return n
	}
	acquireRelease()
	if c := a2.do(nvme.SQE{Opcode: nvme.AdminAsyncEvent}, nil, false).cqe; c.DW0() != nvme.AENResult(nvme.AENTypeIOCmdSpec, nvme.AENIOResvLogAvail, nvme.LogResvNotification) {
		t.Fatalf("host 2's asynchronous event %#x, want reservation log page available", c.DW0())
	}
	if n := readLog(); n.Type != nvme.ResvNotifResvReleased || n.NSID != 1 || n.NumAvail != 0 {
		t.Fatalf("host 2's notification %+v, want reservation released of namespace 1", n)
	}
	if c := a2.setFeature(nvme.FeatResvNotifMask, 1<<nvme.ResvNotifResvReleased); !c.Status.OK() {
		t.Fatal(c.Status)
	}
	acquireRelease()
	if n := readLog(); n.Type != nvme.ResvNotifEmpty {
		t.Fatalf("masked notification delivered: %+v", n)
	}
	if st := resvCmd(q1, nvme.CmdResvRelease, nvme.ResvCmd{Action: nvme.ResvClear}, nvme.ResvKeys{CRKey: 1}); !st.OK() {
		t.Fatal(st)
	}
	if n := readLog(); n.Type != nvme.ResvNotifResvPreempted {
		t.Fatalf("host 2's notification after the clear %+v, want reservation preempted", n)
	}
}

// TestPreemptAndAbortThroughOtherPathDrainsOwner: a preempt-and-abort
// through another target completes only after the owner applied it, and
// the owner applies it only after the preempted host's write that was
// executing there has finished; the preempted host's next write is
// refused.
func TestPreemptAndAbortThroughOtherPathDrainsOwner(t *testing.T) {
	g := &gatedDevice{Device: blockdev.NewMem(testSize, testBS), entered: make(chan struct{}, 1)}
	shared := &sharedResv{states: map[string]ReservationState{}}
	_, ownerAddr := newPathTarget(t, shared, g, 0x10, nvme.ANAOptimized)
	_, otherAddr := newPathTarget(t, shared, g, 0x20, nvme.ANAInaccessible)
	_, old := pathClient(t, ownerAddr, testHostNQN, testHostID)
	_, next := pathClient(t, otherAddr, testHostNQN2, testHostID2)
	resvCmd(old, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 1})
	resvCmd(old, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 1})
	resvCmd(next, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 2})

	g.mu.Lock() // hold the preempted host's write inside the owner's device
	var unlock sync.Once
	release := func() { unlock.Do(g.mu.Unlock) }
	t.Cleanup(release)
	for len(g.entered) > 0 {
		<-g.entered
	}
	wdone := make(chan nvme.Status, 1)
	go func() {
		r, err := old.try(rwSQE(nvme.CmdWrite, 1, 0, 1), make([]byte, testBS), true)
		if err != nil {
			wdone <- 0xFFFF
			return
		}
		wdone <- r.cqe.Status
	}()
	<-g.entered
	pdone := make(chan nvme.Status, 1)
	go func() {
		r, err := next.try(nvme.SQE{Opcode: nvme.CmdResvAcquire, NSID: 1,
			CDW10: nvme.ResvCmd{Action: nvme.ResvPreemptAndAbort, Type: nvme.ResvWriteExclusive}.CDW10()},
			nvme.ResvKeys{CRKey: 2, Key2: 1}.Append(nil), true)
		if err != nil {
			pdone <- 0xFFFF
			return
		}
		pdone <- r.cqe.Status
	}()
	select {
	case st := <-pdone:
		t.Fatalf("preempt-and-abort through the other path completed (%v) while the preempted write ran on the owner", st)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	if st := <-wdone; !st.OK() {
		t.Fatalf("the write admitted before the preempt: %v", st)
	}
	if st := <-pdone; !st.OK() {
		t.Fatalf("preempt-and-abort: %v", st)
	}
	if r := old.writeBlocks(1, 0, make([]byte, testBS), testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("the preempted host's write on the owner afterwards: %v, want reservation conflict", r.cqe.Status)
	}
}
