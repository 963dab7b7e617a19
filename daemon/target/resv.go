package target

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"tier0/daemon/nvme"
)

// reservation is the reservation state of one namespace as this target
// applies it. gate orders commands against reservation changes: I/O holds
// it shared from the access check until the device operation returns;
// reservation commands (and applying a change made through another target)
// hold it exclusively, so a preempt (and abort) returns only after every
// command admitted under the old state has finished.
type reservation struct {
	gate    sync.RWMutex
	ns      *namespace
	backend ReservationBackend
	state   ReservationState // under gate
}

// loadReservation reads a namespace's reservation state from its backend.
func loadReservation(ns *namespace, b ReservationBackend) (*reservation, error) {
	st, err := b.Load(ns.sub.nqn, ns.id)
	if err != nil {
		return nil, err
	}
	if st.Registrants == nil {
		st.Registrants = map[[16]byte]uint64{}
	}
	return &reservation{ns: ns, backend: b, state: st}, nil
}

func (s *ReservationState) isHolder(h [16]byte) bool {
	if s.Type == nvme.ResvNone {
		return false
	}
	if s.Type.AllRegistrants() {
		_, ok := s.Registrants[h]
		return ok
	}
	return s.Held && s.Holder == h
}

// allowsLocked reports whether host h may read (write=false) or write.
// gate must be held.
func (r *reservation) allowsLocked(h [16]byte, write bool) bool {
	s := &r.state
	if s.Type == nvme.ResvNone {
		return true
	}
	_, reg := s.Registrants[h]
	return s.Type.Allows(write, s.isHolder(h), reg)
}

// applyLocked makes st the namespace's state here and raises the
// reservation notifications it means for this target's controllers.
// gate must be held exclusively.
func (r *reservation) applyLocked(st ReservationState) {
	if st.Registrants == nil {
		st.Registrants = map[[16]byte]uint64{}
	}
	old := r.state
	r.state = st
	notes := resvNotifications(&old, &st)
	if len(notes) == 0 {
		return
	}
	for _, c := range r.ns.sub.controllers() {
		if t, ok := notes[c.hostID]; ok {
			c.resvNotify(t, r.ns.id)
		}
	}
}

// refreshLocked applies the backend's current state if it is newer than
// the one here (a change made through another target whose notice has not
// arrived yet). gate must be held exclusively.
func (r *reservation) refreshLocked(t *Target) nvme.Status {
	cur, err := r.backend.Load(r.ns.sub.nqn, r.ns.id)
	if err != nil {
		t.warnLimited("resv-load:"+r.ns.sub.nqn, "reading the reservation state failed; the command is refused, the host may retry",
			"subnqn", r.ns.sub.nqn, "nsid", r.ns.id, "err", err)
		return nvme.StatusInternal
	}
	if cur.Version > r.state.Version {
		r.applyLocked(cur)
	}
	return nvme.StatusSuccess
}

// change decides a reservation command on the current state with decide
// and stores the result; on a lost race it decides again on the newer
// state. It holds the gate exclusively throughout.
func (r *reservation) change(t *Target, c *controller, op, action uint8, decide func(st *ReservationState) (nvme.Status, bool)) nvme.Status {
	r.gate.Lock() // waits for every admitted command to finish
	defer r.gate.Unlock()
	if st := r.refreshLocked(t); !st.OK() {
		return st
	}
	nqn, nsid := r.ns.sub.nqn, r.ns.id
	for try := 0; try < 16; try++ {
		st := r.state.clone()
		status, changed := decide(&st)
		if !status.OK() || !changed {
			return status
		}
		st.Cause = ReservationCause{Opcode: op, Action: action, Host: c.hostID}
		stored, err := r.backend.Store(nqn, nsid, r.state, st)
		var stale *StaleReservationError
		if errors.As(err, &stale) {
			r.applyLocked(stale.Current)
			continue
		}
		if err != nil {
			t.log.Error("storing the reservation state failed; the change is refused", "subnqn", nqn, "nsid", nsid, "err", err)
			return nvme.StatusInternal
		}
		r.applyLocked(stored)
		t.log.Info("reservation changed", "subnqn", nqn, "nsid", nsid, "op", fmt.Sprintf("%#x/%d", op, action),
			"type", stored.Type, "generation", stored.Generation, "registrants", len(stored.Registrants), "version", stored.Version, "cntlid", c.id)
		return nvme.StatusSuccess
	}
	t.warnLimited("resv-contended:"+nqn, "reservation command lost 16 races with other paths; the host may retry", "subnqn", nqn, "nsid", nsid)
	return nvme.StatusCmdInterrupted
}

// ptplAllowed reports whether the namespace's PTPL state may become on.
func (r *reservation) ptplAllowed(on bool) bool {
	switch r.backend.PTPL() {
	case PTPLNone:
		return !on
	case PTPLAlways:
		return on
	}
	return true
}

