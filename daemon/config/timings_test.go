package config

import (
	"strings"
	"testing"
	"time"
)

// threeNodes is baseNodes without node D: too small for a RAID-5 whose
// members all sit off its home node.
var threeNodes = strings.Replace(baseNodes, "  - {name: D, address: 127.0.0.1, backend: {port: 5031}, frontend: {port: 5032}, api: {port: 5033}, drives: [{name: D1, path: /x/d1}, {name: D2, path: /x/d2}]}\n", "", 1)

// The emulation timings default to today's values when left out.
func TestTimingDefaults(t *testing.T) {
	c, err := Parse("site.yaml", []byte(baseNodes+`arrays: [{name: A, level: raid5, home: A, members: [B1, C1, D1]}]`))
	if err != nil {
		t.Fatal(err)
	}
	e, p := c.ControlPlane.Etcd, c.Policies
	for _, x := range []struct {
		key       string
		got, want time.Duration
	}{
		{"control_plane.etcd.tick", e.Tick.D(), 50 * time.Millisecond},
		{"control_plane.etcd.election", e.Election.D(), 500 * time.Millisecond},
		{"policies.housekeeping_interval", p.HousekeepingInterval.D(), time.Second},
		{"fabrics.backend.connect_timeout", c.Fabrics.Backend.ConnectTimeout.D(), 10 * time.Second},
		{"fabrics.frontend.connect_timeout", c.Fabrics.Frontend.ConnectTimeout.D(), 10 * time.Second},
	} {
		if x.got != x.want {
			t.Errorf("%s defaults to %v, want %v", x.key, x.got, x.want)
		}
	}
	if c.Arrays[0].HomeMember {
		t.Error("arrays[0].home_member defaults to true")
	}
}

func TestTimingKeys(t *testing.T) {
	c, err := Parse("site.yaml", []byte(strings.Replace(baseNodes, "peer_port: 5101}", "peer_port: 5101, tick: 500ms, election: 5s}", 1)+`
arrays: [{name: A, level: raid5, home: A, members: [B1, C1, D1]}]
fabrics: {backend: {connect_timeout: 60s}, frontend: {connect_timeout: 30s}}
policies: {lease_ttl: 30s, housekeeping_interval: 5s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if e := c.ControlPlane.Etcd; e.Tick.D() != 500*time.Millisecond || e.Election.D() != 5*time.Second {
		t.Errorf("etcd tick %v election %v, want 500ms 5s", e.Tick, e.Election)
	}
	if c.Fabrics.Backend.ConnectTimeout.D() != time.Minute || c.Fabrics.Frontend.ConnectTimeout.D() != 30*time.Second {
		t.Errorf("connect_timeout backend %v frontend %v, want 1m0s 30s", c.Fabrics.Backend.ConnectTimeout, c.Fabrics.Frontend.ConnectTimeout)
	}
	if c.Policies.HousekeepingInterval.D() != 5*time.Second {
		t.Errorf("housekeeping_interval %v, want 5s", c.Policies.HousekeepingInterval)
	}
	// election alone: the tick stays the default
	c, err = Parse("site.yaml", []byte(strings.Replace(baseNodes, "peer_port: 5101}", "peer_port: 5101, election: 1s}", 1)+`arrays: []`))
	if err != nil {
		t.Fatal(err)
	}
	if e := c.ControlPlane.Etcd; e.Tick.D() != 50*time.Millisecond || e.Election.D() != time.Second {
		t.Errorf("etcd tick %v election %v, want 50ms 1s", e.Tick, e.Election)
	}
}

func TestTimingProblems(t *testing.T) {
	etcd := func(extra string) string {
		return strings.Replace(baseNodes, "peer_port: 5101}", "peer_port: 5101, "+extra+"}", 1) + "arrays: []\n"
	}
	cases := []struct {
		name, yaml, want string
	}{
		{"tick too short", etcd("tick: 1ms"), `site.yaml: control_plane.etcd.tick: 1ms; expected 10ms to 5s (default 50ms)`},
		{"election under 5 ticks", etcd("tick: 500ms, election: 2s"), `site.yaml: control_plane.etcd.election: 2s with tick 500ms; expected 5 × tick to 50s (default 10 × tick)`},
		{"election too long for the lease", etcd("tick: 500ms, election: 5s"), `site.yaml: control_plane.etcd.election: 5s; a lost raft leader may stall lease renewals for up to 2 × election, so expected at most policies.lease_ttl/3 = 1.667s (raise lease_ttl or lower election)`},
		{"housekeeping too short", baseNodes + "arrays: []\npolicies: {housekeeping_interval: 10ms}\n", `site.yaml: policies.housekeeping_interval: 10ms; expected 100ms to 1m (default 1s)`},
		{"connect timeout too short", baseNodes + "arrays: []\nfabrics: {frontend: {connect_timeout: 500ms}}\n", `site.yaml: fabrics.frontend.connect_timeout: 500ms; expected 1s to 5m (default 10s: the longest a host may take from its connection to a finished Connect)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.yaml)
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), tc.want)
			}
		})
	}
}

// home_member lets a three-node cluster carry a RAID-5 2+1 with one
// member on its home node; without it the same array is refused.
func TestHomeMember(t *testing.T) {
	arr := `arrays: [{name: B, level: raid5, home: B, members: [A1, B1, C1]%s}]`
	got := problems(t, threeNodes+strings.Replace(arr, "%s", "", 1))
	want := []string{
		`site.yaml: arrays[0].width: array is 3 wide but the cluster has 3 nodes; expected at most nodes-1 = 2 (no member on the home node, no two members on one node)`,
		`site.yaml: arrays[0].members[1]: drive "B1" is on the array's home node B; expected members on other nodes only, so the array survives its home node's loss complete (or home_member: true, for a cluster too small, accepting a degraded array after that loss)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("without home_member, problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	c, err := Parse("site.yaml", []byte(threeNodes+strings.Replace(arr, "%s", ", home_member: true", 1)))
	if err != nil {
		t.Fatalf("with home_member: %v", err)
	}
	if !c.Arrays[0].HomeMember {
		t.Error("home_member not decoded")
	}
	// still one member per node, and never with automatic placement
	got = problems(t, threeNodes+`arrays: [{name: B, level: raid5, home: B, members: [A1, B1, B2], home_member: true}]`)
	if len(got) != 1 || !strings.Contains(got[0], `drive "B2" is on node B, like members[1] (B1)`) {
		t.Errorf("two members on the home node: problems %q", got)
	}
	got = problems(t, threeNodes+`arrays: [{name: B, level: raid5, home: B, members: auto, width: 3, home_member: true}]`)
	if len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), "arrays[0].home_member: true with automatic placement") {
		t.Errorf("home_member with auto placement: problems %q", got)
	}
}
