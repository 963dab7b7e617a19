package target

import (
	"sync"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// resvCmd sends a reservation command on q.
func resvCmd(q *rawClient, op uint8, cmd nvme.ResvCmd, keys nvme.ResvKeys) nvme.Status {
	data := keys.Append(nil)
	if op == nvme.CmdResvRelease {
		data = data[:8]
	}
	return q.do(nvme.SQE{Opcode: op, NSID: 1, CDW10: cmd.CDW10()}, data, true).cqe.Status
}

func resvReport(t testing.TB, q *rawClient) nvme.ResvStatus {
	t.Helper()
	r := q.do(nvme.SQE{Opcode: nvme.CmdResvReport, NSID: 1, CDW10: 4096/4 - 1, CDW11: 1, DPTR: nvme.SGL{Length: 4096}}, nil, false)
	if !r.cqe.Status.OK() {
		t.Fatalf("report: %v", r.cqe.Status)
	}
	st, err := nvme.ParseResvStatus(r.data)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestReservationsFenceAndPersist(t *testing.T) {
	dir := t.TempDir()
	dev := blockdev.NewMem(testSize, testBS)
	tg, addr := newTarget(t, Config{StateDir: dir}, dev)
	_, id1 := adminConnect(t, addr, 0, testHostNQN, testHostID)
	_, id2 := adminConnect(t, addr, 0, testHostNQN2, testHostID2)
	old := ioConnect(t, addr, 0, testHostNQN, testHostID, id1, 1)    // the stale owner, epoch 1
	next := ioConnect(t, addr, 0, testHostNQN2, testHostID2, id2, 1) // the new owner, epoch 2
	blk := make([]byte, testBS)
	if st := resvCmd(old, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 1}); !st.OK() {
		t.Fatalf("register: %v", st)
	}
	if st := resvCmd(old, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 1}); !st.OK() {
		t.Fatalf("acquire: %v", st)
	}
	// Not registered with the right key: conflicts.
	if st := resvCmd(next, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 2}); st != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("acquire unregistered: %v", st)
	}
	if r := next.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("write by non-holder under Write Exclusive: %v", r.cqe.Status)
	}
	if r := next.read(1, 0, 1, testBS); !r.cqe.Status.OK() {
		t.Fatalf("read by non-holder under Write Exclusive: %v", r.cqe.Status)
	}
	if st := resvCmd(next, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 2}); !st.OK() {
		t.Fatalf("register 2: %v", st)
	}
	if st := resvCmd(next, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 3}); st != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("re-register with another key: %v", st)
	}
	rep := resvReport(t, next)
	if rep.Type != nvme.ResvWriteExclusive || len(rep.Registrants) != 2 || !rep.PTPLS {
		t.Fatalf("report %+v", rep)
	}
	for _, g := range rep.Registrants {
		wantHolder := g.HostID == testHostID
		if g.Holder != wantHolder || (g.HostID == testHostID && (g.RKey != 1 || g.CntlID != nvme.CntlIDDynamic)) {
			t.Fatalf("registrant %+v", g)
		}
	}
	if r := next.do(nvme.SQE{Opcode: nvme.CmdResvReport, NSID: 1, CDW10: 15, DPTR: nvme.SGL{Length: 64}}, nil, false); r.cqe.Status != nvme.StatusHostIDInconsistent|nvme.StatusDNR {
		t.Fatalf("report without EDS: %v", r.cqe.Status)
	}
	// Fence: preempt-and-abort naming the stale key.
	if st := resvCmd(next, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvPreemptAndAbort, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 2, Key2: 1}); !st.OK() {
		t.Fatalf("preempt and abort: %v", st)
	}
	if r := old.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("stale owner's write after fencing: %v", r.cqe.Status)
	}
	if r := next.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("new owner's write: %v", r.cqe.Status)
	}
	gen := resvReport(t, next).Gen
	// Restart the target with the same state directory.
	tg.Close()
	tg2, addr2 := newTarget(t, Config{StateDir: dir}, dev)
	_ = tg2
	_, id1 = adminConnect(t, addr2, 0, testHostNQN, testHostID)
	_, id2 = adminConnect(t, addr2, 0, testHostNQN2, testHostID2)
	old = ioConnect(t, addr2, 0, testHostNQN, testHostID, id1, 1)
	next = ioConnect(t, addr2, 0, testHostNQN2, testHostID2, id2, 1)
	if r := old.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("stale owner's write after target restart: %v", r.cqe.Status)
	}
	rep = resvReport(t, next)
	if rep.Gen != gen || rep.Type != nvme.ResvWriteExclusive || len(rep.Registrants) != 1 || rep.Registrants[0].HostID != testHostID2 || !rep.Registrants[0].Holder || rep.Registrants[0].RKey != 2 {
		t.Fatalf("report after restart %+v (gen was %d)", rep, gen)
	}
	// Release with the wrong type, then properly; clear.
	if st := resvCmd(next, nvme.CmdResvRelease, nvme.ResvCmd{Action: nvme.ResvRelease, Type: nvme.ResvExclusiveAccess}, nvme.ResvKeys{CRKey: 2}); st != nvme.StatusInvalidField|nvme.StatusDNR {
		t.Fatalf("release with wrong type: %v", st)
	}
	if st := resvCmd(next, nvme.CmdResvRelease, nvme.ResvCmd{Action: nvme.ResvRelease, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 2}); !st.OK() {
		t.Fatalf("release: %v", st)
	}
	if r := old.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("write after release: %v", r.cqe.Status)
	}
	if st := resvCmd(next, nvme.CmdResvRelease, nvme.ResvCmd{Action: nvme.ResvClear}, nvme.ResvKeys{CRKey: 2}); !st.OK() {
		t.Fatalf("clear: %v", st)
	}
	if rep := resvReport(t, next); len(rep.Registrants) != 0 || rep.Type != nvme.ResvNone {
		t.Fatalf("after clear: %+v", rep)
	}
}

