package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/store"
)

// onlineDeleteWait bounds how long DeleteArray waits for every live node
// to stop serving the array and wipe its drives.
const onlineDeleteWait = 30 * time.Second

var _ api.ArrayProvisioner = (*Node)(nil)

func apiOnline(a store.DesiredArray) api.OnlineArray {
	return api.OnlineArray{Name: a.Name, Level: a.Level, ChunkKiB: a.ChunkKiB, Home: a.Home, Members: a.Members,
		Phase: string(a.Phase), Stopped: a.Stopped, Wiped: a.Wiped, Created: a.Created}
}

// CreateArray implements api.ArrayProvisioner: it places the array on free
// drives and writes its desired record; this node serves it before
// answering, the others on the change.
func (n *Node) CreateArray(ctx context.Context, req api.ArrayCreate) (api.OnlineArray, error) {
	if n.online == nil {
		return api.OnlineArray{}, fmt.Errorf("this node has no control plane to create arrays in: %w", api.ErrUnavailable)
	}
	list, _, err := n.online.da.List(ctx)
	if err != nil {
		return api.OnlineArray{}, err
	}
	a, err := placeOnline(n.cfg, list, onlineRequest{Name: req.Name, Level: req.Level, Members: req.Members, Home: req.Home, ChunkKiB: req.ChunkKiB})
	if err != nil {
		kind := api.ErrBadRequest
		if strings.Contains(err.Error(), "is taken") || strings.Contains(err.Error(), "free drives") {
			kind = api.ErrConflict
		}
		return api.OnlineArray{}, fmt.Errorf("%w: %w", err, kind)
	}
	cfg := onlineConfig(a)
	capacity, bs, err := n.plannedSize(&cfg)
	if err != nil {
		return api.OnlineArray{}, fmt.Errorf("%w: %w", err, api.ErrConflict)
	}
	if req.NoVolume {
		if err := n.online.da.InitPool(ctx, a.Name, n.cfg.SubsystemNQN(a.Name), capacity, bs); err != nil {
			return api.OnlineArray{}, apiStoreErr(err)
		}
	}
	if a, err = n.online.da.Create(ctx, a); err != nil {
		return api.OnlineArray{}, apiStoreErr(err)
	}
	n.log.Info("array created online", "array", a.Name, "level", a.Level, "home", a.Home, "members", a.Members, "capacity", capacity)
	if err := n.reconcileOnline(ctx); err != nil {
		n.log.Warn("serving the new array here failed; retried", "array", a.Name, "err", err)
	}
	return apiOnline(a), nil
}

func apiStoreErr(err error) error {
	switch {
	case errors.Is(err, store.ErrExists):
		return fmt.Errorf("%w: %w", err, api.ErrConflict)
	case errors.Is(err, store.ErrBadOptions):
		return fmt.Errorf("%w: %w", err, api.ErrBadRequest)
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: %w", err, api.ErrNotFound)
	}
	return err
}

