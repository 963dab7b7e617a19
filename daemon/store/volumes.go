package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/clock"
)

// Volumes keeps the desired volumes of the pools (arrays): one key per
// pool holding every volume carved from it, changed only by
// compare-and-swap on that key's revision (the pool revision), so that two
// administrators can never allocate the same extents or namespace ID; and
// one key per volume name, created only if absent, so that a name is unique
// across pools (docs/VOLUMES.md):
//
//	volumes/<pool>        Pool JSON
//	volume-names/<name>   the pool's name
//
// A pool without a record serves its implicit volume: NSID 1 spanning the
// whole array, as a site file without volumes always did.
type Volumes struct{ table }

// NewVolumes works on cli's keys under prefix (e.g. "/tier0/<cluster>/");
// clk stamps Created (nil: the wall clock).
func NewVolumes(cli *clientv3.Client, prefix string, clk clock.Clock) *Volumes {
	return &Volumes{newTable(cli, prefix, clk)}
}

// Volumes returns the store's volume table, on the store's clock
// (Options.Clock).
func (s *Store) Volumes() *Volumes { return NewVolumes(s.cli, s.prefix, s.clk) }

// Extent is a range of array bytes.
type Extent struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// VolumeState is where a volume is in its life.
type VolumeState string

const (
	// VolumeCreating: its extents are allocated and the pool's owner is
	// zeroing them; no node exposes the namespace yet.
	VolumeCreating VolumeState = "creating"
	// VolumeReady: every node exposes the namespace at Size.
	VolumeReady VolumeState = "ready"
	// VolumeGrowing: exposed at Size; Pending extents are being zeroed and
	// are appended (and Size grown) once they are.
	VolumeGrowing VolumeState = "growing"
	// VolumeDeleting: every node removes the namespace and says so in
	// RemovedOn; the extents stay allocated until all have.
	VolumeDeleting VolumeState = "deleting"
)

// Volume is one namespace carved from a pool (thick: every byte allocated
// at creation).
type Volume struct {
	Name string `json:"name"`
	Pool string `json:"pool"`
	NSID uint32 `json:"nsid"`
	// Size is the exposed size in bytes: the sum of Extents.
	Size int64 `json:"size"`
	// Extents map the volume's bytes, in order, to array bytes.
	Extents []Extent `json:"extents"`
	// Pending extents are allocated, being zeroed, and appended to
	// Extents once zeroed (creation and growth).
	Pending []Extent `json:"pending,omitempty"`
	// NGUID and UUID (32 hex digits each) identify the namespace to hosts;
	// persisted, the same on every node.
	NGUID string `json:"nguid"`
	UUID  string `json:"uuid"`
	// Hosts, when non-empty, are the only host NQNs that may use the
	// namespace.
	Hosts []string    `json:"hosts,omitempty"`
	State VolumeState `json:"state"`
	// Implicit marks the array-spanning volume of a pool that had no
	// volume records (only ever seen deleting).
	Implicit bool `json:"implicit,omitempty"`
	// RemovedOn are the nodes that have removed a deleting volume's
	// namespace.
	RemovedOn []string  `json:"removed_on,omitempty"`
	Created   time.Time `json:"created"`
}

// Exposed reports whether nodes serve the volume's namespace.
func (v *Volume) Exposed() bool { return v.State == VolumeReady || v.State == VolumeGrowing }

// Pool is one array's volume table.
type Pool struct {
	Name      string `json:"name"`
	Capacity  int64  `json:"capacity"`
	BlockSize int    `json:"block_size"`
	// SubNQN is the pool's frontend subsystem: a dropped volume's
	// reservation state (Reservations' keys) goes with it, so that a
	// volume given its NSID later starts with none.
	SubNQN  string   `json:"subnqn"`
	Volumes []Volume `json:"volumes"`
	// Revision is the key's ModRevision (0: no record, the implicit
	// volume); not stored.
	Revision int64 `json:"-"`
}

