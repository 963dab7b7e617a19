package sim

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand"
	"sort"
	"sync"

	"tier0/daemon/blockdev"
	"tier0/daemon/config"
	"tier0/daemon/node"
	"tier0/daemon/nvme"
)

// Fabric is the in-memory backend fabric: every drive is a blockdev.Mem
// with the NVMe reservation state of its namespace (registrants by host
// ID, one holder, Write Exclusive), which every node's imported members
// share. A write of a host that does not hold the reservation fails with
// blockdev.ErrFenced, as a reservation conflict does on the target.
// Faults: a cut link (node to node, one way) makes the importer's
// commands fail as production's fail-fast member connection does when
// its path is gone (blockdev.ErrIO wrapped with blockdev.ErrNoPath, so
// the RAID engine takes the member as missing; a dial fails),
// a failed drive fails every command.
//
// The fabric also checks the reservation invariant that the data-safety
// rules rest on: a member's holder key (the owner's epoch) never goes
// back. Violations are recorded, not refused (EpochFencing, the target's
// own enforcement, is an option: off, the fabric behaves as a target
// without it).
type Fabric struct {
	cfg          *config.Config
	epochFencing bool

	mu         sync.Mutex
	thawed     *sync.Cond // signalled when a node's stall ends
	stalled    map[string]bool
	drives     map[string]*drive
	cut        map[[2]string]bool // [from, to]: commands from `from` to drives of `to` fail
	hosts      map[[16]byte]string
	violations []string
	now        func() string // the simulation's time, for violation messages
}

type drive struct {
	name, node string
	mem        *blockdev.Mem
	failed     bool
	regs       map[[16]byte]uint64
	held       bool
	holder     [16]byte
	gen        uint32
	maxKey     uint64 // the highest key that has held the reservation
	boot       uint64 // the drive node's power cycles + 1 (member incarnation)
}

func newFabric(cfg *config.Config, size int64, epochFencing bool, now func() string) *Fabric {
	f := &Fabric{cfg: cfg, epochFencing: epochFencing, drives: map[string]*drive{}, cut: map[[2]string]bool{}, hosts: map[[16]byte]string{}, stalled: map[string]bool{}, now: now}
	f.thawed = sync.NewCond(&f.mu)
	for _, n := range cfg.Nodes {
		f.hosts[node.HostID(cfg, n.Name)] = n.Name
		for _, d := range n.Drives {
			f.drives[d.Name] = &drive{name: d.Name, node: n.Name, mem: blockdev.NewMem(size, 4096), regs: map[[16]byte]uint64{}, boot: 1}
		}
	}
	return f
}

// Cut cuts (or restores) the link from one node to another, one way.
func (f *Fabric) Cut(from, to string, cut bool) {
	f.mu.Lock()
	f.cut[[2]string{from, to}] = cut
	f.mu.Unlock()
}

// Stall stops (or resumes) the commands a node issues: a frozen process
// issues none, so its members' commands wait until it thaws instead of
// failing.
func (f *Fabric) Stall(name string, on bool) {
	f.mu.Lock()
	f.stalled[name] = on
	f.mu.Unlock()
	f.thawed.Broadcast()
}

// FailDrive fails (or restores) a drive.
func (f *Fabric) FailDrive(name string, failed bool) {
	f.mu.Lock()
	if d := f.drives[name]; d != nil {
		d.failed = failed
	}
	f.mu.Unlock()
}

// PowerCut drops what node's drives hold in their volatile caches: each
// block written since the last flush, not FUA, keeps its durable content
// or one of the versions written since, drawn from seed.
func (f *Fabric) PowerCut(name string, seed int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.drives))
	for dn, d := range f.drives {
		if d.node == name {
			names = append(names, dn)
		}
	}
	sort.Strings(names)
	r := mrand.New(mrand.NewSource(seed))
	for _, dn := range names {
		f.drives[dn].mem.CrashRandom(r)
		f.drives[dn].boot++ // its connections end with it
	}
}

// Violations are the reservation invariant's breaks so far.
func (f *Fabric) Violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.violations...)
}

// For is node's view of the fabric (node.Fabric).
func (f *Fabric) For(name string) node.Fabric {
	return importer{f: f, node: name, host: node.HostID(f.cfg, name)}
}

