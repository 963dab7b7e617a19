package node

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/store"
)

// The node's api.Volumer (daemon/api/volumes.go).

// frontendHosts is what a node publishes about the hosts connected to its
// frontend (observed/frontend-hosts/<node>), so that any node can name
// who would lose a volume.
type frontendHosts struct {
	At    time.Time      `json:"at"`
	Conns []frontendConn `json:"conns"`
}

type frontendConn struct {
	SubNQN  string `json:"subnqn"`
	HostNQN string `json:"host_nqn"`
	HostID  string `json:"host_id"`
}

// hostsRefresh is how often a node republishes its connected hosts without
// a change; hostsStale is the age after which a node's list is not
// believed (it is down, so its hosts are not connected through it).
const (
	hostsRefresh = 10 * time.Second
	hostsStale   = 30 * time.Second
)

// hostsPublished is what publishHosts last wrote, and when.
type hostsPublished struct {
	conns []frontendConn
	at    time.Time
}

// publishHosts writes the frontend's connected hosts when they changed or
// hostsRefresh passed.
func (n *Node) publishHosts(ctx context.Context, last *hostsPublished) {
	if n.st == nil || n.frontend == nil {
		return
	}
	var conns []frontendConn
	for _, c := range n.frontend.Controllers() {
		conns = append(conns, frontendConn{SubNQN: c.SubNQN, HostNQN: c.HostNQN, HostID: hex.EncodeToString(c.HostID[:])})
	}
	sort.Slice(conns, func(i, j int) bool { return fmt.Sprint(conns[i]) < fmt.Sprint(conns[j]) })
	now := n.clk().Now()
	if slices.Equal(conns, last.conns) && now.Sub(last.at) < hostsRefresh {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := n.st.Put(pctx, store.Observed, "frontend-hosts", n.me.Name, frontendHosts{At: now.UTC(), Conns: conns}); err != nil {
		n.log.Warn("publishing the frontend's connected hosts failed", "err", err)
		return
	}
	last.conns, last.at = conns, now
}

// volumeHolders are the hosts connected to subnqn through any node (as
// published) that may see the volume (allowed, when hosts is not empty),
// and those registered for namespace nsid's reservations.
func (n *Node) volumeHolders(ctx context.Context, subnqn string, nsid uint32, allowed []string) ([]api.VolumeHolder, error) {
	var out []api.VolumeHolder
	nqnOf := map[string]string{}
	all, err := n.st.List(ctx, store.Observed, "frontend-hosts")
	if err != nil {
		return nil, fmt.Errorf("reading the frontends' connected hosts: %w", err)
	}
	now := n.clk().Now()
	for node, raw := range all {
		var fh frontendHosts
		if err := json.Unmarshal(raw, &fh); err != nil || now.Sub(fh.At) > hostsStale {
			continue
		}
		for _, c := range fh.Conns {
			nqnOf[c.HostID] = c.HostNQN
			if c.SubNQN == subnqn && (len(allowed) == 0 || slices.Contains(allowed, c.HostNQN)) {
				out = append(out, api.VolumeHolder{HostNQN: c.HostNQN, HostID: c.HostID, Node: node})
			}
		}
	}
	rec, err := store.NewReservations(n.st.Client(), n.key()).Get(ctx, subnqn, nsid)
	if err != nil {
		return nil, err
	}
	st, err := decodeResv(rec)
	if err != nil {
		return nil, err
	}
	for id := range st.Registrants {
		h := hex.EncodeToString(id[:])
		role := "registrant"
		if st.Held && st.Holder == id {
			role = "holder"
		}
		out = append(out, api.VolumeHolder{HostNQN: nqnOf[h], HostID: h, Reservation: role})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].HostID+out[i].Node+out[i].Reservation < out[j].HostID+out[j].Node+out[j].Reservation
	})
	return out, nil
}

func describeHolders(hs []api.VolumeHolder) string {
	var parts []string
	for _, h := range hs {
		parts = append(parts, h.String())
	}
	return strings.Join(parts, "; ")
}

