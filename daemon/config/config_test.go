package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// base is a valid 5-node cluster; tests append or replace parts of it.
const baseNodes = `cluster: t
nodes:
  - {name: A, address: 127.0.0.1, backend: {port: 5001}, frontend: {port: 5002}, api: {port: 5003}, drives: [{name: A1, path: /x/a1}, {name: A2, path: /x/a2}]}
  - {name: B, address: 127.0.0.1, backend: {port: 5011}, frontend: {port: 5012}, api: {port: 5013}, drives: [{name: B1, path: /x/b1}, {name: B2, path: /x/b2}]}
  - {name: C, address: 127.0.0.1, backend: {port: 5021}, frontend: {port: 5022}, api: {port: 5023}, drives: [{name: C1, path: /x/c1}, {name: C2, path: /x/c2}]}
  - {name: D, address: 127.0.0.1, backend: {port: 5031}, frontend: {port: 5032}, api: {port: 5033}, drives: [{name: D1, path: /x/d1}, {name: D2, path: /x/d2}]}
control_plane:
  etcd: {peers: [A], client_port: 5100, peer_port: 5101}
`

func problems(t *testing.T, yaml string) []string {
	t.Helper()
	_, err := Parse("site.yaml", []byte(yaml))
	if err == nil {
		return nil
	}
	var ve *ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("error is not a *ValidationError wrapping ErrInvalid: %v", err)
	}
	var out []string
	for _, p := range ve.Problems {
		out = append(out, p.String())
	}
	return out
}

