package target

import (
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

const conflict = nvme.StatusReservationConflict | nvme.StatusDNR

// newFencedTarget serves testSubNQN with SubsystemConfig.EpochFencing set
// to fencing and returns I/O queues of host one ("stale", old epoch) and
// host two ("next", new epoch).
func newFencedTarget(t *testing.T, fencing bool) (stale, next *rawClient) {
	t.Helper()
	cfg := Config{Listen: "127.0.0.1:0", Logger: testLogger(t)}
	tg, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	if err := tg.AddSubsystem(SubsystemConfig{NQN: testSubNQN, AllowedHosts: []string{testHostNQN, testHostNQN2}, EpochFencing: fencing}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddNamespace(testSubNQN, NamespaceConfig{NSID: 1, Device: blockdev.NewMem(testSize, testBS)}); err != nil {
		t.Fatal(err)
	}
	addr := tg.Addr().String()
	_, id1 := adminConnect(t, addr, 0, testHostNQN, testHostID)
	_, id2 := adminConnect(t, addr, 0, testHostNQN2, testHostID2)
	return ioConnect(t, addr, 0, testHostNQN, testHostID, id1, 1), ioConnect(t, addr, 0, testHostNQN2, testHostID2, id2, 1)
}

func register(t *testing.T, q *rawClient, key uint64) {
	t.Helper()
	if st := resvCmd(q, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvRegister}, nvme.ResvKeys{Key2: key}); !st.OK() {
		t.Fatalf("register key %d: %v", key, st)
	}
}

func preempt(q *rawClient, action uint8, crkey, prkey uint64) nvme.Status {
	return resvCmd(q, nvme.CmdResvAcquire, nvme.ResvCmd{Action: action, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: crkey, Key2: prkey})
}

func holderOf(t *testing.T, q *rawClient) (id [16]byte, key uint64) {
	t.Helper()
	for _, g := range resvReport(t, q).Registrants {
		if g.Holder {
			return g.HostID, g.RKey
		}
	}
	return id, 0
}

// TestEpochFencingRefusesStalePreempt: with EpochFencing, a host whose
// key (epoch) is not above the holder's can neither preempt (with or
// without abort) nor clear the reservation, nor can the holder lower its
// own key; a newer epoch still takes over. Without EpochFencing the same
// stale preempt succeeds (plain NVMe), which is what the option exists to
// stop.
func TestEpochFencingRefusesStalePreempt(t *testing.T) {
	blk := make([]byte, testBS)
	t.Run("off", func(t *testing.T) {
		stale, next := newFencedTarget(t, false)
		register(t, next, 5)
		if st := resvCmd(next, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 5}); !st.OK() {
			t.Fatal(st)
		}
		register(t, stale, 4)
		if st := preempt(stale, nvme.ResvPreemptAndAbort, 4, 5); !st.OK() {
			t.Fatalf("without EpochFencing a stale preempt-and-abort is plain NVMe and succeeds; got %v", st)
		}
	})
	t.Run("on", func(t *testing.T) {
		stale, next := newFencedTarget(t, true)
		// epoch 4 owned the member, epoch 5 took it over (allowed: 5 > 4)
		register(t, stale, 4)
		if st := resvCmd(stale, nvme.CmdResvAcquire, nvme.ResvCmd{Action: nvme.ResvAcquire, Type: nvme.ResvWriteExclusive}, nvme.ResvKeys{CRKey: 4}); !st.OK() {
			t.Fatal(st)
		}
		register(t, next, 5)
		if st := preempt(next, nvme.ResvPreemptAndAbort, 5, 4); !st.OK() {
			t.Fatalf("newer epoch 5 preempting holder 4: %v, want success", st)
		}
		// the stale owner comes back, re-registers its old epoch and
		// tries every way to take the member back
		register(t, stale, 4)
		for _, tc := range []struct {
			name         string
			action       uint8
			crkey, prkey uint64
		}{
			{"preempt-and-abort lower key", nvme.ResvPreemptAndAbort, 4, 5},
			{"preempt lower key", nvme.ResvPreempt, 4, 5},
		} {
			if st := preempt(stale, tc.action, tc.crkey, tc.prkey); st != conflict {
				t.Errorf("%s: %v, want reservation conflict", tc.name, st)
			}
		}
		if st := resvCmd(stale, nvme.CmdResvRelease, nvme.ResvCmd{Action: nvme.ResvClear}, nvme.ResvKeys{CRKey: 4}); st != conflict {
			t.Errorf("clear by the older epoch: %v, want reservation conflict", st)
		}
		// equal epochs do not take over either
		if st := resvCmd(stale, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvReplace}, nvme.ResvKeys{CRKey: 4, Key2: 5}); !st.OK() {
			t.Fatalf("replace 4 by 5 (not the holder): %v", st)
		}
		if st := preempt(stale, nvme.ResvPreemptAndAbort, 5, 5); st != conflict {
			t.Errorf("preempt-and-abort with an equal key: %v, want reservation conflict", st)
		}
		if id, key := holderOf(t, next); id != testHostID2 || key != 5 {
			t.Fatalf("holder after the refused attempts: %x key %d, want host two key 5", id, key)
		}
		if r := stale.writeBlocks(1, 0, blk, testBS, true); r.cqe.Status != conflict {
			t.Fatalf("stale owner's write: %v, want reservation conflict", r.cqe.Status)
		}
		if r := next.writeBlocks(1, 0, blk, testBS, true); !r.cqe.Status.OK() {
			t.Fatalf("holder's write: %v", r.cqe.Status)
		}
		// the holder cannot lower its own key (hand the member to an
		// older epoch); raising it is fine
		if st := resvCmd(next, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvReplace, IEKey: true}, nvme.ResvKeys{Key2: 3}); st != conflict {
			t.Errorf("holder replacing key 5 by 3: %v, want reservation conflict", st)
		}
		if st := resvCmd(next, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvReplace}, nvme.ResvKeys{CRKey: 5, Key2: 7}); !st.OK() {
			t.Fatalf("holder replacing key 5 by 7: %v", st)
		}
		// a newer epoch still takes over, and a plain re-preempt of
		// oneself stays allowed
		if st := resvCmd(stale, nvme.CmdResvRegister, nvme.ResvCmd{Action: nvme.ResvReplace}, nvme.ResvKeys{CRKey: 5, Key2: 8}); !st.OK() {
			t.Fatalf("replace 5 by 8: %v", st)
		}
		if st := preempt(stale, nvme.ResvPreemptAndAbort, 8, 7); !st.OK() {
			t.Fatalf("epoch 8 preempting holder 7: %v, want success", st)
		}
		if id, key := holderOf(t, next); id != testHostID || key != 8 {
			t.Fatalf("holder after the newer preempt: %x key %d, want host one key 8", id, key)
		}
		if st := preempt(stale, nvme.ResvPreempt, 8, 8); !st.OK() {
			t.Fatalf("holder preempting its own key: %v, want success", st)
		}
		// epoch 7 is gone (preempted); registered again it cannot remove
		// the newer registrant by naming its key with no reservation
		// taken, nor clear
		register(t, next, 7)
		if st := preempt(next, nvme.ResvPreempt, 7, 8); st != conflict {
			t.Errorf("epoch 7 preempting key 8: %v, want reservation conflict", st)
		}
	})
}