func (r *reservation) ptpl() bool {
	r.gate.RLock()
	defer r.gate.RUnlock()
	return r.state.PTPL
}

// setPTPL executes Set Features Reservation Persistence.
func (r *reservation) setPTPL(t *Target, c *controller, on bool) nvme.Status {
	if !r.ptplAllowed(on) {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	return r.change(t, c, nvme.AdminSetFeatures, nvme.FeatResvPersistence, func(st *ReservationState) (nvme.Status, bool) {
		if st.PTPL == on {
			return nvme.StatusSuccess, false
		}
		st.PTPL = on
		return nvme.StatusSuccess, true
	})
}

// modify executes Register, Acquire or Release.
func (r *reservation) modify(t *Target, req *request, c *controller) nvme.Status {
	cmd := nvme.ParseResvCmd(req.sqe.CDW10)
	need := nvme.ResvKeysLen
	if req.sqe.Opcode == nvme.CmdResvRelease {
		need = nvme.ResvReleaseDataLen
	}
	if len(req.data) < need {
		return nvme.StatusSGLInvalidData | nvme.StatusDNR
	}
	keys, _ := nvme.ParseResvKeys(req.data)
	op := req.sqe.Opcode
	if op == nvme.CmdResvRegister && cmd.CPTPL >= 2 && !r.ptplAllowed(cmd.CPTPL == 3) {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	h := c.hostID
	return r.change(t, c, op, cmd.Action, func(st *ReservationState) (nvme.Status, bool) {
		key, registered := st.Registrants[h]
		nqn, nsid := r.ns.sub.nqn, r.ns.id
		switch op {
		case nvme.CmdResvRegister:
			if c.sub.epochFencing && !epochAllowsRegister(st, cmd, keys, h, registered) {
				t.warnLimited("epoch-fence:"+nqn, "reservation register refused: it would lower the holder's epoch key",
					"subnqn", nqn, "nsid", nsid, "cntlid", c.id, "key", key, "new_key", keys.Key2)
				return nvme.StatusReservationConflict | nvme.StatusDNR, false
			}
			status, changed := registerAction(st, cmd, keys, h, key, registered)
			if status.OK() && cmd.CPTPL >= 2 && st.PTPL != (cmd.CPTPL == 3) {
				st.PTPL = cmd.CPTPL == 3
				changed = true
			}
			return status, changed
		case nvme.CmdResvAcquire:
			if !registered || key != keys.CRKey {
				return nvme.StatusReservationConflict | nvme.StatusDNR, false
			}
			if c.sub.epochFencing {
				if newer, ok := epochAllowsPreempt(st, cmd, keys, h); !ok {
					t.warnLimited("epoch-fence:"+nqn, "reservation preempt refused: a host with a newer or equal epoch key holds or is registered",
						"subnqn", nqn, "nsid", nsid, "cntlid", c.id, "key", keys.CRKey, "newer_key", newer)
					return nvme.StatusReservationConflict | nvme.StatusDNR, false
				}
			}
			return acquireAction(st, cmd, keys, h)
		case nvme.CmdResvRelease:
			if !registered || key != keys.CRKey {
				return nvme.StatusReservationConflict | nvme.StatusDNR, false
			}
			if c.sub.epochFencing && cmd.Action == nvme.ResvClear {
				if newer, ok := maxOtherKey(st, h); ok && newer >= keys.CRKey {
					t.warnLimited("epoch-fence:"+nqn, "reservation clear refused: another host has a newer or equal epoch key",
						"subnqn", nqn, "nsid", nsid, "cntlid", c.id, "key", keys.CRKey, "newer_key", newer)
					return nvme.StatusReservationConflict | nvme.StatusDNR, false
				}
			}
			return releaseAction(st, cmd, h)
		}
		return nvme.StatusInvalidOpcode | nvme.StatusDNR, false
	})
}

// resvNotifications are the reservation notifications, by host, that the
// change from old to next raises (NVMe base spec, reservations): a
// preempt tells the hosts whose registrations it removed (registration
// preempted); a clear tells every other registrant (reservation
// preempted); a release of a registrants-only or all-registrants
// reservation tells the other registrants (reservation released).
func resvNotifications(old, next *ReservationState) map[[16]byte]uint8 {
	c := next.Cause
	if c.Opcode == 0 || next.Version == old.Version {
		return nil
	}
	out := map[[16]byte]uint8{}
	switch {
	case c.Opcode == nvme.CmdResvAcquire && (c.Action == nvme.ResvPreempt || c.Action == nvme.ResvPreemptAndAbort):
		for h := range old.Registrants {
			if _, ok := next.Registrants[h]; !ok && h != c.Host {
				out[h] = nvme.ResvNotifRegPreempted
			}
		}
	case c.Opcode == nvme.CmdResvRelease && c.Action == nvme.ResvClear:
		for h := range old.Registrants {
			if h != c.Host {
				out[h] = nvme.ResvNotifResvPreempted
			}
		}
	case c.Opcode == nvme.CmdResvRelease && c.Action == nvme.ResvRelease && old.Type >= nvme.ResvWriteExclusiveRO && next.Type == nvme.ResvNone:
		for h := range next.Registrants {
			if h != c.Host {
				out[h] = nvme.ResvNotifResvReleased
			}
		}
	}
	return out
}

// ApplyReservation makes st the reservation state of a namespace on this
// target if it is newer (Version) than the one here: a cluster's backend
// calls it for each change made through another node. It returns once
// every command admitted under the old state has finished, so a caller
// that then acknowledges the change can promise that no command the new
// state forbids still runs here.
func (t *Target) ApplyReservation(subnqn string, nsid uint32, st ReservationState) error {
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	ns := s.namespace(nsid)
	if ns == nil {
		return fmt.Errorf("namespace %d of %s: %w", nsid, subnqn, ErrNotFound)
	}
	ns.resv.gate.Lock()
	defer ns.resv.gate.Unlock()
	if st.Version > ns.resv.state.Version {
		ns.resv.applyLocked(st.clone())
		t.log.Info("reservation applied", "subnqn", subnqn, "nsid", nsid, "type", st.Type, "generation", st.Generation,
			"registrants", len(st.Registrants), "version", st.Version)
	}
	return nil
}

// Reservation returns a namespace's reservation state as this target
// applies it.
func (t *Target) Reservation(subnqn string, nsid uint32) (ReservationState, error) {
	s, err := t.lookup(subnqn)
	if err != nil {
		return ReservationState{}, err
	}
	ns := s.namespace(nsid)
	if ns == nil {
		return ReservationState{}, fmt.Errorf("namespace %d of %s: %w", nsid, subnqn, ErrNotFound)
	}
	ns.resv.gate.RLock()
	defer ns.resv.gate.RUnlock()
	return ns.resv.state.clone(), nil
}

func registerAction(st *ReservationState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte, key uint64, registered bool) (nvme.Status, bool) {
	if cmd.CPTPL == 1 {
		return nvme.StatusInvalidField | nvme.StatusDNR, false
	}
	switch cmd.Action {
	case nvme.ResvRegister:
		if registered {
			if key == keys.Key2 {
				return nvme.StatusSuccess, false
			}
			return nvme.StatusReservationConflict | nvme.StatusDNR, false
		}
		st.Registrants[h] = keys.Key2
	case nvme.ResvUnregister:
		if !registered || (!cmd.IEKey && key != keys.CRKey) {
			return nvme.StatusReservationConflict | nvme.StatusDNR, false
		}
		wasHolder := st.isHolder(h)
		delete(st.Registrants, h)
		if wasHolder && (!st.Type.AllRegistrants() || len(st.Registrants) == 0) {
			st.Type, st.Held = nvme.ResvNone, false
		}
	case nvme.ResvReplace:
		if !registered || (!cmd.IEKey && key != keys.CRKey) {
			return nvme.StatusReservationConflict | nvme.StatusDNR, false
		}
		st.Registrants[h] = keys.Key2
	default:
		return nvme.StatusInvalidField | nvme.StatusDNR, false
	}
	st.Generation++
	return nvme.StatusSuccess, true
}

// maxOtherKey returns the largest key registered by a host other than self.
func maxOtherKey(st *ReservationState, self [16]byte) (uint64, bool) {
	var m uint64
	found := false
	for id, k := range st.Registrants {
		if id != self && (!found || k > m) {
			m, found = k, true
		}
	}
	return m, found
}

// epochAllowsPreempt applies SubsystemConfig.EpochFencing to an Acquire:
// a Preempt or Preempt-and-Abort by h (whose key is keys.CRKey) must not
// take the reservation from, or remove the registration of, another host
// whose key is >= keys.CRKey. It returns the offending key when refused.
func epochAllowsPreempt(st *ReservationState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte) (uint64, bool) {
	if cmd.Action != nvme.ResvPreempt && cmd.Action != nvme.ResvPreemptAndAbort {
		return 0, true
	}
	mine := keys.CRKey
	if st.Type != nvme.ResvNone && !st.Type.AllRegistrants() && st.Held && st.Holder != h {
		if hk := st.Registrants[st.Holder]; hk >= mine {
			return hk, false
		}
	}
	if st.Type.AllRegistrants() && keys.Key2 == 0 {
		// removes every other registrant
		if m, ok := maxOtherKey(st, h); ok && m >= mine {
			return m, false
		}
		return 0, true
	}
	// removes the other registrants whose key is PRKEY
	for id, k := range st.Registrants {
		if id != h && k == keys.Key2 && k >= mine {
			return k, false
		}
	}
	return 0, true
}

// epochAllowsRegister applies SubsystemConfig.EpochFencing to a Register:
// the holder of the reservation may not replace its key with a lower one
// (that would hand the reservation to an older epoch).
func epochAllowsRegister(st *ReservationState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte, registered bool) bool {
	if cmd.Action != nvme.ResvReplace || !registered || !st.isHolder(h) {
		return true
	}
	return keys.Key2 >= st.Registrants[h]
}

// removeKey unregisters every host except self whose key is k.
func removeKey(st *ReservationState, k uint64, self [16]byte) {
	for id, v := range st.Registrants {
		if v == k && id != self {
			delete(st.Registrants, id)
		}
	}
}

func acquireAction(st *ReservationState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte) (nvme.Status, bool) {
	if !cmd.Type.Valid() {
		return nvme.StatusInvalidField | nvme.StatusDNR, false
	}
	switch cmd.Action {
	case nvme.ResvAcquire:
		if st.Type == nvme.ResvNone {
			st.Type, st.Holder, st.Held = cmd.Type, h, true
			return nvme.StatusSuccess, true
		}
		if st.isHolder(h) && st.Type == cmd.Type {
			return nvme.StatusSuccess, false
		}
		return nvme.StatusReservationConflict | nvme.StatusDNR, false
	case nvme.ResvPreempt, nvme.ResvPreemptAndAbort:
		pr := keys.Key2
		switch {
		case st.Type.AllRegistrants() && pr == 0:
			for id := range st.Registrants {
				if id != h {
					delete(st.Registrants, id)
				}
			}
			st.Type, st.Holder, st.Held = cmd.Type, h, true
		case st.Type.AllRegistrants():
			removeKey(st, pr, h)
		case st.Type != nvme.ResvNone && st.Held && st.Registrants[st.Holder] == pr:
			removeKey(st, pr, h)
			st.Type, st.Holder, st.Held = cmd.Type, h, true
		default:
			if pr == 0 {
				return nvme.StatusInvalidField | nvme.StatusDNR, false
			}
			removeKey(st, pr, h)
		}
		st.Generation++
		return nvme.StatusSuccess, true
	}
	return nvme.StatusInvalidField | nvme.StatusDNR, false
}

func releaseAction(st *ReservationState, cmd nvme.ResvCmd, h [16]byte) (nvme.Status, bool) {
	switch cmd.Action {
	case nvme.ResvRelease:
		if st.Type == nvme.ResvNone || !st.isHolder(h) {
			return nvme.StatusSuccess, false
		}
		if cmd.Type != st.Type {
			return nvme.StatusInvalidField | nvme.StatusDNR, false
		}
		st.Type, st.Held = nvme.ResvNone, false
		return nvme.StatusSuccess, true
	case nvme.ResvClear:
		st.Type, st.Held = nvme.ResvNone, false
		clear(st.Registrants)
		st.Generation++
		return nvme.StatusSuccess, true
	}
	return nvme.StatusInvalidField | nvme.StatusDNR, false
}

// report executes Reservation Report (extended data structure only). It
// first catches up with the backend, so that every path reports the same.
// The controller ID of every registrant is FFFFh: the subsystem uses the
// dynamic controller model (and a host's controllers on other paths are
// not this target's to name).
func (r *reservation) report(req *request, c *controller) nvme.Status {
	if req.sqe.CDW11&nvme.ResvReportEDS == 0 {
		return nvme.StatusHostIDInconsistent | nvme.StatusDNR
	}
	n := (uint64(req.sqe.CDW10) + 1) * 4
	if n > uint64(c.t.cfg.MaxDataTransfer) {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	r.gate.Lock()
	if st := r.refreshLocked(c.t); !st.OK() {
		r.gate.Unlock()
		return st
	}
	st := &r.state
	out := nvme.ResvStatus{Gen: st.Generation, Type: st.Type, PTPLS: st.PTPL}
	for id, k := range st.Registrants {
		out.Registrants = append(out.Registrants, nvme.Registrant{CntlID: nvme.CntlIDDynamic, HostID: id, RKey: k, Holder: st.isHolder(id)})
	}
	r.gate.Unlock()
	slices.SortFunc(out.Registrants, func(a, b nvme.Registrant) int {
		for i := range a.HostID {
			if a.HostID[i] != b.HostID[i] {
				return int(a.HostID[i]) - int(b.HostID[i])
			}
		}
		return 0
	})
	page := make([]byte, n)
	copy(page, out.Append(nil))
	req.sendData(page)
	return nvme.StatusSuccess
}
