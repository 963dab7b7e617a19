package target

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/nvme"
)

// SubsystemConfig describes an NVM subsystem to serve.
type SubsystemConfig struct {
	// NQN names the subsystem; the same on every node that serves it.
	NQN string
	// Serial is the controller serial number (at most 20 ASCII bytes);
	// default: derived from the NQN, so identical on every node.
	Serial string
	// Model is the model number (default "tier0").
	Model string
	// AllowAnyHost lets every host connect; otherwise only AllowedHosts.
	AllowAnyHost bool
	// AllowedHosts lists the host NQNs allowed to connect.
	AllowedHosts []string
	// ANAStates sets the initial state of ANA groups (default optimized).
	ANAStates map[uint32]nvme.ANAState
	// DHCHAP turns on in-band authentication (see auth.go); zero: off.
	DHCHAP DHCHAPConfig
	// EpochFencing orders the reservation keys of every namespace of the
	// subsystem: a key is an ownership epoch, and no host may take the
	// reservation (or a registration) from a host whose key is not lower
	// than its own. With it on, Preempt and Preempt-and-Abort fail with
	// Reservation Conflict when CRKEY is <= the holder's key (another
	// host's) or <= a key the command would remove, Clear fails when another
	// registrant's key is >= CRKEY, and the holder cannot Register-Replace
	// its key with a lower one. For backend drive exports, where the key is
	// the array's ownership epoch: a stale owner can then never take a
	// member back from a newer one. Default off (plain NVMe semantics).
	EpochFencing bool
	// Reservations stores the hosts' reservation state of the
	// subsystem's namespaces; nil: in memory, and in Config.StateDir when
	// set. A cluster whose nodes all serve the subsystem gives each target
	// a backend they share (see ReservationBackend).
	Reservations ReservationBackend
}

// NamespaceConfig describes a namespace of a subsystem.
type NamespaceConfig struct {
	// NSID is the namespace ID, 1..1024.
	NSID uint32
	// Device backs the namespace. The target does not close it.
	Device blockdev.Device
	// NGUID, UUID and EUI64 identify the namespace; all-zero values are
	// left out. Multipath needs the same values on every node.
	NGUID [16]byte
	UUID  [16]byte
	EUI64 [8]byte
	// ANAGroup is the ANA group ID, 1..32 (default 1).
	ANAGroup uint32
	// Hosts, when not empty, are the only host NQNs (of those the
	// subsystem admits) that see and may use the namespace (nshosts.go).
	Hosts []string
}

type subsystem struct {
	t      *Target
	nqn    string
	serial string
	model  string
	disc   bool // the discovery subsystem

	mu        sync.RWMutex // read-locked on the I/O path
	anyHost   bool
	hosts     map[string]bool
	ns        map[uint32]*namespace
	ana       map[uint32]*anaGroup
	anaChgCnt uint64
	ctrls     map[uint16]*controller
	auth      *dhchapPolicy // nil: no authentication
	// epochFencing: see SubsystemConfig.EpochFencing; fixed at creation.
	epochFencing bool
	resvBackend  ReservationBackend
	// drains counts, per host, the dead I/O queues whose commands are
	// still executing (conn.beginDrain); while non-zero that host cannot
	// connect a new I/O queue. drained is closed (and replaced) whenever
	// a drain ends.
	drains  map[hostKey]int
	drained chan struct{}
}

type anaGroup struct {
	state  nvme.ANAState
	chgcnt uint64
}

type namespace struct {
	sub   *subsystem
	id    uint32
	dev   blockdev.Device
	bs    int
	nguid [16]byte
	uuid  [16]byte
	eui64 [8]byte
	group uint32
	resv  *reservation
	// hosts is the allow-list (nshosts.go); nil: every admitted host.
	hosts atomic.Pointer[nsHosts]
	// removed is set by RemoveNamespace; commands that find it set fail.
	removed atomic.Bool

	// stats for the SMART log
	readBytes, writtenBytes, reads, writes atomic.Uint64
}

// derivedSerial is a stable 20-character serial derived from the NQN.
func derivedSerial(nqn string) string {
	h := sha256.Sum256([]byte(nqn))
	return fmt.Sprintf("t0%018x", h[:9])[:20]
}

func validNQN(nqn string) error {
	if nqn == "" || len(nqn) > nvme.MaxNQNLen {
		return fmt.Errorf("NQN %q: must be 1..%d bytes: %w", nqn, nvme.MaxNQNLen, ErrInvalid)
	}
	if strings.ContainsRune(nqn, 0) {
		return fmt.Errorf("NQN %q contains a NUL byte: %w", nqn, ErrInvalid)
	}
	return nil
}

