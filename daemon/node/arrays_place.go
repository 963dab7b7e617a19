package node

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/store"
)

// onlineRequest is what `tier0 array create` asks for.
type onlineRequest struct {
	Name     string
	Level    string // raid5, raid6
	Members  int    // member count
	Home     string // "" = the node homing the fewest arrays
	ChunkKiB int    // 0 = config.DefaultChunkKiB
}

// usedDrives are the drives an array of the site file or an online array
// uses. A deleting array's drive is free once its node wiped it; until
// then (its node was down during the delete) it holds the array's
// superblock and stays taken.
func usedDrives(cfg *config.Config, online []store.DesiredArray) map[string][]string {
	used := map[string][]string{}
	for _, a := range cfg.Arrays {
		for _, d := range a.Members {
			used[d] = append(used[d], a.Name)
		}
	}
	for _, a := range online {
		for _, d := range a.Members {
			if nd, _, ok := cfg.Drive(d); ok && a.Phase == store.ArrayDeleting && slices.Contains(a.Wiped, nd.Name) {
				continue
			}
			used[d] = append(used[d], a.Name)
		}
	}
	return used
}

// placeOnline checks req and chooses the members of a new online array:
// drives no array uses, on distinct nodes other than the home, across
// failure domains as the site's placement.domains says: the same rules
// (config.Place) as the site file's members: auto, over the free drives
// only, so that no existing array's data moves.
func placeOnline(cfg *config.Config, online []store.DesiredArray, req onlineRequest) (store.DesiredArray, error) {
	out := store.DesiredArray{Name: req.Name, Level: strings.ToLower(req.Level), ChunkKiB: req.ChunkKiB, Home: req.Home}
	if req.Name == "" || len(req.Name) > 64 || strings.ContainsAny(req.Name, "/\x00 \t\n") {
		return out, fmt.Errorf("array name %q: want 1..64 characters without '/' or spaces", req.Name)
	}
	if _, ok := cfg.Array(req.Name); ok {
		return out, fmt.Errorf("array name %q is taken by the site file's arrays; pick another name", req.Name)
	}
	for _, a := range online {
		if a.Name == req.Name && a.Phase == store.ArrayDeleting {
			return out, fmt.Errorf("array name %q is taken by an online array still being deleted (its record stays until every node holding a member drive wiped it; stopped on %s, wiped on %s): pick another name, or start the nodes that are down and retry", req.Name, orNone(a.Stopped), orNone(a.Wiped))
		}
		if a.Name == req.Name {
			return out, fmt.Errorf("array name %q is taken by an online array (phase %s); pick another name or `tier0 array delete %s` first", req.Name, a.Phase, req.Name)
		}
	}
	lvl, err := cluster.ParseLevel(req.Level)
	if err != nil {
		return out, fmt.Errorf("--level %q: want raid5 or raid6", req.Level)
	}
	if need := lvl.Parity() + 2; req.Members < need {
		return out, fmt.Errorf("--members %d: %s needs at least %d members", req.Members, out.Level, need)
	}
	if out.ChunkKiB == 0 {
		out.ChunkKiB = config.DefaultChunkKiB
	}
	if c := out.ChunkKiB; c < 4 || c > 4096 || c&(c-1) != 0 {
		return out, fmt.Errorf("--chunk-kib %d: want a power of two 4..4096", c)
	}
	used := usedDrives(cfg, online)
	if out.Home == "" {
		out.Home = leastHome(cfg, online)
	} else if _, ok := cfg.Node(out.Home); !ok {
		var names []string
		for _, nd := range cfg.Nodes {
			names = append(names, nd.Name)
		}
		return out, fmt.Errorf("--home %q is not a node of the site; the nodes are %s", out.Home, strings.Join(names, ", "))
	}
	pr := config.PlaceRequest{Domains: strings.ToLower(cfg.Placement.Domains)}
	free := 0
	for _, nd := range cfg.Nodes {
		pn := config.PlaceNode{Name: nd.Name, Domain: nd.Domain}
		for _, d := range nd.Drives {
			if len(used[d.Name]) == 0 {
				pn.Drives = append(pn.Drives, d.Name)
				if nd.Name != out.Home {
					free++
				}
			}
		}
		pr.Nodes = append(pr.Nodes, pn)
	}
	pr.Arrays = []config.PlaceArray{{Name: req.Name, Home: out.Home, Width: req.Members, Parity: lvl.Parity()}}
	placed, err := config.Place(pr)
	if err != nil || len(placed) != 1 || len(placed[0]) != req.Members {
		why := "placement found none"
		if err != nil {
			why = strings.TrimSuffix(err.Error(), ": "+config.ErrPlacement.Error())
		}
		return out, fmt.Errorf("array %s: %d members on free drives (no array uses them) of distinct nodes other than home %s, domains %q: %s; %d free drive(s) off the home node%s: add drives, delete an array, pick another --home or fewer --members",
			req.Name, req.Members, out.Home, orDefault(pr.Domains, "none"), why, free, unwipedNote(cfg, online))
	}
	out.Members = placed[0]
	return out, nil
}

// unwipedNote names the drives of arrays being deleted that their nodes
// have not wiped yet (taken until then), for a refused placement.
func unwipedNote(cfg *config.Config, online []store.DesiredArray) string {
	var l []string
	for _, a := range online {
		if a.Phase != store.ArrayDeleting {
			continue
		}
		for _, d := range a.Members {
			if nd, _, ok := cfg.Drive(d); ok && !slices.Contains(a.Wiped, nd.Name) {
				l = append(l, fmt.Sprintf("%s (array %s being deleted)", d, a.Name))
			}
		}
	}
	if len(l) == 0 {
		return ""
	}
	return "; taken until their node (down?) wipes them: " + strings.Join(l, ", ")
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// leastHome is the node homing the fewest arrays (first in site order).
func leastHome(cfg *config.Config, online []store.DesiredArray) string {
	count := map[string]int{}
	for _, a := range cfg.Arrays {
		count[a.Home]++
	}
	for _, a := range online {
		count[a.Home]++
	}
	best := ""
	for _, nd := range cfg.Nodes {
		if best == "" || count[nd.Name] < count[best] {
			best = nd.Name
		}
	}
	return best
}

// onlineConfig is the config.Array an online array is served as: its
// members fixed, never shared with another array.
func onlineConfig(a store.DesiredArray) config.Array {
	return config.Array{Name: a.Name, Level: a.Level, ChunkKiB: a.ChunkKiB, Home: a.Home, Members: slices.Clone(a.Members), Width: len(a.Members)}
}

var errNotOnline = errors.New("not an online array")