// apiErr maps the store's volume errors onto the API's status sentinels.
func apiErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w (%w)", err, api.ErrNotFound)
	case errors.Is(err, store.ErrBadOptions):
		return fmt.Errorf("%w (%w)", err, api.ErrBadRequest)
	case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrVolumeExists), errors.Is(err, store.ErrImplicit), errors.Is(err, store.ErrNoSpace):
		return fmt.Errorf("%w (%w)", err, api.ErrConflict)
	}
	return fmt.Errorf("%w (%w)", err, api.ErrUnavailable)
}

func (n *Node) apiVolume(v *store.Volume) api.Volume {
	conv := func(es []store.Extent) []api.Extent {
		out := make([]api.Extent, 0, len(es))
		for _, e := range es {
			out = append(out, api.Extent{Off: e.Off, Len: e.Len})
		}
		return out
	}
	out := api.Volume{Name: v.Name, Pool: v.Pool, NSID: v.NSID, Size: v.Size, State: string(v.State), NGUID: v.NGUID, UUID: v.UUID,
		SubNQN: n.cfg.SubsystemNQN(v.Pool), Extents: conv(v.Extents), Hosts: v.Hosts, Implicit: v.Implicit, RemovedOn: v.RemovedOn, Created: v.Created}
	if len(v.Pending) > 0 {
		out.Pending = conv(v.Pending)
	}
	return out
}

// implicitVolume is the whole-array volume of a pool without a record.
func (n *Node) implicitVolume(s *served) store.Volume {
	nguid, uuid := derive16("array", n.cfg.Cluster, s.cfg.Name), derive16("array-uuid", n.cfg.Cluster, s.cfg.Name)
	return store.Volume{Name: s.cfg.Name, Pool: s.cfg.Name, NSID: frontendNSID, Size: s.gate.size,
		Extents: []store.Extent{{Off: 0, Len: s.gate.size}}, NGUID: hex.EncodeToString(nguid[:]), UUID: hex.EncodeToString(uuid[:]),
		State: store.VolumeReady, Implicit: true}
}

func (n *Node) volumesReady() (*store.Volumes, error) {
	vs := n.volumesStore()
	if vs == nil {
		return nil, fmt.Errorf("node %s has no cluster store: volumes need one: %w", n.me.Name, api.ErrUnavailable)
	}
	return vs, nil
}

// Volumes implements api.Volumer: every carved volume, and the implicit
// volume of each pool without a record.
func (n *Node) Volumes(ctx context.Context) ([]api.Volume, error) {
	vs, err := n.volumesReady()
	if err != nil {
		return nil, err
	}
	pools, _, err := vs.Pools(ctx)
	if err != nil {
		return nil, apiErr(err)
	}
	var out []api.Volume
	for _, s := range n.servedAll() {
		p, ok := pools[s.cfg.Name]
		if !ok {
			v := n.implicitVolume(s)
			out = append(out, n.apiVolume(&v))
			continue
		}
		for i := range p.Volumes {
			out = append(out, n.apiVolume(&p.Volumes[i]))
		}
	}
	return out, nil
}

// lookupVolume finds a carved volume or a pool's implicit one.
func (n *Node) lookupVolume(ctx context.Context, vs *store.Volumes, name string) (store.Volume, *served, error) {
	p, v, err := vs.Find(ctx, name)
	if err == nil {
		return *v, n.served(p.Name), nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return store.Volume{}, nil, apiErr(err)
	}
	if s := n.served(name); s != nil {
		p, err := vs.Pool(ctx, name)
		if err != nil {
			return store.Volume{}, nil, apiErr(err)
		}
		if p.Revision == 0 {
			return n.implicitVolume(s), s, nil
		}
		if iv := p.Volume(name); iv != nil {
			return *iv, s, nil
		}
	}
	return store.Volume{}, nil, fmt.Errorf("volume %s is not known; `tier0 volume list` shows the volumes: %w", name, api.ErrNotFound)
}

// Volume implements api.Volumer, with the volume's holders.
func (n *Node) Volume(ctx context.Context, name string) (api.Volume, error) {
	vs, err := n.volumesReady()
	if err != nil {
		return api.Volume{}, err
	}
	v, s, err := n.lookupVolume(ctx, vs, name)
	if err != nil {
		return api.Volume{}, err
	}
	out := n.apiVolume(&v)
	if s != nil {
		if out.Holders, err = n.volumeHolders(ctx, s.nqn, v.NSID, v.Hosts); err != nil {
			return out, apiErr(err)
		}
	}
	return out, nil
}