// Volume returns the named volume of the pool (nil if absent).
func (p *Pool) Volume(name string) *Volume {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

// Free is the pool's unallocated ranges, in address order.
func (p *Pool) Free() []Extent {
	var used []Extent
	for _, v := range p.Volumes {
		used = append(used, v.Extents...)
		used = append(used, v.Pending...)
	}
	sort.Slice(used, func(i, j int) bool { return used[i].Off < used[j].Off })
	var free []Extent
	at := int64(0)
	for _, e := range used {
		if e.Off > at {
			free = append(free, Extent{Off: at, Len: e.Off - at})
		}
		at = max(at, e.Off+e.Len)
	}
	if at < p.Capacity {
		free = append(free, Extent{Off: at, Len: p.Capacity - at})
	}
	return free
}

// allocate takes size bytes first-fit from the free ranges.
func (p *Pool) allocate(size int64) ([]Extent, error) {
	var out []Extent
	left := size
	for _, f := range p.Free() {
		if left == 0 {
			break
		}
		n := min(f.Len, left)
		out = append(out, Extent{Off: f.Off, Len: n})
		left -= n
	}
	if left > 0 {
		return nil, fmt.Errorf("pool %s has %d bytes free, %d more wanted: %w", p.Name, size-left, size, ErrNoSpace)
	}
	return out, nil
}

func (p *Pool) freeNSID() uint32 {
	for id := uint32(1); ; id++ {
		if !slices.ContainsFunc(p.Volumes, func(v Volume) bool { return v.NSID == id }) {
			return id
		}
	}
}

// Volume errors; test with errors.Is.
var (
	// ErrNoSpace: the pool has fewer free bytes than asked for.
	ErrNoSpace = errors.New("store: pool has no space")
	// ErrVolumeExists: a volume of that name exists (in any pool).
	ErrVolumeExists = errors.New("store: volume exists")
	// ErrImplicit: the pool still serves its implicit whole-array volume.
	ErrImplicit = errors.New("store: pool serves its implicit whole-array volume")
)

// maxVolumesPerPool bounds the namespace IDs of a pool (the target's limit).
const maxVolumesPerPool = 1024

func (vs *Volumes) poolKey(pool string) string { return vs.prefix + "volumes/" + pool }
func (vs *Volumes) nameKey(name string) string { return vs.prefix + "volume-names/" + name }

func validVolumeName(kind, name string) error {
	if name == "" || len(name) > 64 || strings.ContainsAny(name, "/\x00 \t\n") {
		return fmt.Errorf("%s name %q: want 1..64 characters without '/' or spaces: %w", kind, name, ErrBadOptions)
	}
	return nil
}

// Pool reads a pool's table (Revision 0 and no volumes: no record, the
// implicit volume is served).
func (vs *Volumes) Pool(ctx context.Context, pool string) (Pool, error) {
	if err := validVolumeName("pool", pool); err != nil {
		return Pool{}, err
	}
	resp, err := vs.kv.Get(ctx, vs.poolKey(pool))
	if err != nil {
		return Pool{}, fmt.Errorf("read volumes of pool %s: %w", pool, err)
	}
	if len(resp.Kvs) == 0 {
		return Pool{Name: pool}, nil
	}
	return decodePool(pool, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
}

func decodePool(pool string, b []byte, rev int64) (Pool, error) {
	var p Pool
	if err := json.Unmarshal(b, &p); err != nil {
		return Pool{}, fmt.Errorf("volumes of pool %s unreadable: %w", pool, err)
	}
	p.Name, p.Revision = pool, rev
	return p, nil
}

// Pools reads every pool with a record, by name, and the revision read at.
func (vs *Volumes) Pools(ctx context.Context) (map[string]Pool, int64, error) {
	resp, err := vs.kv.Get(ctx, vs.prefix+"volumes/", clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("read volumes: %w", err)
	}
	out := map[string]Pool{}
	for _, kv := range resp.Kvs {
		name := strings.TrimPrefix(string(kv.Key), vs.prefix+"volumes/")
		p, err := decodePool(name, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, 0, err
		}
		out[name] = p
	}
	return out, resp.Header.Revision, nil
}

// Find returns the pool holding the named volume.
func (vs *Volumes) Find(ctx context.Context, name string) (Pool, *Volume, error) {
	if err := validVolumeName("volume", name); err != nil {
		return Pool{}, nil, err
	}
	resp, err := vs.kv.Get(ctx, vs.nameKey(name))
	if err != nil {
		return Pool{}, nil, fmt.Errorf("look up volume %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return Pool{}, nil, fmt.Errorf("volume %s: %w", name, ErrNotFound)
	}
	p, err := vs.Pool(ctx, string(resp.Kvs[0].Value))
	if err != nil {
		return Pool{}, nil, err
	}
	v := p.Volume(name)
	if v == nil {
		return Pool{}, nil, fmt.Errorf("volume %s: named in pool %s, which does not hold it: %w", name, p.Name, ErrNotFound)
	}
	return p, v, nil
}

// change is one edit of a pool's table: names to create (their name keys
// must be absent) and to delete.
type change struct {
	create, drop []string
	dropNSID     uint32 // a dropped volume's NSID: its reservation keys go
}

// update applies f to the pool's current table and stores the result by
// compare-and-swap on the pool revision, re-reading and re-applying f when
// another writer came first. f validates against what it is given, so a
// decision is never made on a stale table.
func (vs *Volumes) update(ctx context.Context, pool string, f func(p *Pool) (change, error)) (Pool, error) {
	for {
		p, err := vs.Pool(ctx, pool)
		if err != nil {
			return Pool{}, err
		}
		ch, err := f(&p)
		if err != nil {
			return Pool{}, err
		}
		b, err := json.Marshal(p)
		if err != nil {
			return Pool{}, err
		}
		pk := vs.poolKey(pool)
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(pk), "=", p.Revision)}
		ops := []clientv3.Op{clientv3.OpPut(pk, string(b))}
		for _, n := range ch.create {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(vs.nameKey(n)), "=", 0))
			ops = append(ops, clientv3.OpPut(vs.nameKey(n), pool))
		}
		for _, n := range ch.drop {
			ops = append(ops, clientv3.OpDelete(vs.nameKey(n)))
		}
		if ch.dropNSID != 0 && p.SubNQN != "" {
			r := &Reservations{vs.table}
			ops = append(ops, clientv3.OpDelete(r.key("resv", p.SubNQN, ch.dropNSID)), clientv3.OpDelete(r.key("resv-applied", p.SubNQN, ch.dropNSID)))
		}
		resp, err := vs.kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return Pool{}, fmt.Errorf("store volumes of pool %s: %w", pool, err)
		}
		if resp.Succeeded {
			p.Revision = resp.Header.Revision
			return p, nil
		}
		for _, n := range ch.create {
			r, err := vs.kv.Get(ctx, vs.nameKey(n))
			if err != nil {
				return Pool{}, fmt.Errorf("look up volume %s: %w", n, err)
			}
			if len(r.Kvs) > 0 {
				return Pool{}, fmt.Errorf("volume %s already exists in pool %s; choose another name or delete it first: %w", n, r.Kvs[0].Value, ErrVolumeExists)
			}
		}
		// the pool changed under us: decide again on what it holds now
	}
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ReleaseImplicit turns a pool without a record into one whose implicit
// whole-array volume (named after the pool, NSID 1) is deleting: every node
// removes NSID 1, and once all have, the pool's bytes are free for carved
// volumes. capacity and bs are the array's (the same on every node).
func (vs *Volumes) ReleaseImplicit(ctx context.Context, pool, subnqn string, capacity int64, bs int) (Pool, error) {
	if capacity <= 0 || bs < 512 || capacity%int64(bs) != 0 {
		return Pool{}, fmt.Errorf("pool %s: capacity %d / block size %d unusable: %w", pool, capacity, bs, ErrBadOptions)
	}
	if err := validResvName(subnqn, 1); err != nil {
		return Pool{}, err
	}
	return vs.update(ctx, pool, func(p *Pool) (change, error) {
		if p.Revision != 0 {
			return change{}, fmt.Errorf("pool %s has no implicit volume any more (it holds %d carved volumes): %w", pool, len(p.Volumes), ErrConflict)
		}
		p.Capacity, p.BlockSize, p.SubNQN = capacity, bs, subnqn
		p.Volumes = []Volume{{
			Name: pool, Pool: pool, NSID: 1, Size: capacity, Extents: []Extent{{Off: 0, Len: capacity}},
			State: VolumeDeleting, Implicit: true, Created: vs.clk.Now().UTC(),
		}}
		return change{}, nil
	})
}