func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"duplicate node", strings.Replace(baseNodes, "{name: D,", "{name: B,", 1) + `arrays: []`,
			[]string{`site.yaml: nodes[3].name: duplicate node name "B" (also nodes[1]); expected every node name to be unique`}},
		{"array wider than nodes-1", baseNodes + `arrays: [{name: A, level: raid5, home: A, members: auto, width: 4}]`,
			[]string{`site.yaml: arrays[0].width: array is 4 wide but the cluster has 4 nodes; expected at most nodes-1 = 3 (no member on the home node, no two members on one node)`}},
		{"unknown drive", baseNodes + `arrays: [{name: A, level: raid5, home: A, members: [B1, C1, Z9]}]`,
			[]string{`site.yaml: arrays[0].members[2]: drive "Z9" is not defined on any node; expected one of the drives listed under nodes[].drives`}},
		{"two members on one node", baseNodes + `arrays: [{name: A, level: raid5, home: A, members: [B1, C1, C2]}]`,
			[]string{`site.yaml: arrays[0].members[2]: drive "C2" is on node C, like members[1] (C1); expected at most one member per node so that losing a node costs one member`}},
		{"member on home node", baseNodes + `arrays: [{name: A, level: raid5, home: A, members: [A1, B1, C1]}]`,
			[]string{`site.yaml: arrays[0].members[0]: drive "A1" is on the array's home node A; expected members on other nodes only, so the array survives its home node's loss complete (or home_member: true, for a cluster too small, accepting a degraded array after that loss)`}},
		{"missing home node", baseNodes + `arrays: [{name: A, level: raid5, members: [B1, C1, D1]}]`,
			[]string{`site.yaml: arrays[0].home: missing; expected the name of the node that owns the array when healthy, one of A, B, C, D`}},
		{"unknown home node", baseNodes + `arrays: [{name: A, level: raid5, home: Q, members: [B1, C1, D1]}]`,
			[]string{`site.yaml: arrays[0].home: node "Q" is not defined; expected one of A, B, C, D`}},
		{"duplicate array and drive", strings.Replace(baseNodes, "name: D2", "name: D1", 1) + `arrays: [{name: A, level: raid5, home: A, members: [B1, C1, D1]}, {name: A, level: raid5, home: B, members: [A1, C2, D1]}]`,
			[]string{
				`site.yaml: nodes[3].drives[1].name: duplicate drive name "D1" (also nodes[3].drives[0]); expected drive names unique across the cluster`,
				`site.yaml: arrays[1].name: duplicate array name "A" (also arrays[0]); expected every array name to be unique`,
			}},
		{"bad level and chunk", baseNodes + `arrays: [{name: A, level: raid7, chunk_kib: 100, home: A, members: [B1, C1, D1]}]`,
			[]string{
				`site.yaml: arrays[0].level: "raid7" is not a RAID level; expected raid5 or raid6`,
				`site.yaml: arrays[0].chunk_kib: 100 is not a power of two from 4 to 4096; expected e.g. 128`,
			}},
		{"raid1 and raid0, which the failover machine refuses", baseNodes + `arrays: [{name: A, level: raid1, home: A, members: [B1, C1]}, {name: B, level: raid0, home: B, members: [A1, C2]}]`,
			[]string{
				`site.yaml: arrays[0].level: raid1 is not run by the cluster's failover (only parity arrays are: a node would refuse to assemble it); expected raid5 (at least 3 members, survives one loss) or raid6 (at least 4, survives two)`,
				`site.yaml: arrays[1].level: raid0 is not run by the cluster's failover (only parity arrays are: a node would refuse to assemble it); expected raid5 (at least 3 members, survives one loss) or raid6 (at least 4, survives two)`,
			}},
		{"raid5 too narrow, raid6 too narrow", baseNodes + `arrays: [{name: A, level: raid5, home: A, members: [B1, C1]}, {name: B, level: raid6, home: B, members: [A1, C2, D2]}]`,
			[]string{
				`site.yaml: arrays[0].width: raid5 needs at least 3 members, got 2`,
				`site.yaml: arrays[1].width: raid6 needs at least 4 members, got 3`,
			}},
		{"port clash", strings.Replace(baseNodes, "api: {port: 5013}", "api: {port: 5002}", 1) + `arrays: []`,
			[]string{`site.yaml: nodes[1].api.port: port 5002 on 127.0.0.1 clashes with nodes[0].frontend.port (node A); expected a distinct port per listener on one address`}},
		{"etcd port clash", strings.Replace(baseNodes, "client_port: 5100", "client_port: 5003", 1) + `arrays: []`,
			[]string{`site.yaml: nodes[0].etcd.client_port: port 5003 on 127.0.0.1 clashes with nodes[0].api.port (node A); expected a distinct port per listener on one address`}},
		{"bad addresses", strings.Replace(strings.Replace(baseNodes, "address: 127.0.0.1, backend: {port: 5001}", "address: 127.0.0.1, backend: {port: 5001, addr: 'bad host!'}", 1),
			"backend: {port: 5011}", "backend: {port: 70000, addr: 0.0.0.0}", 1) + `arrays: []`,
			[]string{
				`site.yaml: nodes[0].backend.addr: "bad host!" is not an IP address or host name; expected e.g. 10.0.0.1 or node-a.example.org`,
				`site.yaml: nodes[1].backend.advertise: missing while the listen address 0.0.0.0 is a wildcard; expected the address others should connect to`,
				`site.yaml: nodes[1].backend.port: 70000 is not a TCP port; expected 1-65535`,
			}},
		{"unknown key", strings.Replace(baseNodes, "cluster: t", "cluster: t\nclustre: x", 1) + `arrays: []`,
			[]string{`site.yaml: clustre: unknown key; expected one of the keys documented in docs/CONFIG.md (check the spelling)`}},
		{"impossible auto placement", strings.Replace(baseNodes, "drives: [{name: D1, path: /x/d1}, {name: D2, path: /x/d2}]", "drives: []", 1) +
			"placement: {domains: distinct}\n" + `arrays: [{name: A, level: raid5, home: A, members: auto, width: 3}]`,
			[]string{
				`site.yaml: nodes[0].domain: missing while placement.domains is "distinct"; expected a failure domain (rack) name for every node`,
				`site.yaml: nodes[1].domain: missing while placement.domains is "distinct"; expected a failure domain (rack) name for every node`,
				`site.yaml: nodes[2].domain: missing while placement.domains is "distinct"; expected a failure domain (rack) name for every node`,
				`site.yaml: nodes[3].domain: missing while placement.domains is "distinct"; expected a failure domain (rack) name for every node`,
			}},
		{"unset env var", strings.Replace(baseNodes, "path: /x/a1", "path: '${TIER0_TEST_UNSET_VAR}/a1'", 1) + `arrays: []`,
			[]string{`site.yaml: nodes[0].drives[0].path: refers to ${TIER0_TEST_UNSET_VAR}, which is not set; export TIER0_TEST_UNSET_VAR or write ${TIER0_TEST_UNSET_VAR:-default}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.yaml)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestAutoPlacementFailureNamesArray(t *testing.T) {
	// Three nodes with drives, one without: an auto array of width 3 homed
	// on A cannot find three other nodes with drives.
	y := strings.Replace(baseNodes, "drives: [{name: D1, path: /x/d1}, {name: D2, path: /x/d2}]", "drives: []", 1) +
		`arrays: [{name: A, level: raid5, home: A, members: auto, width: 3}]`
	got := problems(t, y)
	want := []string{`site.yaml: arrays[0].members: automatic placement failed: array A: needs 3 members: only 2 nodes other than its home node A have drives: placement impossible`}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}
}

func TestSiteConfigs(t *testing.T) {
	t.Setenv("TIER0_WORK", "/var/tmp/tier0-work-test")
	files, _ := filepath.Glob("../../site-configs/*.yaml")
	if len(files) < 3 {
		t.Fatalf("found %d site configs, want at least 3", len(files))
	}
	for _, f := range files {
		c, err := Load(f)
		if err != nil {
			t.Errorf("%s:\n%v", f, err)
			continue
		}
		for _, a := range c.Arrays {
			if len(a.Members) != a.Width {
				t.Errorf("%s: array %s has %d members, want %d", f, a.Name, len(a.Members), a.Width)
			}
		}
		if c.Policies.LeaseTTL.D() <= 0 || c.Fabrics.Backend.Queues == 0 {
			t.Errorf("%s: defaults not applied", f)
		}
	}
	c, err := Load("../../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, d, _ := c.Drive("C3"); d.Path != "/var/tmp/tier0-work-test/C/C3.img" || d.Size != 64<<20 {
		t.Fatalf("C3 = %+v, want path under $TIER0_WORK and 64MiB", d)
	}
	peers := c.EtcdPeers()
	if len(peers) != 3 || peers[1].ClientURL != "http://127.0.0.1:12399" || peers[2].Node != "E" {
		t.Fatalf("etcd peers %+v", peers)
	}
	if c.Policies.LeaseTTL.D() != 3*time.Second {
		t.Fatalf("lease ttl %v", c.Policies.LeaseTTL)
	}
}

func TestWeizmannPlacement(t *testing.T) {
	c, err := Load("../../site-configs/weizmann-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"A": "B1 C1 D1 E1",
		"B": "A1 C2 D2 E2",
		"C": "A2 B2 D3 E3",
		"D": "A3 B3 C3 E4",
		"E": "A4 B4 C4 D4",
	}
	for _, a := range c.Arrays {
		if got := strings.Join(a.Members, " "); got != want[a.Name] {
			t.Errorf("array %s = %s, want %s", a.Name, got, want[a.Name])
		}
	}
	if got := c.SubsystemNQN("A"); got != "nqn.2026-11.io.tier0:weizmann:array-a" {
		t.Errorf("SubsystemNQN = %s", got)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]Size{"4096": 4096, "64MiB": 64 << 20, "1G": 1 << 30, "2TiB": 2 << 40, "8 KiB": 8192} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "12XB", "-1", "1.5G"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) accepted", in)
		}
	}
	if s := Size(64 << 20).String(); s != "64MiB" {
		t.Errorf("String = %s", s)
	}
}

func TestDHCHAPSecretValidation(t *testing.T) {
	base, err := os.ReadFile("../../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(base), "frontend: {queues: 2, queue_depth: 64}",
		`frontend: {queues: 2, queue_depth: 64, dhchap_secret: "DHHC-1:00:notbase64secret:", dhchap_ctrl_secret: "file:/x"}`, 1)
	_, err = Parse("site.yaml", []byte(bad))
	if err == nil || !strings.Contains(err.Error(), "fabrics.frontend.dhchap_secret: not a valid DH-HMAC-CHAP secret") {
		t.Fatalf("bad secret accepted or unclear: %v", err)
	}
	if strings.Contains(err.Error(), "notbase64") {
		t.Fatalf("the error repeats the secret: %v", err)
	}
	good := strings.Replace(string(base), "frontend: {queues: 2, queue_depth: 64}",
		`frontend: {queues: 2, queue_depth: 64, dhchap_ctrl_secret: "file:/x"}`, 1)
	if _, err := Parse("site.yaml", []byte(good)); err == nil || !strings.Contains(err.Error(), "without dhchap_secret") {
		t.Fatalf("controller secret without host secret: %v", err)
	}
}

func TestFabricTransport(t *testing.T) {
	base, err := os.ReadFile("../../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse("site.yaml", base)
	if err != nil {
		t.Fatal(err)
	}
	if c.Fabrics.Backend.Transport != TransportTCP || c.Fabrics.Frontend.Transport != TransportTCP {
		t.Fatalf("default transports %q/%q, want tcp", c.Fabrics.Backend.Transport, c.Fabrics.Frontend.Transport)
	}
	rdma := strings.NewReplacer("backend:  {queues: 2, queue_depth: 64}", "backend:  {queues: 2, queue_depth: 64, transport: rdma}",
		"frontend: {queues: 2, queue_depth: 64}", "frontend: {queues: 2, queue_depth: 64, transport: rdma}").Replace(string(base))
	if c, err = Parse("site.yaml", []byte(rdma)); err != nil {
		t.Fatal(err)
	}
	if c.Fabrics.Backend.Transport != TransportRDMA || c.Fabrics.Frontend.Transport != TransportRDMA {
		t.Fatalf("transports %q/%q, want rdma", c.Fabrics.Backend.Transport, c.Fabrics.Frontend.Transport)
	}
	for _, tc := range []struct{ fabric, want string }{
		{`backend:  {queues: 2, queue_depth: 64, transport: infiniband}`, `fabrics.backend.transport: "infiniband" is not a transport; expected tcp or rdma`},
		{`backend:  {queues: 2, queue_depth: 64, transport: rdma, header_digest: true}`, `fabrics.backend.transport: rdma with header_digest/data_digest set`},
	} {
		bad := strings.Replace(string(base), "backend:  {queues: 2, queue_depth: 64}", tc.fabric, 1)
		if _, err := Parse("site.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.fabric, err, tc.want)
		}
	}
	// DH-HMAC-CHAP over RDMA on either fabric: the targets authenticate
	// their hosts, and the nodes importing members over the backend are
	// daemon/host over rdma.Transport, which authenticates as over TCP.
	for _, ok := range []string{
		strings.Replace(string(base), "frontend: {queues: 2, queue_depth: 64}", `frontend: {queues: 2, queue_depth: 64, transport: rdma, dhchap_secret: "file:/x"}`, 1),
		strings.Replace(string(base), "backend:  {queues: 2, queue_depth: 64}", `backend:  {queues: 2, queue_depth: 64, transport: rdma, dhchap_secret: "file:/x"}`, 1),
	} {
		if _, err := Parse("site.yaml", []byte(ok)); err != nil {
			t.Errorf("rdma with a DH-HMAC-CHAP secret: %v", err)
		}
	}
}

// policies.member_slow_write (raid.Policy.SlowWrite): off by default;
// negative or not below member_io_timeout is refused, naming the key,
// the value and what is expected.
func TestMemberSlowWrite(t *testing.T) {
	c, err := Parse("site.yaml", []byte(baseNodes+`arrays: []`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Policies.MemberSlowWrite.D(); got != DefaultMemberSlowWrite {
		t.Errorf("default policies.member_slow_write %s, want %s (off)", got, DefaultMemberSlowWrite)
	}
	c, err = Parse("site.yaml", []byte(baseNodes+"policies: {member_slow_write: 30ms}\narrays: []"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Policies.MemberSlowWrite.D(); got != 30*time.Millisecond {
		t.Errorf("policies.member_slow_write %s, want the 30ms set", got)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"policies: {member_slow_write: -5ms}", `site.yaml: policies.member_slow_write: -5ms; expected a positive duration below member_io_timeout (5s), such as 50ms`},
		{"policies: {member_slow_write: 2s, member_io_timeout: 2s}", `site.yaml: policies.member_slow_write: 2s; expected a positive duration below member_io_timeout (2s), such as 50ms`},
	} {
		got := problems(t, baseNodes+tc.yaml+"\narrays: []")
		if !slices.Equal(got, []string{tc.want}) {
			t.Errorf("%s: problems\n%s\nwant\n%s", tc.yaml, strings.Join(got, "\n"), tc.want)
		}
	}
}