// CreateVolume implements api.Volumer.
func (n *Node) CreateVolume(ctx context.Context, name, pool string, size int64, hosts []string) (api.Volume, error) {
	vs, err := n.volumesReady()
	if err != nil {
		return api.Volume{}, err
	}
	if n.served(pool) == nil {
		var names []string
		for _, s := range n.servedAll() {
			names = append(names, s.cfg.Name)
		}
		return api.Volume{}, fmt.Errorf("pool %q is not an array of this cluster (arrays: %s): %w", pool, strings.Join(names, ", "), api.ErrNotFound)
	}
	v, err := vs.Create(ctx, pool, name, size, hosts)
	if err != nil {
		return api.Volume{}, apiErr(err)
	}
	return n.apiVolume(&v), nil
}

// SetVolumeHosts implements api.Volumer: the volume's host allow-list
// (every node applies it at its next reconcile, on the change).
func (n *Node) SetVolumeHosts(ctx context.Context, name string, hosts []string) (api.Volume, error) {
	vs, err := n.volumesReady()
	if err != nil {
		return api.Volume{}, err
	}
	if n.served(name) != nil {
		if p, err := vs.Pool(ctx, name); err == nil && p.Revision == 0 {
			return api.Volume{}, fmt.Errorf("volume %s is pool %s's implicit whole-array volume, which every host the subsystem admits sees (fabrics.frontend.allow_hosts); carve the pool into volumes to limit hosts per volume: %w", name, name, api.ErrConflict)
		}
	}
	v, err := vs.SetHosts(ctx, name, hosts)
	if err != nil {
		return api.Volume{}, apiErr(err)
	}
	return n.apiVolume(&v), nil
}

// ResizeVolume implements api.Volumer.
func (n *Node) ResizeVolume(ctx context.Context, name string, size int64) (api.Volume, error) {
	vs, err := n.volumesReady()
	if err != nil {
		return api.Volume{}, err
	}
	v, err := vs.Resize(ctx, name, size)
	if err != nil {
		return api.Volume{}, apiErr(err)
	}
	return n.apiVolume(&v), nil
}

// DeleteVolume implements api.Volumer. A volume hosts are connected to or
// hold reservations on is deleted only with force; a pool's implicit
// volume only with force (its data is lost, and the pool is then carved).
func (n *Node) DeleteVolume(ctx context.Context, name string, force bool) (api.Volume, error) {
	vs, err := n.volumesReady()
	if err != nil {
		return api.Volume{}, err
	}
	v, s, err := n.lookupVolume(ctx, vs, name)
	if err != nil {
		return api.Volume{}, err
	}
	if v.State == store.VolumeDeleting {
		return n.apiVolume(&v), nil
	}
	holders, err := n.volumeHolders(ctx, s.nqn, v.NSID, v.Hosts)
	if err != nil {
		return api.Volume{}, apiErr(err)
	}
	if !force {
		if len(holders) > 0 {
			return api.Volume{}, fmt.Errorf("volume %s (%s namespace %d) is in use: %s; disconnect those hosts (nvme disconnect) and release the reservation, or delete with --force: %w",
				name, s.nqn, v.NSID, describeHolders(holders), api.ErrConflict)
		}
		if v.Implicit {
			return api.Volume{}, fmt.Errorf("volume %s is pool %s's implicit whole-array volume: deleting it loses all its data and lets the pool be carved into volumes; repeat with --force to do that: %w", name, s.cfg.Name, api.ErrConflict)
		}
	}
	if v.Implicit {
		p, err := vs.ReleaseImplicit(ctx, s.cfg.Name, s.nqn, s.gate.size, s.gate.bs)
		if err != nil {
			return api.Volume{}, apiErr(err)
		}
		out := n.apiVolume(&p.Volumes[0])
		out.Holders = holders
		return out, nil
	}
	dv, err := vs.Delete(ctx, name)
	if err != nil {
		return api.Volume{}, apiErr(err)
	}
	out := n.apiVolume(&dv)
	out.Holders = holders
	return out, nil
}