// Create allocates a thick volume of size bytes (a multiple of the pool's
// block size) first-fit from the pool, with the lowest free namespace ID
// and a new NGUID and UUID; hosts, when not empty, are the only host NQNs
// that may use it (SetHosts). It starts VolumeCreating: the pool's owner
// zeroes it (Zeroed) before any node exposes it.
func (vs *Volumes) Create(ctx context.Context, pool, name string, size int64, hosts []string) (Volume, error) {
	if err := validVolumeName("volume", name); err != nil {
		return Volume{}, err
	}
	hosts, err := cleanHosts(name, hosts)
	if err != nil {
		return Volume{}, err
	}
	var out Volume
	_, err = vs.update(ctx, pool, func(p *Pool) (change, error) {
		if p.Revision == 0 {
			return change{}, fmt.Errorf("pool %s still serves its implicit whole-array volume (NSID 1); release it first with `tier0 volume delete %s --force` (its data is lost): %w", pool, pool, ErrImplicit)
		}
		if size <= 0 || size%int64(p.BlockSize) != 0 {
			return change{}, fmt.Errorf("volume %s: size %d must be a positive multiple of pool %s's block size %d: %w", name, size, pool, p.BlockSize, ErrBadOptions)
		}
		if p.Volume(name) != nil {
			return change{}, fmt.Errorf("volume %s already exists in pool %s: %w", name, pool, ErrVolumeExists)
		}
		if i := slices.IndexFunc(p.Volumes, func(v Volume) bool { return v.Implicit }); i >= 0 {
			return change{}, fmt.Errorf("pool %s: its implicit whole-array volume is still being removed (done on nodes %v); create volumes once every node has: %w", pool, p.Volumes[i].RemovedOn, ErrImplicit)
		}
		if len(p.Volumes) >= maxVolumesPerPool {
			return change{}, fmt.Errorf("pool %s holds %d volumes, the most a subsystem serves: %w", pool, len(p.Volumes), ErrNoSpace)
		}
		ext, err := p.allocate(size)
		if err != nil {
			return change{}, fmt.Errorf("volume %s: %w", name, err)
		}
		out = Volume{
			Name: name, Pool: pool, NSID: p.freeNSID(), Pending: ext,
			NGUID: randomID(), UUID: randomID(), Hosts: hosts,
			State: VolumeCreating, Created: vs.clk.Now().UTC(),
		}
		p.Volumes = append(p.Volumes, out)
		return change{create: []string{name}}, nil
	})
	return out, err
}

