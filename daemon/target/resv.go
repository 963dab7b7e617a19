package target

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"tier0/daemon/nvme"
)

// reservation is the reservation state of one namespace. gate orders
// commands against reservation changes: I/O holds it shared from the
// access check until the device operation returns; Register, Acquire and
// Release hold it exclusively, so a preempt (and abort) returns only after
// every command admitted under the old state has finished.
type reservation struct {
	gate  sync.RWMutex
	path  string // persistence file, "" for memory only
	state resvState
}

type resvState struct {
	Gen     uint32              `json:"generation"`
	Type    nvme.ResvType       `json:"type"`
	Holder  [16]byte            `json:"-"`
	Held    bool                `json:"-"`
	Regs    map[[16]byte]uint64 `json:"-"`
	SubNQN  string              `json:"subnqn"`
	NSID    uint32              `json:"nsid"`
	HolderS string              `json:"holder,omitempty"`
	RegsS   []resvReg           `json:"registrants"`
}

type resvReg struct {
	HostID string `json:"hostid"`
	Key    uint64 `json:"key"`
}

func (s resvState) clone() resvState {
	n := s
	n.Regs = make(map[[16]byte]uint64, len(s.Regs))
	for k, v := range s.Regs {
		n.Regs[k] = v
	}
	return n
}

func resvPath(dir, subnqn string, nsid uint32) string {
	h := sha256.Sum256([]byte(subnqn))
	return filepath.Join(dir, fmt.Sprintf("resv-%x-ns%d.json", h[:8], nsid))
}

// loadReservation reads a namespace's persisted reservation state, or
// starts empty when there is none (or dir is "").
func loadReservation(dir, subnqn string, nsid uint32) (*reservation, error) {
	r := &reservation{state: resvState{Regs: map[[16]byte]uint64{}, SubNQN: subnqn, NSID: nsid}}
	if dir == "" {
		return r, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("reservation state dir %s: %w", dir, err)
	}
	r.path = resvPath(dir, subnqn, nsid)
	b, err := os.ReadFile(r.path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read reservation state: %w", err)
	}
	var st resvState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("reservation state %s is corrupt (%v); move it away to start with no reservation: %w", r.path, err, ErrInvalid)
	}
	st.Regs = map[[16]byte]uint64{}
	parse := func(s string) ([16]byte, error) {
		var id [16]byte
		b, err := hex.DecodeString(s)
		if err != nil || len(b) != 16 {
			return id, fmt.Errorf("reservation state %s: host ID %q is not 32 hex digits: %w", r.path, s, ErrInvalid)
		}
		copy(id[:], b)
		return id, nil
	}
	for _, g := range st.RegsS {
		id, err := parse(g.HostID)
		if err != nil {
			return nil, err
		}
		st.Regs[id] = g.Key
	}
	if st.HolderS != "" {
		if st.Holder, err = parse(st.HolderS); err != nil {
			return nil, err
		}
		st.Held = true
	}
	if st.Type != nvme.ResvNone && !st.Type.Valid() {
		return nil, fmt.Errorf("reservation state %s: type %d invalid: %w", r.path, st.Type, ErrInvalid)
	}
	st.SubNQN, st.NSID = subnqn, nsid
	r.state = st
	return r, nil
}