// AddSubsystem starts serving an NVM subsystem without namespaces.
func (t *Target) AddSubsystem(sc SubsystemConfig) error {
	if err := validNQN(sc.NQN); err != nil {
		return err
	}
	if sc.NQN == nvme.DiscoveryNQN {
		return fmt.Errorf("NQN %q is the discovery subsystem's, which every target serves already: %w", sc.NQN, ErrInvalid)
	}
	if len(sc.Serial) > 20 {
		return fmt.Errorf("serial %q is longer than 20 bytes: %w", sc.Serial, ErrInvalid)
	}
	s := &subsystem{t: t, nqn: sc.NQN, serial: sc.Serial, model: sc.Model, anyHost: sc.AllowAnyHost,
		hosts: map[string]bool{}, ns: map[uint32]*namespace{}, ana: map[uint32]*anaGroup{}, ctrls: map[uint16]*controller{}, anaChgCnt: 1,
		epochFencing: sc.EpochFencing, resvBackend: sc.Reservations, drains: map[hostKey]int{}, drained: make(chan struct{})}
	if s.resvBackend == nil {
		s.resvBackend = newFileBackend(t.cfg.StateDir)
	}
	if s.serial == "" {
		s.serial = derivedSerial(sc.NQN)
	}
	if s.model == "" {
		s.model = "tier0"
	}
	for _, h := range sc.AllowedHosts {
		if err := validNQN(h); err != nil {
			return fmt.Errorf("allowed host: %w", err)
		}
		s.hosts[h] = true
	}
	auth, err := parseDHCHAP(sc.DHCHAP)
	if err != nil {
		return fmt.Errorf("subsystem %s: %w", sc.NQN, err)
	}
	s.auth = auth
	for g, st := range sc.ANAStates {
		if g == 0 || g > maxANAGroups || !st.Valid() {
			return fmt.Errorf("ANA group %d state %v: groups are 1..%d and states optimized, non-optimized, inaccessible, persistent-loss or change: %w", g, st, maxANAGroups, ErrInvalid)
		}
		s.ana[g] = &anaGroup{state: st, chgcnt: 1}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	if _, ok := t.subsys[sc.NQN]; ok {
		return fmt.Errorf("subsystem %s: %w", sc.NQN, ErrExists)
	}
	t.subsys[sc.NQN] = s
	t.discoveryChangedLocked()
	t.log.Info("subsystem added", "subnqn", sc.NQN, "allow_any_host", sc.AllowAnyHost, "hosts", len(sc.AllowedHosts), "epoch_fencing", sc.EpochFencing)
	return nil
}

// RemoveSubsystem stops serving a subsystem and disconnects its controllers.
func (t *Target) RemoveSubsystem(nqn string) error {
	t.mu.Lock()
	s, ok := t.subsys[nqn]
	if !ok {
		t.mu.Unlock()
		return fmt.Errorf("subsystem %s: %w", nqn, ErrNotFound)
	}
	delete(t.subsys, nqn)
	t.discoveryChangedLocked()
	t.mu.Unlock()
	for _, c := range s.controllers() {
		c.shutdown()
	}
	t.log.Info("subsystem removed", "subnqn", nqn)
	return nil
}

func (t *Target) lookup(nqn string) (*subsystem, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.subsys[nqn]
	if !ok {
		return nil, fmt.Errorf("subsystem %s is not served here: %w", nqn, ErrNotFound)
	}
	return s, nil
}

// AddNamespace adds a namespace to a subsystem and tells connected hosts.
func (t *Target) AddNamespace(subnqn string, nc NamespaceConfig) error {
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	if nc.NSID == 0 || nc.NSID > maxNamespaces {
		return fmt.Errorf("namespace ID %d outside 1..%d: %w", nc.NSID, maxNamespaces, ErrInvalid)
	}
	if nc.Device == nil {
		return fmt.Errorf("namespace %d has no device: %w", nc.NSID, ErrInvalid)
	}
	if nc.ANAGroup == 0 {
		nc.ANAGroup = 1
	}
	if nc.ANAGroup > maxANAGroups {
		return fmt.Errorf("namespace %d: ANA group %d outside 1..%d: %w", nc.NSID, nc.ANAGroup, maxANAGroups, ErrInvalid)
	}
	bs := nc.Device.BlockSize()
	if bs < 512 || bs&(bs-1) != 0 || nc.Device.Size() < int64(bs) {
		return fmt.Errorf("namespace %d: device block size %d / size %d unusable: %w", nc.NSID, bs, nc.Device.Size(), ErrInvalid)
	}
	hosts, err := newNSHosts(nc.Hosts)
	if err != nil {
		return fmt.Errorf("namespace %d of %s: %w", nc.NSID, subnqn, err)
	}
	ns := &namespace{sub: s, id: nc.NSID, dev: nc.Device, bs: bs, nguid: nc.NGUID, uuid: nc.UUID, eui64: nc.EUI64, group: nc.ANAGroup}
	ns.setHosts(hosts)
	ns.resv, err = loadReservation(ns, s.resvBackend)
	if err != nil {
		return fmt.Errorf("namespace %d of %s: reservation state: %w", nc.NSID, subnqn, err)
	}
	s.mu.Lock()
	if _, ok := s.ns[nc.NSID]; ok {
		s.mu.Unlock()
		return fmt.Errorf("namespace %d of %s: %w", nc.NSID, subnqn, ErrExists)
	}
	s.ns[nc.NSID] = ns
	if _, ok := s.ana[nc.ANAGroup]; !ok {
		s.ana[nc.ANAGroup] = &anaGroup{state: nvme.ANAOptimized, chgcnt: 1}
	}
	ctrls := s.ctrlsLocked()
	s.mu.Unlock()
	for _, c := range ctrls {
		c.nsChanged(nc.NSID)
	}
	t.log.Info("namespace added", "subnqn", subnqn, "nsid", nc.NSID, "size", nc.Device.Size(), "block_size", bs, "ana_group", nc.ANAGroup)
	return nil
}

// RemoveNamespace removes a namespace; it returns after every command
// already executing on it has finished, so the caller may then close the
// device.
func (t *Target) RemoveNamespace(subnqn string, nsid uint32) error {
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	ns, ok := s.ns[nsid]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("namespace %d of %s: %w", nsid, subnqn, ErrNotFound)
	}
	delete(s.ns, nsid)
	ctrls := s.ctrlsLocked()
	s.mu.Unlock()
	ns.removed.Store(true)
	// Taking the gate exclusively waits for every command in flight on the
	// namespace (each holds it shared) to finish.
	ns.resv.gate.Lock()
	//lint:ignore SA2001 the empty critical section is the drain
	ns.resv.gate.Unlock()
	for _, c := range ctrls {
		c.nsChanged(nsid)
	}
	t.log.Info("namespace removed", "subnqn", subnqn, "nsid", nsid)
	return nil
}