// Resize grows a volume to size bytes by appending extents (being zeroed
// until Zeroed). Shrinking is refused: it would cut off data hosts wrote.
func (vs *Volumes) Resize(ctx context.Context, name string, size int64) (Volume, error) {
	p0, _, err := vs.Find(ctx, name)
	if err != nil {
		return Volume{}, err
	}
	var out Volume
	_, err = vs.update(ctx, p0.Name, func(p *Pool) (change, error) {
		v := p.Volume(name)
		if v == nil {
			return change{}, fmt.Errorf("volume %s: %w", name, ErrNotFound)
		}
		if v.State != VolumeReady {
			return change{}, fmt.Errorf("volume %s is %s; resize it once it is ready (tier0 volume show %s): %w", name, v.State, name, ErrConflict)
		}
		if size%int64(p.BlockSize) != 0 || size < v.Size {
			return change{}, fmt.Errorf("volume %s: new size %d must be a multiple of block size %d and at least its size %d (volumes only grow): %w", name, size, p.BlockSize, v.Size, ErrBadOptions)
		}
		if size == v.Size {
			out = *v
			return change{}, nil
		}
		ext, err := p.allocate(size - v.Size)
		if err != nil {
			return change{}, fmt.Errorf("growing volume %s: %w", name, err)
		}
		v.Pending, v.State = ext, VolumeGrowing
		out = *v
		return change{}, nil
	})
	return out, err
}