func TestReservationAllRegistrantsAndUnregister(t *testing.T) {
	_, addr := newTarget(t, Config{}, nil)
	_, id1 := adminConnect(t, addr, 0, testHostNQN, testHostID)
	_, id2 := adminConnect(t, addr, 0, testHostNQN2, testHostID2)
	q1 := ioConnect(t, addr, 0, testHostNQN, testHostID, id1, 1)
	q2 := ioConnect(t, addr, 0, testHostNQN2, testHostID2, id2, 1)
	blk := make([]byte, testBS)
	resvCmd(q1, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 10})
	if st := resvCmd(q1, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvExclusiveAccessAll}, nvme.ResvKeys{CRKey: 10}); !st.OK() {
		t.Fatal(st)
	}
	if r := q2.read(1, 0, 1, testBS); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("non-registrant read under EA-AR: %v", r.cqe.Status)
	}
	resvCmd(q2, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 20})
	if r := q2.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("registrant write under EA-AR: %v", r.cqe.Status)
	}
	// Unregister with a wrong key conflicts; with IEKEY it works.
	if st := resvCmd(q2, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvUnregister}, nvme.ResvKeys{CRKey: 99}); st != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("unregister wrong key: %v", st)
	}
	if st := resvCmd(q2, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvUnregister, IEKey: true}, nvme.ResvKeys{CRKey: 99}); !st.OK() {
		t.Fatalf("unregister IEKEY: %v", st)
	}
	if r := q2.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("write after unregistering: %v", r.cqe.Status)
	}
	// Replace the key, then the last registrant leaving ends the reservation.
	if st := resvCmd(q1, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvReplace}, nvme.ResvKeys{CRKey: 10, Key2: 11}); !st.OK() {
		t.Fatalf("replace: %v", st)
	}
	if st := resvCmd(q1, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvUnregister}, nvme.ResvKeys{CRKey: 11}); !st.OK() {
		t.Fatalf("unregister: %v", st)
	}
	if r := q2.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
		t.Fatalf("write with no reservation left: %v", r.cqe.Status)
	}
	if st := resvCmd(q1, nvme.CmdResvAcquire, nvme.ResvCmd{Action: 7, Type: 1}, nvme.ResvKeys{}); st != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("acquire by unregistered host: %v", st)
	}
}

// TestPreemptAndAbortDrains: preempt-and-abort must not complete while a
// write of the preempted host that passed the reservation check is still
// executing on the device.
func TestPreemptAndAbortDrains(t *testing.T) {
	g := &gatedDevice{Device: blockdev.NewMem(testSize, testBS), entered: make(chan struct{}, 1)}
	_, addr := newTarget(t, Config{}, g)
	_, id1 := adminConnect(t, addr, 0, testHostNQN, testHostID)
	_, id2 := adminConnect(t, addr, 0, testHostNQN2, testHostID2)
	old := ioConnect(t, addr, 0, testHostNQN, testHostID, id1, 1)
	next := ioConnect(t, addr, 0, testHostNQN2, testHostID2, id2, 1)
	resvCmd(old, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 1})
	resvCmd(old, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 1})
	resvCmd(next, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: 2})

	g.mu.Lock() // hold the stale owner's write inside the device
	var unlock sync.Once
	release := func() { unlock.Do(g.mu.Unlock) }
	t.Cleanup(release) // runs before the target's Close on failure
	for len(g.entered) > 0 {
		<-g.entered
	}
	wdone := make(chan nvme.Status, 1)
	go func() {
		s := rwSQE(nvme.CmdWrite, 1, 0, 1)
		r, err := old.try(s, make([]byte, testBS), true)
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
		t.Fatalf("preempt-and-abort completed (%v) while the preempted write was in flight", st)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	if st := <-wdone; !st.OK() {
		t.Fatalf("in-flight write: %v", st)
	}
	if st := <-pdone; !st.OK() {
		t.Fatalf("preempt-and-abort: %v", st)
	}
	if r := old.writeBlocks(1, 0, make([]byte, testBS), testBS, true); r.cqe.Status != nvme.StatusReservationConflict|nvme.StatusDNR {
		t.Fatalf("write after preempt-and-abort: %v", r.cqe.Status)
	}
}
