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

// ReservationState is the reservation state of one namespace: what a
// ReservationBackend stores. Every target that serves the namespace (every
// path of a multipath namespace) must see the same one; the NVMe
// reservation is the subsystem's, not a controller's.
type ReservationState struct {
	Generation  uint32
	Type        nvme.ResvType
	Holder      [16]byte // host ID of the holder; valid while Held
	Held        bool
	Registrants map[[16]byte]uint64 // host ID -> reservation key
	// PTPL is the namespace's Persist Through Power Loss state.
	PTPL bool
	// Version orders the stored states (a backend's revision); 0: never
	// stored. A target applies a state only if it is newer than its own.
	Version int64
	// Cause is the command that produced the state; a target applying a
	// state made through another target derives the hosts' reservation
	// notifications from it.
	Cause ReservationCause
}

// ReservationCause names the reservation command that made a state.
type ReservationCause struct {
	Opcode uint8
	Action uint8
	Host   [16]byte
}

func (s ReservationState) clone() ReservationState {
	n := s
	n.Registrants = make(map[[16]byte]uint64, len(s.Registrants))
	for k, v := range s.Registrants {
		n.Registrants[k] = v
	}
	return n
}

// PTPLMode says what a ReservationBackend keeps through a power loss
// (a restart) of the target.
type PTPLMode uint8

const (
	// PTPLNone: the state is lost with the target (memory only). PTPLS
	// is not advertised; setting PTPL fails with Invalid Field.
	PTPLNone PTPLMode = iota
	// PTPLChangeable: the state survives a restart while the namespace's
	// PTPL state is set (the default); with it cleared (Register CPTPL
	// 10b, Set Features 0x83) a restart drops reservations and
	// registrants.
	PTPLChangeable
	// PTPLAlways: the state always survives (a cluster store); clearing
	// PTPL fails with Invalid Field.
	PTPLAlways
)

// ReservationBackend stores the reservation state of namespaces. The
// default (SubsystemConfig.Reservations nil) keeps it in memory, and with
// Config.StateDir in a file per namespace; a cluster supplies one shared by
// every node that serves the namespace (daemon/node: etcd), and tells each
// target of changes made elsewhere with Target.ApplyReservation.
type ReservationBackend interface {
	// Load returns the namespace's current state: the zero state with
	// Version 0 (and the backend's default PTPL) when none is stored.
	Load(subnqn string, nsid uint32) (ReservationState, error)
	// Store replaces the stored state with next if the stored one is
	// still prev (same Version): atomically, and durably before it
	// returns. It returns next with its new Version. When another change
	// came first it returns an error wrapping a *StaleReservationError
	// with the current state; the target then decides again. A command
	// completes only after Store returned: any other error fails it.
	Store(subnqn string, nsid uint32, prev, next ReservationState) (ReservationState, error)
	// PTPL says what survives a power loss.
	PTPL() PTPLMode
}

// StaleReservationError is returned by ReservationBackend.Store when the
// stored state is no longer the one the change was decided on.
type StaleReservationError struct {
	Current ReservationState
}

func (e *StaleReservationError) Error() string {
	return fmt.Sprintf("reservation state changed meanwhile (version %d stored); decide again on it", e.Current.Version)
}

// resvJSON is the stored form of a ReservationState (the file backend's,
// and the one cluster backends use through MarshalJSON).
type resvJSON struct {
	Generation  uint32        `json:"generation"`
	Type        nvme.ResvType `json:"type"`
	SubNQN      string        `json:"subnqn,omitempty"`
	NSID        uint32        `json:"nsid,omitempty"`
	Holder      string        `json:"holder,omitempty"`
	Registrants []resvReg     `json:"registrants"`
	PTPL        *bool         `json:"ptpl,omitempty"` // absent (files before it existed): set
	Cause       *causeJSON    `json:"cause,omitempty"`
}

type resvReg struct {
	HostID string `json:"hostid"`
	Key    uint64 `json:"key"`
}

type causeJSON struct {
	Opcode uint8  `json:"op"`
	Action uint8  `json:"action"`
	Host   string `json:"host"`
}

func (s ReservationState) toJSON() resvJSON {
	j := resvJSON{Generation: s.Generation, Type: s.Type, Registrants: []resvReg{}}
	for id, k := range s.Registrants {
		j.Registrants = append(j.Registrants, resvReg{HostID: hex.EncodeToString(id[:]), Key: k})
	}
	slices.SortFunc(j.Registrants, func(a, b resvReg) int {
		if a.HostID < b.HostID {
			return -1
		}
		return 1
	})
	if s.Held {
		j.Holder = hex.EncodeToString(s.Holder[:])
	}
	p := s.PTPL
	j.PTPL = &p
	if s.Cause.Opcode != 0 {
		j.Cause = &causeJSON{Opcode: s.Cause.Opcode, Action: s.Cause.Action, Host: hex.EncodeToString(s.Cause.Host[:])}
	}
	return j
}

