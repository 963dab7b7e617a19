package config

import (
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Volume is one volume carved from an array (docs/VOLUMES.md), as
// `tier0 config export` writes it from the cluster's store: the record of
// the desired volumes at the time of the export. While the store holds
// an array's volume table, that table is the truth and this section is
// not applied (docs/CONFIG.md, "volumes").
type Volume struct {
	Name string `mapstructure:"name" json:"name"`
	// Pool is the array the volume is carved from.
	Pool string `mapstructure:"pool" json:"pool"`
	// NSID is its namespace ID in the array's subsystem, 1..1024.
	NSID uint32 `mapstructure:"nsid" json:"nsid"`
	// Size is its size: the sum of its extents.
	Size Size `mapstructure:"size" json:"size"`
	// NGUID and UUID are 32 hex digits each, the same on every node.
	NGUID string `mapstructure:"nguid" json:"nguid"`
	UUID  string `mapstructure:"uuid" json:"uuid"`
	// Hosts, when not empty, are the only host NQNs that see the volume.
	Hosts []string `mapstructure:"hosts" json:"hosts,omitempty"`
	// Extents map the volume's bytes, in order, onto the array's.
	Extents []Extent `mapstructure:"extents" json:"extents"`
}

// Extent is a range of an array's bytes.
type Extent struct {
	Off Size `mapstructure:"off" json:"off"`
	Len Size `mapstructure:"len" json:"len"`
}

// maxVolumeNSID is the target's namespace limit per subsystem.
const maxVolumeNSID = 1024

// checkVolumes checks the volumes section: each names an array of the
// file, names are unique across arrays, NSIDs unique per array, the
// identifiers are 32 hex digits, the extents sum to the size and no two
// extents of an array overlap.
func (c *Config) checkVolumes(k *checker) {
	names := map[string]bool{}
	type ref struct {
		key string
		e   Extent
	}
	nsids := map[string]map[uint32]string{}
	extents := map[string][]ref{}
	for i, v := range c.Volumes {
		key := fmt.Sprintf("volumes[%d]", i)
		if v.Name == "" || len(v.Name) > 64 || strings.ContainsAny(v.Name, "/ \t\n") {
			k.add(key+".name", "%q: expected 1..64 characters without '/' or spaces", v.Name)
		} else if names[v.Name] {
			k.add(key+".name", "%q is used by an earlier volume; volume names are unique across arrays", v.Name)
		}
		names[v.Name] = true
		if _, ok := c.Array(v.Pool); !ok {
			var as []string
			for _, a := range c.Arrays {
				as = append(as, a.Name)
			}
			k.add(key+".pool", "%q is not an array of this file; expected one of: %s", v.Pool, strings.Join(as, ", "))
		}
		if v.NSID == 0 || v.NSID > maxVolumeNSID {
			k.add(key+".nsid", "%d: expected 1..%d", v.NSID, maxVolumeNSID)
		} else if other, ok := nsids[v.Pool][v.NSID]; ok {
			k.add(key+".nsid", "%d is also %s's in array %s; a namespace ID is unique per array", v.NSID, other, v.Pool)
		}
		if nsids[v.Pool] == nil {
			nsids[v.Pool] = map[uint32]string{}
		}
		nsids[v.Pool][v.NSID] = v.Name
		for _, id := range []struct{ key, v string }{{"nguid", v.NGUID}, {"uuid", v.UUID}} {
			if b, err := hex.DecodeString(id.v); err != nil || len(b) != 16 {
				k.add(key+"."+id.key, "%q: expected 32 hex digits (as `tier0 volume show` prints)", id.v)
			}
		}
		for j, h := range v.Hosts {
			if h == "" || len(h) > 223 || strings.ContainsAny(h, " \t\n") {
				k.add(fmt.Sprintf("%s.hosts[%d]", key, j), "%q: expected a host NQN (1..223 bytes, no spaces)", h)
			}
		}
		var sum Size
		for j, e := range v.Extents {
			if e.Off < 0 || e.Len <= 0 || e.Off%512 != 0 || e.Len%512 != 0 {
				k.add(fmt.Sprintf("%s.extents[%d]", key, j), "off %d len %d: expected a positive length and both multiples of 512", e.Off, e.Len)
				continue
			}
			sum += e.Len
			extents[v.Pool] = append(extents[v.Pool], ref{fmt.Sprintf("%s.extents[%d]", key, j), e})
		}
		if len(v.Extents) == 0 {
			k.add(key+".extents", "none; expected the array byte ranges the volume maps")
		} else if sum != v.Size {
			k.add(key+".size", "%s, but its extents add up to %s; expected the same", v.Size, sum)
		}
	}
	pools := make([]string, 0, len(extents))
	for p := range extents {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	for _, p := range pools {
		rs := extents[p]
		slices.SortStableFunc(rs, func(a, b ref) int { return int((a.e.Off - b.e.Off) >> 9) })
		for i := 1; i < len(rs); i++ {
			if prev := rs[i-1]; rs[i].e.Off < prev.e.Off+prev.e.Len {
				k.add(rs[i].key, "overlaps %s in array %s; a byte belongs to one volume", prev.key, p)
			}
		}
	}
}

// PoolVolumes are the volumes of array pool, in file order.
func (c *Config) PoolVolumes(pool string) []Volume {
	var out []Volume
	for _, v := range c.Volumes {
		if v.Pool == pool {
			out = append(out, v)
		}
	}
	return out
}