// ResizeNamespace tells the hosts that a namespace's device changed its
// size (grown by its owner; Identify Namespace reports the device's size
// at each call): each connected controller gets the namespace-attribute-
// changed notice with nsid in its Changed Namespace List log, upon which a
// host re-reads NSZE/NCAP. The new size must be a whole number of blocks.
func (t *Target) ResizeNamespace(subnqn string, nsid uint32) error {
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	s.mu.RLock()
	ns, ok := s.ns[nsid]
	ctrls := s.ctrlsLocked()
	s.mu.RUnlock()
	if !ok {
		return fmt.Errorf("namespace %d of %s: %w", nsid, subnqn, ErrNotFound)
	}
	size := ns.dev.Size()
	if size < int64(ns.bs) || size%int64(ns.bs) != 0 {
		return fmt.Errorf("namespace %d of %s: device size %d is not a positive multiple of its block size %d: %w", nsid, subnqn, size, ns.bs, ErrInvalid)
	}
	for _, c := range ctrls {
		c.nsChanged(nsid)
	}
	t.log.Info("namespace resized", "subnqn", subnqn, "nsid", nsid, "size", size)
	return nil
}

// SetANAState sets the state of an ANA group of a subsystem on this target
// and sends an ANA-change asynchronous event to every connected controller.
func (t *Target) SetANAState(subnqn string, group uint32, state nvme.ANAState) error {
	if group == 0 || group > maxANAGroups {
		return fmt.Errorf("ANA group %d outside 1..%d: %w", group, maxANAGroups, ErrInvalid)
	}
	if !state.Valid() {
		return fmt.Errorf("ANA state %v: %w", state, ErrInvalid)
	}
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	g, ok := s.ana[group]
	if !ok {
		g = &anaGroup{}
		s.ana[group] = g
	}
	if ok && g.state == state {
		s.mu.Unlock()
		return nil
	}
	old := g.state
	g.state = state
	s.anaChgCnt++
	g.chgcnt = s.anaChgCnt
	ctrls := s.ctrlsLocked()
	s.mu.Unlock()
	for _, c := range ctrls {
		c.postEvent(eventANA)
	}
	t.log.Info("ANA state changed", "subnqn", subnqn, "group", group, "from", old, "to", state, "controllers_notified", len(ctrls))
	return nil
}