// DeleteArray implements api.ArrayProvisioner.
func (n *Node) DeleteArray(ctx context.Context, name string, force bool) (api.OnlineArray, error) {
	if n.online == nil {
		return api.OnlineArray{}, fmt.Errorf("this node has no control plane to delete arrays in: %w", api.ErrUnavailable)
	}
	a, err := n.online.da.Get(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		if _, site := n.cfg.Array(name); site {
			return api.OnlineArray{}, fmt.Errorf("array %s is defined in the site file %s, not created online: remove it from the file's arrays: and restart the nodes one at a time (docs/OPERATIONS.md): %w", name, n.cfg.File, api.ErrConflict)
		}
		var names []string
		for _, o := range n.online.list() {
			names = append(names, o.Name)
		}
		return api.OnlineArray{}, fmt.Errorf("array %q was not created online; the online arrays are: %s: %w", name, orNone(names), api.ErrNotFound)
	}
	if err != nil {
		return api.OnlineArray{}, err
	}
	var out api.OnlineArray
	if a.Phase == store.ArrayActive {
		vols, holders, err := n.arrayUsers(ctx, name)
		if err != nil {
			return api.OnlineArray{}, err
		}
		if !force && (len(vols) > 0 || len(holders) > 0) {
			why := []string{}
			if len(vols) > 0 {
				why = append(why, "its volumes "+strings.Join(vols, ", ")+" (`tier0 volume delete` them)")
			}
			if len(holders) > 0 {
				why = append(why, "hosts use it: "+describeHolders(holders)+" (unmount, nvme disconnect, release the reservations)")
			}
			return api.OnlineArray{}, fmt.Errorf("array %s is in use: %s; or delete with --force, which removes its volumes and their data: %w", name, strings.Join(why, "; "), api.ErrConflict)
		}
		out.Volumes, out.Holders = vols, holders
		if a, err = n.online.da.Update(ctx, name, func(x *store.DesiredArray) (bool, error) {
			if x.Phase == store.ArrayDeleting {
				return false, nil
			}
			x.Phase, x.Force = store.ArrayDeleting, force
			return true, nil
		}); err != nil {
			return api.OnlineArray{}, apiStoreErr(err)
		}
		n.log.Info("array deleting", "array", name, "force", force, "volumes", vols)
	}
	deadline := n.clk().Now().Add(onlineDeleteWait)
	for {
		if err := n.reconcileOnline(ctx); err != nil {
			n.log.Debug("reconciling a deleting array", "array", name, "err", err)
		}
		cur, err := n.online.da.Get(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			res := apiOnline(a)
			res.Phase, res.Volumes, res.Holders = "deleted", out.Volumes, out.Holders
			return res, nil
		}
		if err == nil {
			a = cur
		}
		if away := n.unwiped(a); len(away) > 0 && n.liveDone(ctx, a) {
			// Gone from every live node; the nodes away wipe their
			// drives when they return.
			res := apiOnline(a)
			res.Volumes, res.Holders, res.Unwiped = out.Volumes, out.Holders, away
			return res, nil
		}
		if !n.clk().Now().Before(deadline) {
			res := apiOnline(a)
			res.Volumes, res.Holders = out.Volumes, out.Holders
			return res, nil // still deleting: `tier0 array delete` again follows it
		}
		select {
		case <-ctx.Done():
			return api.OnlineArray{}, ctx.Err()
		case <-n.clk().After(200 * time.Millisecond):
		}
	}
}

// liveDone reports whether every live node stopped serving deleting
// array a and wiped its member drives.
func (n *Node) liveDone(ctx context.Context, a store.DesiredArray) bool {
	alive, err := n.st.Nodes(ctx)
	return err == nil && len(notIn(alive, a.Stopped)) == 0 && len(notIn(alive, a.Wiped)) == 0
}

// arrayUsers are the volumes of pool name (its implicit whole-array
// volume, named after it, while it has no volume table) and the hosts
// connected to or holding reservations on its namespaces.
func (n *Node) arrayUsers(ctx context.Context, name string) ([]string, []api.VolumeHolder, error) {
	vs := n.volumesStore()
	p, err := vs.Pool(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	nqn := n.cfg.SubsystemNQN(name)
	var vols []string
	var holders []api.VolumeHolder
	add := func(nsid uint32, allowed []string) error {
		hs, err := n.volumeHolders(ctx, nqn, nsid, allowed)
		holders = append(holders, hs...)
		return err
	}
	if p.Revision == 0 {
		vols = append(vols, name)
		if err := add(frontendNSID, nil); err != nil {
			return nil, nil, err
		}
	}
	for _, v := range p.Volumes {
		if v.State != store.VolumeDeleting {
			vols = append(vols, v.Name)
		}
		if err := add(v.NSID, v.Hosts); err != nil {
			return nil, nil, err
		}
	}
	return vols, dedupHolders(holders), nil
}

func dedupHolders(hs []api.VolumeHolder) []api.VolumeHolder {
	seen := map[api.VolumeHolder]bool{}
	var out []api.VolumeHolder
	for _, h := range hs {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