func parseHostID(s string) ([16]byte, error) {
	var id [16]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 16 {
		return id, fmt.Errorf("host ID %q is not 32 hex digits: %w", s, ErrInvalid)
	}
	copy(id[:], b)
	return id, nil
}

func (j resvJSON) state() (ReservationState, error) {
	st := ReservationState{Generation: j.Generation, Type: j.Type, Registrants: map[[16]byte]uint64{}, PTPL: j.PTPL == nil || *j.PTPL}
	for _, g := range j.Registrants {
		id, err := parseHostID(g.HostID)
		if err != nil {
			return st, err
		}
		st.Registrants[id] = g.Key
	}
	if j.Holder != "" {
		id, err := parseHostID(j.Holder)
		if err != nil {
			return st, err
		}
		st.Holder, st.Held = id, true
	}
	if st.Type != nvme.ResvNone && !st.Type.Valid() {
		return st, fmt.Errorf("reservation type %d invalid: %w", st.Type, ErrInvalid)
	}
	if j.Cause != nil {
		id, err := parseHostID(j.Cause.Host)
		if err != nil {
			return st, err
		}
		st.Cause = ReservationCause{Opcode: j.Cause.Opcode, Action: j.Cause.Action, Host: id}
	}
	return st, nil
}

// MarshalJSON encodes the state (without Version, which is the store's).
func (s ReservationState) MarshalJSON() ([]byte, error) { return json.Marshal(s.toJSON()) }

// UnmarshalJSON decodes what MarshalJSON wrote (Version is left 0).
func (s *ReservationState) UnmarshalJSON(b []byte) error {
	var j resvJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	st, err := j.state()
	if err != nil {
		return err
	}
	*s = st
	return nil
}

// fileBackend is the default backend: memory, and with a directory one
// file per namespace written atomically (temp file, fsync, rename, fsync
// dir) before a command completes.
type fileBackend struct {
	dir    string
	mu     sync.Mutex
	states map[string]ReservationState
}

func newFileBackend(dir string) *fileBackend {
	return &fileBackend{dir: dir, states: map[string]ReservationState{}}
}

func (f *fileBackend) PTPL() PTPLMode {
	if f.dir == "" {
		return PTPLNone
	}
	return PTPLChangeable
}

func resvPath(dir, subnqn string, nsid uint32) string {
	h := sha256.Sum256([]byte(subnqn))
	return filepath.Join(dir, fmt.Sprintf("resv-%x-ns%d.json", h[:8], nsid))
}

func (f *fileBackend) key(subnqn string, nsid uint32) string {
	return fmt.Sprintf("%s\x00%d", subnqn, nsid)
}

// Load reads a namespace's persisted state once; a state persisted with
// PTPL cleared is dropped (the restart is the power loss).
func (f *fileBackend) Load(subnqn string, nsid uint32) (ReservationState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.key(subnqn, nsid)
	if st, ok := f.states[k]; ok {
		return st.clone(), nil
	}
	st := ReservationState{Registrants: map[[16]byte]uint64{}, PTPL: f.dir != ""}
	if f.dir != "" {
		if err := os.MkdirAll(f.dir, 0o755); err != nil {
			return st, fmt.Errorf("reservation state dir %s: %w", f.dir, err)
		}
		path := resvPath(f.dir, subnqn, nsid)
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return st, fmt.Errorf("read reservation state: %w", err)
		default:
			var j resvJSON
			if err := json.Unmarshal(b, &j); err != nil {
				return st, fmt.Errorf("reservation state %s is corrupt (%v); move it away to start with no reservation: %w", path, err, ErrInvalid)
			}
			loaded, err := j.state()
			if err != nil {
				return st, fmt.Errorf("reservation state %s: %w", path, err)
			}
			if loaded.PTPL {
				st = loaded
			} else {
				st.PTPL = false // not persisted through the restart
			}
			st.Cause = ReservationCause{}
			st.Version = 1
		}
	}
	f.states[k] = st
	return st.clone(), nil
}

func (f *fileBackend) Store(subnqn string, nsid uint32, prev, next ReservationState) (ReservationState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.key(subnqn, nsid)
	if cur, ok := f.states[k]; ok && cur.Version != prev.Version {
		return ReservationState{}, &StaleReservationError{Current: cur.clone()}
	}
	next.Version = prev.Version + 1
	if f.dir != "" {
		j := next.toJSON()
		j.SubNQN, j.NSID, j.Cause = subnqn, nsid, nil
		b, err := json.MarshalIndent(j, "", "  ")
		if err != nil {
			return ReservationState{}, err
		}
		if err := writeAtomic(resvPath(f.dir, subnqn, nsid), b); err != nil {
			return ReservationState{}, err
		}
	}
	f.states[k] = next.clone()
	return next, nil
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
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
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