// ANAState returns the state of an ANA group of a subsystem on this target.
func (t *Target) ANAState(subnqn string, group uint32) (nvme.ANAState, error) {
	s, err := t.lookup(subnqn)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.ana[group]
	if !ok {
		return 0, fmt.Errorf("ANA group %d of %s: %w", group, subnqn, ErrNotFound)
	}
	return g.state, nil
}

// AllowHost adds a host NQN to a subsystem's allow-list.
func (t *Target) AllowHost(subnqn, hostnqn string) error {
	if err := validNQN(hostnqn); err != nil {
		return err
	}
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.hosts[hostnqn] = true
	s.mu.Unlock()
	t.mu.Lock()
	t.discoveryChangedLocked()
	t.mu.Unlock()
	return nil
}

// DisallowHost removes a host NQN from a subsystem's allow-list and
// disconnects that host's controllers of the subsystem.
func (t *Target) DisallowHost(subnqn, hostnqn string) error {
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.hosts, hostnqn)
	var drop []*controller
	for _, c := range s.ctrls {
		if c.hostNQN == hostnqn && !s.anyHost {
			drop = append(drop, c)
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		c.shutdown()
	}
	t.mu.Lock()
	t.discoveryChangedLocked()
	t.mu.Unlock()
	return nil
}

// SetAllowAnyHost switches a subsystem between open access and its
// allow-list.
func (t *Target) SetAllowAnyHost(subnqn string, any bool) error {
	s, err := t.lookup(subnqn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.anyHost = any
	var drop []*controller
	if !any {
		for _, c := range s.ctrls {
			if !s.hosts[c.hostNQN] {
				drop = append(drop, c)
			}
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		c.shutdown()
	}
	t.mu.Lock()
	t.discoveryChangedLocked()
	t.mu.Unlock()
	return nil
}

// ControllerInfo describes a connected controller.
type ControllerInfo struct {
	CntlID   uint16
	SubNQN   string
	HostNQN  string
	HostID   [16]byte
	IOQueues int
	KATO     time.Duration
}

// Controllers lists the connected controllers, by controller ID.
func (t *Target) Controllers() []ControllerInfo {
	t.mu.Lock()
	cs := make([]*controller, 0, len(t.ctrls))
	for _, c := range t.ctrls {
		cs = append(cs, c)
	}
	t.mu.Unlock()
	out := make([]ControllerInfo, 0, len(cs))
	for _, c := range cs {
		c.mu.Lock()
		out = append(out, ControllerInfo{CntlID: c.id, SubNQN: c.sub.nqn, HostNQN: c.hostNQN, HostID: c.hostID,
			IOQueues: len(c.ioq), KATO: time.Duration(c.kato.Load()) * time.Millisecond})
		c.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b ControllerInfo) int { return int(a.CntlID) - int(b.CntlID) })
	return out
}

func (s *subsystem) allowed(hostnqn string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.disc || s.anyHost || s.hosts[hostnqn]
}

func (s *subsystem) namespace(nsid uint32) *namespace {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ns[nsid]
}

func (s *subsystem) nsids() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uint32, 0, len(s.ns))
	for id := range s.ns {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (s *subsystem) anaStateOf(group uint32) nvme.ANAState {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if g, ok := s.ana[group]; ok {
		return g.state
	}
	return nvme.ANAOptimized
}

func (s *subsystem) controllers() []*controller {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctrlsLocked()
}

func (s *subsystem) ctrlsLocked() []*controller {
	out := make([]*controller, 0, len(s.ctrls))
	for _, c := range s.ctrls {
		out = append(out, c)
	}
	return out
}

// anaLog builds the ANA log page of s.
func (s *subsystem) anaLog() nvme.ANALog {
	s.mu.Lock()
	defer s.mu.Unlock()
	groups := make([]uint32, 0, len(s.ana))
	for g := range s.ana {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	l := nvme.ANALog{ChangeCount: s.anaChgCnt}
	for _, g := range groups {
		d := nvme.ANAGroupDesc{GroupID: g, ChangeCount: s.ana[g].chgcnt, State: s.ana[g].state}
		for id, ns := range s.ns {
			if ns.group == g {
				d.NSIDs = append(d.NSIDs, id)
			}
		}
		slices.Sort(d.NSIDs)
		l.Groups = append(l.Groups, d)
	}
	return l
}

// discoveryChangedLocked bumps the discovery generation and notifies
// discovery controllers. t.mu must be held.
func (t *Target) discoveryChangedLocked() {
	t.discGen++
	for _, c := range t.ctrls {
		if c.sub.disc {
			go c.postEvent(eventDiscovery)
		}
	}
}
