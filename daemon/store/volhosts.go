package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Per-volume host allow-lists (docs/VOLUMES.md, "Host allow-lists"):
// Volume.Hosts, when not empty, are the only host NQNs that see and may
// use the volume's namespace, on every node's path. Empty: every host the
// pool's subsystem admits.

// maxNQNLen is the longest NQN the NVMe specification allows.
const maxNQNLen = 223

// cleanHosts checks host NQNs and returns them sorted without duplicates
// (nil for none).
func cleanHosts(volume string, hosts []string) ([]string, error) {
	var out []string
	for _, h := range hosts {
		if h == "" || len(h) > maxNQNLen || strings.ContainsAny(h, "\x00 \t\n") {
			return nil, fmt.Errorf("volume %s: host NQN %q: want 1..%d bytes without spaces, as the host's /etc/nvme/hostnqn holds (nqn.2014-08.org.nvmexpress:uuid:...): %w", volume, h, maxNQNLen, ErrBadOptions)
		}
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out, nil
}

// SetHosts replaces the hosts allowed to use a volume (nil or empty: every
// host the pool's subsystem admits). Every node applies it at its next
// reconcile (on the change), telling connected hosts to rescan.
func (vs *Volumes) SetHosts(ctx context.Context, name string, hosts []string) (Volume, error) {
	hosts, err := cleanHosts(name, hosts)
	if err != nil {
		return Volume{}, err
	}
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
		if v.State == VolumeDeleting {
			return change{}, fmt.Errorf("volume %s is being deleted; its hosts cannot change: %w", name, ErrConflict)
		}
		v.Hosts = hosts
		out = *v
		return change{}, nil
	})
	return out, err
}
