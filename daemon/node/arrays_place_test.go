package node

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"tier0/daemon/config"
	"tier0/daemon/store"
)

// placeSite has five nodes in three racks (A B, C D, E) with two drives
// each; site array x (home A) uses B1 C1 E1.
func placeSite(t *testing.T, domains string) *config.Config {
	t.Helper()
	var b strings.Builder
	b.WriteString("cluster: t\nworkdir: /tmp/unused\nnodes:\n")
	racks := map[string]string{"A": "r1", "B": "r1", "C": "r2", "D": "r2", "E": "r3"}
	for i, n := range []string{"A", "B", "C", "D", "E"} {
		p := 20 + 3*i
		b.WriteString("  - {name: " + n + ", domain: " + racks[n] + ", address: 127.0.0.1, backend: {port: " + itoa(p) + "}, frontend: {port: " + itoa(p+1) + "}, api: {port: " + itoa(p+2) +
			"}, drives: [{name: " + n + "1, path: /dev/null, size: 8MiB}, {name: " + n + "2, path: /dev/null, size: 8MiB}]}\n")
	}
	b.WriteString("control_plane:\n  etcd: {peers: [A], client_port: 10, peer_port: 11}\n")
	if domains != "" {
		b.WriteString("placement: {domains: " + domains + "}\n")
	}
	b.WriteString("arrays: [{name: x, level: raid5, chunk_kib: 16, home: A, members: [B1, C1, E1]}]\n")
	cfg, err := config.Parse("site.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("test site: %v", err)
	}
	return cfg
}

func itoa(i int) string { return strconv.Itoa(i) }

// placeOnline takes only drives no array uses, never on the home, on
// distinct nodes; a deleting array's drive is free once its node wiped it
// and taken until then (its node was down during the delete).
func TestPlaceOnlineFreeDrivesOnly(t *testing.T) {
	cfg := placeSite(t, "")
	a, err := placeOnline(cfg, nil, onlineRequest{Name: "p", Level: "raid5", Members: 4, Home: "E"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, d := range a.Members {
		nd, _, _ := cfg.Drive(d)
		if slices.Contains([]string{"B1", "C1", "E1"}, d) || nd.Name == "E" || nodes[nd.Name] {
			t.Fatalf("members %v: want free drives (not B1 C1 E1) of distinct nodes other than home E", a.Members)
		}
		nodes[nd.Name] = true
	}
	if a.ChunkKiB != config.DefaultChunkKiB || a.Level != "raid5" {
		t.Fatalf("placed %+v, want the default chunk %d and raid5", a, config.DefaultChunkKiB)
	}
	// p took B2 and C2, B's and C's only free drives: four more members
	// off E cannot be placed
	if !slices.Contains(a.Members, "B2") || !slices.Contains(a.Members, "C2") {
		t.Fatalf("members %v: want B2 and C2 (B's and C's only free drives) among four members off E", a.Members)
	}
	online := []store.DesiredArray{a}
	_, err = placeOnline(cfg, online, onlineRequest{Name: "q", Level: "raid5", Members: 4, Home: "E"})
	if err == nil || !strings.Contains(err.Error(), "free drive(s) off the home node") {
		t.Fatalf("placing 4 members beside p: %v, want a refusal that counts the free drives", err)
	}
	// p deleting: its drives are free once their node wiped them; B (down
	// during the delete) has not, so B2 stays taken and is named
	del := a
	del.Phase = store.ArrayDeleting
	del.Stopped, del.Wiped = []string{"A", "C", "D", "E"}, []string{"A", "C", "D", "E"}
	// (C's only free drive is C2, p's and wiped: q needs it)
	q, err := placeOnline(cfg, []store.DesiredArray{del}, onlineRequest{Name: "q", Level: "raid5", Members: 4, Home: "B"})
	if err != nil || !slices.Contains(q.Members, "C2") {
		t.Fatalf("placing q (4 members off B) on the wiped drives of a deleting p: %v %v, want C2 among them", q.Members, err)
	}
	_, err = placeOnline(cfg, []store.DesiredArray{del}, onlineRequest{Name: "r", Level: "raid5", Members: 4, Home: "E"})
	if err == nil || !strings.Contains(err.Error(), "B2 (array p being deleted)") {
		t.Fatalf("placing 4 members off E with B2 unwiped: %v, want a refusal naming B2", err)
	}
	del.Wiped = append(del.Wiped, "B")
	if r, err := placeOnline(cfg, []store.DesiredArray{del}, onlineRequest{Name: "r", Level: "raid5", Members: 4, Home: "E"}); err != nil || !slices.Contains(r.Members, "B2") {
		t.Fatalf("placing 4 members off E once B wiped B2: %+v %v, want B2 among them", r.Members, err)
	}
	if _, err := placeOnline(cfg, []store.DesiredArray{del}, onlineRequest{Name: "p", Level: "raid5", Members: 3}); err == nil || !strings.Contains(err.Error(), "still being deleted") {
		t.Fatalf("the name of a deleting array: %v, want a refusal saying it is still being deleted", err)
	}
}

// placeOnline's refusals name the value and what is expected.
func TestPlaceOnlineRefusals(t *testing.T) {
	cfg := placeSite(t, "")
	active := []store.DesiredArray{{Name: "p", Phase: store.ArrayActive, Home: "B", Members: []string{"A2", "C2", "D2"}}}
	for _, c := range []struct {
		req  onlineRequest
		want string
	}{
		{onlineRequest{Name: "x", Level: "raid5", Members: 3}, "taken by the site file's arrays"},
		{onlineRequest{Name: "p", Level: "raid5", Members: 3}, "`tier0 array delete p` first"},
		{onlineRequest{Name: "q", Level: "raid1", Members: 3}, `--level "raid1": want raid5 or raid6`},
		{onlineRequest{Name: "q", Level: "raid6", Members: 3}, "raid6 needs at least 4 members"},
		{onlineRequest{Name: "q", Level: "raid5", Members: 3, ChunkKiB: 48}, "--chunk-kib 48: want a power of two"},
		{onlineRequest{Name: "q", Level: "raid5", Members: 3, Home: "Z"}, `--home "Z" is not a node of the site; the nodes are A, B, C, D, E`},
		{onlineRequest{Name: "a/b", Level: "raid5", Members: 3}, "without '/'"},
	} {
		_, err := placeOnline(cfg, active, c.req)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("placeOnline(%+v): %v, want an error containing %q", c.req, err, c.want)
		}
	}
}

// With placement.domains distinct, members sit in distinct racks, and a
// request needing more racks than there are is refused.
func TestPlaceOnlineDomains(t *testing.T) {
	cfg := placeSite(t, "distinct")
	a, err := placeOnline(cfg, nil, onlineRequest{Name: "p", Level: "raid5", Members: 3, Home: "A"})
	if err != nil {
		t.Fatal(err)
	}
	racks := map[string]bool{}
	for _, d := range a.Members {
		nd, _, _ := cfg.Drive(d)
		if racks[nd.Domain] {
			t.Fatalf("members %v share rack %s with domains: distinct", a.Members, nd.Domain)
		}
		racks[nd.Domain] = true
	}
	if _, err := placeOnline(cfg, nil, onlineRequest{Name: "q", Level: "raid5", Members: 4, Home: "A"}); err == nil || !strings.Contains(err.Error(), `domains "distinct"`) {
		t.Fatalf("4 members over 3 racks with domains: distinct: %v, want a refusal naming the domains rule", err)
	}
}