// Zeroed records that the pool's owner zeroed a volume's pending extents
// (the ones it was given, so that a later growth is not taken for done):
// they join Extents and Size grows. A creating volume becomes ready.
func (vs *Volumes) Zeroed(ctx context.Context, pool, name string, pending []Extent) (Volume, error) {
	var out Volume
	_, err := vs.update(ctx, pool, func(p *Pool) (change, error) {
		v := p.Volume(name)
		if v == nil {
			return change{}, fmt.Errorf("volume %s: %w", name, ErrNotFound)
		}
		if (v.State != VolumeCreating && v.State != VolumeGrowing) || !slices.Equal(v.Pending, pending) {
			return change{}, fmt.Errorf("volume %s is %s with pending extents %v, not the %v zeroed: %w", name, v.State, v.Pending, pending, ErrConflict)
		}
		v.Extents = append(v.Extents, v.Pending...)
		v.Pending = nil
		v.Size = 0
		for _, e := range v.Extents {
			v.Size += e.Len
		}
		v.State = VolumeReady
		out = *v
		return change{}, nil
	})
	return out, err
}

// Delete marks a volume deleting: the nodes remove its namespace
// (Removed), and its extents are reusable once every node has.
func (vs *Volumes) Delete(ctx context.Context, name string) (Volume, error) {
	p0, _, err := vs.Find(ctx, name)
	if err != nil {
		return Volume{}, err
	}
	var out Volume
	_, err = vs.update(ctx, p0.Name, func(p *Pool) (change, error) {
		v := p.Volume(name)
		if v == nil {
			return change{}, fmt.Errorf("volume %s: %w", name, ErrNotFound)
		}
		v.State, v.RemovedOn = VolumeDeleting, nil
		out = *v
		return change{}, nil
	})
	return out, err
}

// Removed records that node no longer serves a deleting volume's
// namespace; when every one of nodes has, the volume is dropped and its
// extents and namespace ID are free. It reports whether it was dropped.
func (vs *Volumes) Removed(ctx context.Context, pool, name, node string, nodes []string) (bool, error) {
	dropped := false
	_, err := vs.update(ctx, pool, func(p *Pool) (change, error) {
		dropped = false
		i := slices.IndexFunc(p.Volumes, func(v Volume) bool { return v.Name == name })
		if i < 0 {
			return change{}, fmt.Errorf("volume %s: %w", name, ErrNotFound)
		}
		v := &p.Volumes[i]
		if v.State != VolumeDeleting {
			return change{}, fmt.Errorf("volume %s is %s, not deleting: %w", name, v.State, ErrConflict)
		}
		if !slices.Contains(v.RemovedOn, node) {
			v.RemovedOn = append(v.RemovedOn, node)
			slices.Sort(v.RemovedOn)
		}
		for _, n := range nodes {
			if !slices.Contains(v.RemovedOn, n) {
				return change{}, nil
			}
		}
		implicit, nsid := v.Implicit, v.NSID
		p.Volumes = slices.Delete(p.Volumes, i, i+1)
		dropped = true
		if implicit {
			return change{dropNSID: nsid}, nil
		}
		return change{drop: []string{name}, dropNSID: nsid}, nil
	})
	return dropped, err
}

// Watch reports the revision of every change of any pool's table from
// revision rev (0: now); the receiver re-reads Pools. The channel closes
// when ctx ends or the watch breaks.
func (vs *Volumes) Watch(ctx context.Context, rev int64) <-chan int64 {
	o := WatchOptions{Rev: rev, Buffer: 1, LastOnly: true}
	return WatchPrefix(ctx, vs.w, vs.prefix+"volumes/", o, func(ev *clientv3.Event) (int64, bool) {
		return ev.Kv.ModRevision, true
	})
}