type importer struct {
	f    *Fabric
	node string
	host [16]byte
}

func (im importer) Import(ctx context.Context, array, drive string) (node.MemberConn, node.Member, error) {
	f := im.f
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.drives[drive]
	if d == nil {
		return nil, nil, fmt.Errorf("drive %s is not in the site config", drive)
	}
	if f.cut[[2]string{im.node, d.node}] {
		return nil, nil, fmt.Errorf("import member %s from node %s: connection timed out (link cut in the simulation): %w", drive, d.node, blockdev.ErrNoPath)
	}
	m := &member{f: f, d: d, from: im.node, host: im.host, boot: d.boot}
	return m, m, nil
}

// Incarnation is the drive node's power cycle this connection was made
// to (raid.Incarnated): as a boot id the drive node would export.
func (m *member) Incarnation() uint64 { return m.boot }

// member is one node's imported namespace of a drive; it is also its own
// connection (MemberConn).
type member struct {
	f      *Fabric
	d      *drive
	from   string
	host   [16]byte
	boot   uint64 // the drive's boot when imported
	closed bool
}

var errConflict = errors.New("reservation conflict")

// check says whether a command can reach the drive now (f.mu held); a
// command of a stalled node waits for it to thaw first.
func (m *member) check(op string) error {
	for m.f.stalled[m.from] && !m.closed {
		m.f.thawed.Wait()
	}
	switch {
	case m.closed:
		return fmt.Errorf("%s on member %s: %w", op, m.d.name, blockdev.ErrClosed)
	case m.f.cut[[2]string{m.from, m.d.node}]:
		// As production's fail-fast member connection: a path error
		// (the member is unreachable, so missing, not failed).
		return fmt.Errorf("%s on member %s from node %s: connection lost (link cut in the simulation): %w: %w", op, m.d.name, m.from, blockdev.ErrIO, blockdev.ErrNoPath)
	case m.boot != m.d.boot:
		// A connection does not outlive its target's power cut.
		return fmt.Errorf("%s on member %s from node %s: connection lost (node %s restarted after a power cut): %w: %w", op, m.d.name, m.from, m.d.node, blockdev.ErrIO, blockdev.ErrNoPath)
	case m.d.failed:
		return fmt.Errorf("%s on member %s: drive failed: %w", op, m.d.name, blockdev.ErrIO)
	}
	return nil
}

func (m *member) writable(op string) error {
	if err := m.check(op); err != nil {
		return err
	}
	if m.d.held && m.d.holder != m.host {
		return fmt.Errorf("%s on member %s from node %s: reservation conflict (held by %s under key %d): %w", op, m.d.name, m.from, m.f.hosts[m.d.holder], m.d.regs[m.d.holder], blockdev.ErrFenced)
	}
	return nil
}

func (m *member) ReadAt(p []byte, off int64) (int, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.check("read"); err != nil {
		return 0, err
	}
	return m.d.mem.ReadAt(p, off)
}

func (m *member) WriteAt(p []byte, off int64) (int, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.writable("write"); err != nil {
		return 0, err
	}
	return m.d.mem.WriteAt(p, off)
}

// WriteAtFUA is durable at once: a power cut (Fabric.PowerCut) keeps it.
func (m *member) WriteAtFUA(p []byte, off int64) (int, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.writable("write"); err != nil {
		return 0, err
	}
	return m.d.mem.WriteAtFUA(p, off)
}

func (m *member) Flush() error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.check("flush"); err != nil {
		return err
	}
	return m.d.mem.Flush()
}

func (m *member) WriteZeroes(off, length int64) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.writable("write zeroes"); err != nil {
		return err
	}
	return m.d.mem.WriteZeroes(off, length)
}

func (m *member) Discard(off, length int64) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.writable("discard"); err != nil {
		return err
	}
	return m.d.mem.Discard(off, length)
}

func (m *member) Size() int64    { return m.d.mem.Size() }
func (m *member) BlockSize() int { return m.d.mem.BlockSize() }
func (m *member) NSID() uint32   { return 1 }

func (m *member) Close() error {
	m.f.mu.Lock()
	m.closed = true
	m.f.mu.Unlock()
	return nil
}

