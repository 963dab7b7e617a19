package store

import (
	"context"
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

// ErrExists: a record of that name is there already.
var ErrExists = errors.New("store: already exists")

// DesiredArrays keeps the arrays created online (tier0 array create): one
// key per array, created only if absent and changed only by
// compare-and-swap on its revision (docs/CONTROL-PLANE.md):
//
//	desired/arrays/<name>   DesiredArray JSON
//
// The site file's arrays are not here: they stay the bootstrap, read from
// the file by every node.
type DesiredArrays struct{ table }

// NewDesiredArrays works on cli's keys under prefix (e.g.
// "/tier0/<cluster>/"); clk stamps Created (nil: the wall clock).
func NewDesiredArrays(cli *clientv3.Client, prefix string, clk clock.Clock) *DesiredArrays {
	return &DesiredArrays{newTable(cli, prefix, clk)}
}

// DesiredArrays returns the store's online-array table, on the store's
// clock (Options.Clock).
func (s *Store) DesiredArrays() *DesiredArrays { return NewDesiredArrays(s.cli, s.prefix, s.clk) }

// ArrayPhase is where an online array is in its life.
type ArrayPhase string

const (
	// ArrayActive: every node serves the array; the cluster machine owns
	// it like a site-file array.
	ArrayActive ArrayPhase = "active"
	// ArrayDeleting: every node stops serving it and says so in Stopped;
	// then the nodes of its member drives wipe their superblocks and say
	// so in Wiped; then the record is removed. A node that was down
	// meanwhile does its part when it returns: the record stays until
	// every node holding a member drive has wiped it.
	ArrayDeleting ArrayPhase = "deleting"
)

// DesiredArray is one array created online.
type DesiredArray struct {
	Name     string     `json:"name"`
	Level    string     `json:"level"` // raid5, raid6
	ChunkKiB int        `json:"chunk_kib"`
	Home     string     `json:"home"`
	Members  []string   `json:"members"` // drive names in RAID order
	Phase    ArrayPhase `json:"phase"`
	// Force: the delete removes the pool's volumes (hosts connected or
	// not).
	Force   bool      `json:"force,omitempty"`
	Stopped []string  `json:"stopped,omitempty"` // nodes that stopped serving it (deleting)
	Wiped   []string  `json:"wiped,omitempty"`   // nodes that wiped their member drives (deleting)
	Created time.Time `json:"created"`
	// Revision is the key's ModRevision; not stored.
	Revision int64 `json:"-"`
}

func (da *DesiredArrays) key(name string) string { return da.prefix + "desired/arrays/" + name }

// Create stores a new array; it fails with ErrExists when the name is
// taken.
func (da *DesiredArrays) Create(ctx context.Context, a DesiredArray) (DesiredArray, error) {
	if err := validVolumeName("array", a.Name); err != nil {
		return a, err
	}
	a.Phase = ArrayActive
	if a.Created.IsZero() {
		a.Created = da.clk.Now().UTC()
	}
	b, err := json.Marshal(a)
	if err != nil {
		return a, err
	}
	k := da.key(a.Name)
	resp, err := da.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, string(b))).Commit()
	if err != nil {
		return a, fmt.Errorf("write array %s: %w", a.Name, err)
	}
	if !resp.Succeeded {
		return a, fmt.Errorf("array %q was created online already: %w; pick another name or `tier0 array delete %s` first", a.Name, ErrExists, a.Name)
	}
	a.Revision = resp.Header.Revision
	return a, nil
}

// List reads every online array, sorted by name, and the revision read at.
func (da *DesiredArrays) List(ctx context.Context) ([]DesiredArray, int64, error) {
	p := da.prefix + "desired/arrays/"
	resp, err := da.kv.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("read online arrays: %w", err)
	}
	var out []DesiredArray
	for _, kv := range resp.Kvs {
		var a DesiredArray
		if err := json.Unmarshal(kv.Value, &a); err != nil {
			return nil, 0, fmt.Errorf("online array %s unreadable: %w", strings.TrimPrefix(string(kv.Key), p), err)
		}
		a.Revision = kv.ModRevision
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, resp.Header.Revision, nil
}

// Get reads one online array (ErrNotFound when absent).
func (da *DesiredArrays) Get(ctx context.Context, name string) (DesiredArray, error) {
	resp, err := da.kv.Get(ctx, da.key(name))
	if err != nil {
		return DesiredArray{}, fmt.Errorf("read array %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return DesiredArray{}, fmt.Errorf("online array %q: %w", name, ErrNotFound)
	}
	var a DesiredArray
	if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
		return a, fmt.Errorf("online array %s unreadable: %w", name, err)
	}
	a.Revision = resp.Kvs[0].ModRevision
	return a, nil
}