// save writes st atomically to the persistence file.
func (r *reservation) save(st *resvState) error {
	if r.path == "" {
		return nil
	}
	st.RegsS = st.RegsS[:0]
	for id, k := range st.Regs {
		st.RegsS = append(st.RegsS, resvReg{HostID: hex.EncodeToString(id[:]), Key: k})
	}
	slices.SortFunc(st.RegsS, func(a, b resvReg) int {
		if a.HostID < b.HostID {
			return -1
		}
		return 1
	})
	st.HolderS = ""
	if st.Held {
		st.HolderS = hex.EncodeToString(st.Holder[:])
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := r.path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, r.path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(r.path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

func (s *resvState) isHolder(h [16]byte) bool {
	if s.Type == nvme.ResvNone {
		return false
	}
	if s.Type.AllRegistrants() {
		_, ok := s.Regs[h]
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
	_, reg := s.Regs[h]
	return s.Type.Allows(write, s.isHolder(h), reg)
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
	r.gate.Lock() // waits for every admitted command to finish
	defer r.gate.Unlock()
	st := r.state.clone()
	h := c.hostID
	key, registered := st.Regs[h]
	var status nvme.Status
	changed := false
	switch req.sqe.Opcode {
	case nvme.CmdResvRegister:
		if c.sub.epochFencing && !epochAllowsRegister(&st, cmd, keys, h, registered) {
			t.warnLimited("epoch-fence:"+st.SubNQN, "reservation register refused: it would lower the holder's epoch key",
				"subnqn", st.SubNQN, "nsid", st.NSID, "cntlid", c.id, "key", key, "new_key", keys.Key2)
			return nvme.StatusReservationConflict | nvme.StatusDNR
		}
		status, changed = registerAction(&st, cmd, keys, h, key, registered)
	case nvme.CmdResvAcquire:
		if !registered || key != keys.CRKey {
			return nvme.StatusReservationConflict | nvme.StatusDNR
		}
		if c.sub.epochFencing {
			if newer, ok := epochAllowsPreempt(&st, cmd, keys, h); !ok {
				t.warnLimited("epoch-fence:"+st.SubNQN, "reservation preempt refused: a host with a newer or equal epoch key holds or is registered",
					"subnqn", st.SubNQN, "nsid", st.NSID, "cntlid", c.id, "key", keys.CRKey, "newer_key", newer)
				return nvme.StatusReservationConflict | nvme.StatusDNR
			}
		}
		status, changed = acquireAction(&st, cmd, keys, h)
	case nvme.CmdResvRelease:
		if !registered || key != keys.CRKey {
			return nvme.StatusReservationConflict | nvme.StatusDNR
		}
		if c.sub.epochFencing && cmd.Action == nvme.ResvClear {
			if newer, ok := maxOtherKey(&st, h); ok && newer >= keys.CRKey {
				t.warnLimited("epoch-fence:"+st.SubNQN, "reservation clear refused: another host has a newer or equal epoch key",
					"subnqn", st.SubNQN, "nsid", st.NSID, "cntlid", c.id, "key", keys.CRKey, "newer_key", newer)
				return nvme.StatusReservationConflict | nvme.StatusDNR
			}
		}
		status, changed = releaseAction(&st, cmd, h)
	}
	if !status.OK() || !changed {
		return status
	}
	if err := r.save(&st); err != nil {
		t.log.Error("persisting reservation state failed; the change is refused", "subnqn", st.SubNQN, "nsid", st.NSID, "path", r.path, "err", err)
		return nvme.StatusInternal
	}
	r.state = st
	t.log.Info("reservation changed", "subnqn", st.SubNQN, "nsid", st.NSID, "op", fmt.Sprintf("%#x/%d", req.sqe.Opcode, cmd.Action),
		"type", st.Type, "generation", st.Gen, "registrants", len(st.Regs), "cntlid", c.id)
	return nvme.StatusSuccess
}

func registerAction(st *resvState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte, key uint64, registered bool) (nvme.Status, bool) {
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
		st.Regs[h] = keys.Key2
	case nvme.ResvUnregister:
		if !registered || (!cmd.IEKey && key != keys.CRKey) {
			return nvme.StatusReservationConflict | nvme.StatusDNR, false
		}
		wasHolder := st.isHolder(h)
		delete(st.Regs, h)
		if wasHolder && (!st.Type.AllRegistrants() || len(st.Regs) == 0) {
			st.Type, st.Held = nvme.ResvNone, false
		}
	case nvme.ResvReplace:
		if !registered || (!cmd.IEKey && key != keys.CRKey) {
			return nvme.StatusReservationConflict | nvme.StatusDNR, false
		}
		st.Regs[h] = keys.Key2
	default:
		return nvme.StatusInvalidField | nvme.StatusDNR, false
	}
	st.Gen++
	return nvme.StatusSuccess, true
}

// maxOtherKey returns the largest key registered by a host other than self.
func maxOtherKey(st *resvState, self [16]byte) (uint64, bool) {
	var m uint64
	found := false
	for id, k := range st.Regs {
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
func epochAllowsPreempt(st *resvState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte) (uint64, bool) {
	if cmd.Action != nvme.ResvPreempt && cmd.Action != nvme.ResvPreemptAndAbort {
		return 0, true
	}
	mine := keys.CRKey
	if st.Type != nvme.ResvNone && !st.Type.AllRegistrants() && st.Held && st.Holder != h {
		if hk := st.Regs[st.Holder]; hk >= mine {
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
	for id, k := range st.Regs {
		if id != h && k == keys.Key2 && k >= mine {
			return k, false
		}
	}
	return 0, true
}

// epochAllowsRegister applies SubsystemConfig.EpochFencing to a Register:
// the holder of the reservation may not replace its key with a lower one
// (that would hand the reservation to an older epoch).
func epochAllowsRegister(st *resvState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte, registered bool) bool {
	if cmd.Action != nvme.ResvReplace || !registered || !st.isHolder(h) {
		return true
	}
	return keys.Key2 >= st.Regs[h]
}

// removeKey unregisters every host except self whose key is k.
func removeKey(st *resvState, k uint64, self [16]byte) {
	for id, v := range st.Regs {
		if v == k && id != self {
			delete(st.Regs, id)
		}
	}
}

func acquireAction(st *resvState, cmd nvme.ResvCmd, keys nvme.ResvKeys, h [16]byte) (nvme.Status, bool) {
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
			for id := range st.Regs {
				if id != h {
					delete(st.Regs, id)
				}
			}
			st.Type, st.Holder, st.Held = cmd.Type, h, true
		case st.Type.AllRegistrants():
			removeKey(st, pr, h)
		case st.Type != nvme.ResvNone && st.Held && st.Regs[st.Holder] == pr:
			removeKey(st, pr, h)
			st.Type, st.Holder, st.Held = cmd.Type, h, true
		default:
			if pr == 0 {
				return nvme.StatusInvalidField | nvme.StatusDNR, false
			}
			removeKey(st, pr, h)
		}
		st.Gen++
		return nvme.StatusSuccess, true
	}
	return nvme.StatusInvalidField | nvme.StatusDNR, false
}

func releaseAction(st *resvState, cmd nvme.ResvCmd, h [16]byte) (nvme.Status, bool) {
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
		clear(st.Regs)
		st.Gen++
		return nvme.StatusSuccess, true
	}
	return nvme.StatusInvalidField | nvme.StatusDNR, false
}

// report executes Reservation Report (extended data structure only).
func (r *reservation) report(req *request, c *controller) nvme.Status {
	if req.sqe.CDW11&nvme.ResvReportEDS == 0 {
		return nvme.StatusHostIDInconsistent | nvme.StatusDNR
	}
	n := (uint64(req.sqe.CDW10) + 1) * 4
	if n > uint64(c.t.cfg.MaxDataTransfer) {
		return nvme.StatusInvalidField | nvme.StatusDNR
	}
	cntl := map[[16]byte]uint16{}
	for _, o := range c.sub.controllers() {
		cntl[o.hostID] = o.id
	}
	r.gate.RLock()
	st := r.state
	out := nvme.ResvStatus{Gen: st.Gen, Type: st.Type, PTPLS: r.path != ""}
	for id, k := range st.Regs {
		g := nvme.Registrant{CntlID: nvme.CntlIDDynamic, HostID: id, RKey: k, Holder: st.isHolder(id)}
		if cid, ok := cntl[id]; ok {
			g.CntlID = cid
		}
		out.Registrants = append(out.Registrants, g)
	}
	r.gate.RUnlock()
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