// setHolder makes h the holder (f.mu held) and checks the invariant.
func (m *member) setHolder(h [16]byte) {
	d := m.d
	key := d.regs[h]
	if key < d.maxKey {
		m.f.violations = append(m.f.violations, fmt.Sprintf("%s member %s: node %s took the reservation under key %d after key %d had held it (a newer owner's epoch overtaken by an older one)",
			m.f.now(), d.name, m.f.hosts[h], key, d.maxKey))
	}
	d.maxKey = max(d.maxKey, key)
	d.held, d.holder = true, h
	d.gen++
}

func (m *member) Register(action uint8, crkey, nrkey uint64, iekey bool) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.check("reservation register"); err != nil {
		return err
	}
	d := m.d
	cur, registered := d.regs[m.host]
	switch action {
	case nvme.ResvRegister:
		if registered && cur != nrkey {
			return fmt.Errorf("register key %d on %s: already registered under key %d: %w", nrkey, d.name, cur, errConflict)
		}
		d.regs[m.host] = nrkey
	case nvme.ResvReplace:
		if registered && !iekey && cur != crkey {
			return fmt.Errorf("replace key on %s: current key %d is not %d: %w", d.name, cur, crkey, errConflict)
		}
		if m.f.epochFencing && registered && d.held && d.holder == m.host && nrkey < cur {
			return fmt.Errorf("replace key %d by the lower %d on %s (epoch fencing): %w", cur, nrkey, d.name, errConflict)
		}
		d.regs[m.host] = nrkey
		if d.held && d.holder == m.host {
			m.setHolder(m.host)
		}
	case nvme.ResvUnregister:
		if !registered || (!iekey && cur != crkey) {
			return fmt.Errorf("unregister on %s: %w", d.name, errConflict)
		}
		delete(d.regs, m.host)
		if d.held && d.holder == m.host {
			d.held = false
		}
	default:
		return fmt.Errorf("register action %d: not served by the simulation", action)
	}
	d.gen++
	return nil
}

func (m *member) Acquire(action uint8, t nvme.ResvType, crkey, prkey uint64) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.check("reservation acquire"); err != nil {
		return err
	}
	d := m.d
	if k, ok := d.regs[m.host]; !ok || k != crkey {
		return fmt.Errorf("acquire on %s with key %d: not registered under it: %w", d.name, crkey, errConflict)
	}
	switch action {
	case nvme.ResvAcquire:
		if d.held && d.holder != m.host {
			return fmt.Errorf("acquire on %s: held by %s: %w", d.name, m.f.hosts[d.holder], errConflict)
		}
		m.setHolder(m.host)
	case nvme.ResvPreempt, nvme.ResvPreemptAndAbort:
		if m.f.epochFencing {
			for id, k := range d.regs {
				if id != m.host && k == prkey && k >= crkey {
					return fmt.Errorf("preempt of key %d with the older or equal key %d on %s (epoch fencing): %w", k, crkey, d.name, errConflict)
				}
			}
		}
		holderPreempted := d.held && d.regs[d.holder] == prkey && d.holder != m.host
		for id, k := range d.regs {
			if id != m.host && k == prkey {
				delete(d.regs, id) // their commands in flight are aborted: none are, in memory
			}
		}
		if holderPreempted || !d.held {
			m.setHolder(m.host)
		}
	default:
		return fmt.Errorf("acquire action %d: not served by the simulation", action)
	}
	d.gen++
	return nil
}

func (m *member) Report() (nvme.ResvStatus, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if err := m.check("reservation report"); err != nil {
		return nvme.ResvStatus{}, err
	}
	d := m.d
	st := nvme.ResvStatus{Gen: d.gen}
	if d.held {
		st.Type = nvme.ResvWriteExclusive
	}
	ids := make([][16]byte, 0, len(d.regs))
	for id := range d.regs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return string(ids[i][:]) < string(ids[j][:]) })
	for _, id := range ids {
		st.Registrants = append(st.Registrants, nvme.Registrant{CntlID: 1, Holder: d.held && d.holder == id, HostID: id, RKey: d.regs[id]})
	}
	return st, nil
}