// Update changes an online array by compare-and-swap, retrying f on a
// conflict; f returns false to leave it unchanged.
func (da *DesiredArrays) Update(ctx context.Context, name string, f func(a *DesiredArray) (bool, error)) (DesiredArray, error) {
	for try := 0; try < 32; try++ {
		a, err := da.Get(ctx, name)
		if err != nil {
			return a, err
		}
		change, err := f(&a)
		if err != nil || !change {
			return a, err
		}
		b, err := json.Marshal(a)
		if err != nil {
			return a, err
		}
		k := da.key(name)
		resp, err := da.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", a.Revision)).Then(clientv3.OpPut(k, string(b))).Commit()
		if err != nil {
			return a, fmt.Errorf("write array %s: %w", name, err)
		}
		if resp.Succeeded {
			a.Revision = resp.Header.Revision
			return a, nil
		}
	}
	return DesiredArray{}, fmt.Errorf("array %s: changed by others 32 times in a row: %w; try again", name, ErrConflict)
}

// MarkDone adds node to the Stopped (wiped false) or Wiped list of a
// deleting array; it is a no-op when already there or the array is gone.
func (da *DesiredArrays) MarkDone(ctx context.Context, name, node string, wiped bool) error {
	_, err := da.Update(ctx, name, func(a *DesiredArray) (bool, error) {
		l := &a.Stopped
		if wiped {
			l = &a.Wiped
		}
		if a.Phase != ArrayDeleting || slices.Contains(*l, node) {
			return false, nil
		}
		*l = append(*l, node)
		return true, nil
	})
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// Remove deletes the record of an online array.
func (da *DesiredArrays) Remove(ctx context.Context, name string) error {
	if _, err := da.kv.Delete(ctx, da.key(name)); err != nil {
		return fmt.Errorf("delete array %s: %w", name, err)
	}
	return nil
}

// Watch reports the revision of every change of the table from revision
// rev (0: now); the receiver re-reads List. The channel closes when ctx
// ends or the watch breaks.
func (da *DesiredArrays) Watch(ctx context.Context, rev int64) <-chan int64 {
	o := WatchOptions{Rev: rev, Buffer: 1, LastOnly: true}
	return WatchPrefix(ctx, da.w, da.prefix+"desired/arrays/", o, func(ev *clientv3.Event) (int64, bool) {
		return ev.Kv.ModRevision, true
	})
}

// Drop removes a deleted online array's record together with its pool's
// volume table, its volumes' names and the hosts' reservations of its
// subsystem subnqn, in one transaction: a later array of the same name
// starts with none of them.
func (da *DesiredArrays) Drop(ctx context.Context, name, subnqn string) error {
	return da.drop(ctx, name, subnqn, true)
}

// DropPool removes what Drop does except the array's record: a deleting
// array's volumes and reservations go once no live node serves it, while
// the record stays until the nodes that were away wipe their member
// drives.
func (da *DesiredArrays) DropPool(ctx context.Context, name, subnqn string) error {
	return da.drop(ctx, name, subnqn, false)
}

func (da *DesiredArrays) drop(ctx context.Context, name, subnqn string, record bool) error {
	var ops []clientv3.Op
	if record {
		ops = append(ops, clientv3.OpDelete(da.key(name)))
	}
	vs := &Volumes{da.table}
	p, err := vs.Pool(ctx, name)
	if err != nil {
		return err
	}
	if p.Revision != 0 {
		ops = append(ops, clientv3.OpDelete(vs.poolKey(name)))
		for _, v := range p.Volumes {
			ops = append(ops, clientv3.OpDelete(vs.nameKey(v.Name)))
		}
	}
	if subnqn != "" && !strings.ContainsAny(subnqn, "/\x00") {
		ops = append(ops, clientv3.OpDelete(da.prefix+"resv/"+subnqn+"/", clientv3.WithPrefix()),
			clientv3.OpDelete(da.prefix+"resv-applied/"+subnqn+"/", clientv3.WithPrefix()))
	}
	if _, err := da.kv.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("drop array %s: %w", name, err)
	}
	return nil
}

// InitPool gives a new pool an empty volume table (capacity bytes in
// blocks of bs), so that it never serves the implicit whole-array volume:
// `tier0 array create --no-volume`. It fails with ErrExists when the pool
// has a table already.
func (da *DesiredArrays) InitPool(ctx context.Context, pool, subnqn string, capacity int64, bs int) error {
	vs := &Volumes{da.table}
	b, err := json.Marshal(Pool{Name: pool, Capacity: capacity, BlockSize: bs, SubNQN: subnqn, Volumes: []Volume{}})
	if err != nil {
		return err
	}
	k := vs.poolKey(pool)
	resp, err := da.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, string(b))).Commit()
	if err != nil {
		return fmt.Errorf("write volumes of pool %s: %w", pool, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("pool %s has a volume table already (left from an array of that name?): %w; `tier0 volume list` names its volumes", pool, ErrExists)
	}
	return nil
}
