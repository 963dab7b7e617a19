package node

import (
	"log/slog"
	"testing"
	"time"

	"tier0/daemon/clock"
	"tier0/daemon/cluster"
	"tier0/daemon/config"
	"tier0/daemon/store"
	"tier0/daemon/store/memstore"
)

// restoreSite is a four-node site with one array owned by A.
func restoreSite(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse("site.yaml", []byte(`cluster: t
workdir: /tmp/unused
nodes:
  - {name: A, address: 127.0.0.1, backend: {port: 1}, frontend: {port: 2}, api: {port: 3}, drives: [{name: A1, path: /dev/null, size: 8MiB}]}
  - {name: B, address: 127.0.0.1, backend: {port: 4}, frontend: {port: 5}, api: {port: 6}, drives: [{name: B1, path: /dev/null, size: 8MiB}]}
  - {name: C, address: 127.0.0.1, backend: {port: 7}, frontend: {port: 8}, api: {port: 9}, drives: [{name: C1, path: /dev/null, size: 8MiB}]}
  - {name: D, address: 127.0.0.1, backend: {port: 12}, frontend: {port: 13}, api: {port: 14}, drives: [{name: D1, path: /dev/null, size: 8MiB}]}
control_plane:
  etcd: {peers: [A], client_port: 10, peer_port: 11}
policies: {lease_ttl: 3s}
arrays: [{name: x, level: raid5, chunk_kib: 16, home: A, members: [B1, C1, D1]}]
`))
	if err != nil {
		t.Fatalf("test site: %v", err)
	}
	return cfg
}

// A coordinator that restores its machine must not take a healthy owner's
// array for unserved because the owner's last "serving" record is older
// than a lease TTL: the restore itself waits a TTL (store.SettledNodes),
// and a frozen etcd member can hold the owner's once-a-second record back.
// When the record names the owner's current registration (same Started,
// same Fences), the process that wrote "serving at epoch E" is the one
// alive now and never fenced since, so it still serves. Found by the
// freeze-etcd-voter campaign: a new coordinator re-fenced the healthy
// owners C, D and E at home under new epochs.
func TestRestoreTrustsServingRecordOfSameRegistration(t *testing.T) {
	cfg := restoreSite(t)
	start := time.Unix(1_000_000, 0)
	clk := clock.NewFake(start)
	ms := memstore.New(clk, "/tier0/t/")
	n := &Node{cfg: cfg, me: &cfg.Nodes[0], log: slog.New(slog.DiscardHandler), st: ms.View("B"), opts: Options{Clock: clk}}
	ctx := t.Context()
	started := start.Add(-time.Hour)
	if _, err := ms.View("A").Register(ctx, store.NodeInfo{Node: "A", Started: started}, time.Hour, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := ms.View("A").ClaimOwnership(ctx, "x", "A", 1); err != nil {
		t.Fatal(err)
	}
	// as A's publisher writes it: serving at epoch 1, by A's registration
	rec := map[string]any{"owner": "A", "epoch": 1, "serving": true, "time": clk.Now(),
		"started": started.UnixNano(), "fences": 0}
	if _, err := ms.View("A").Put(ctx, store.Observed, "arrays", "x", rec); err != nil {
		t.Fatal(err)
	}
	clk.Advance(7 * time.Second) // > max(3 s, TTL): the record is "old"
	serving := func(alive map[string]store.NodeInfo) bool {
		t.Helper()
		evs, err := n.restoreEvents(ctx, alive)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if o, ok := ev.(cluster.ArrayObserved); ok && o.Array == "x" {
				return o.Serving
			}
		}
		t.Fatal("no ArrayObserved for x")
		return false
	}
	if !serving(map[string]store.NodeInfo{"A": {Node: "A", Started: started}, "B": {Node: "B"}, "C": {Node: "C"}, "D": {Node: "D"}}) {
		t.Fatalf("A's record (serving at epoch 1, written 7s ago by the registration that is alive now) restored as not serving: the coordinator would re-fence a healthy owner")
	}
	// The same record after A fenced itself (more Fences) or restarted (a
	// new Started) says nothing about now.
	if serving(map[string]store.NodeInfo{"A": {Node: "A", Started: started, Fences: 1}, "B": {Node: "B"}, "C": {Node: "C"}, "D": {Node: "D"}}) {
		t.Fatalf("a record written before A fenced itself restored as serving")
	}
	if serving(map[string]store.NodeInfo{"A": {Node: "A", Started: started.Add(time.Minute)}, "B": {Node: "B"}, "C": {Node: "C"}, "D": {Node: "D"}}) {
		t.Fatalf("a record of A's previous process restored as serving")
	}
	// A record far older than the owners' publishing (30 s) is never trusted.
	clk.Advance(time.Minute)
	if serving(map[string]store.NodeInfo{"A": {Node: "A", Started: started}, "B": {Node: "B"}, "C": {Node: "C"}, "D": {Node: "D"}}) {
		t.Fatalf("a record a minute old restored as serving")
	}
}

// A restored machine learns whether the owner of record claimed its epoch
// under the registration alive now (ArrayObserved.Claimed): then the
// takeover the previous coordinator ordered may still be under way, and
// the machine resumes it at that epoch. A claim older than the owner's
// registration (it fenced itself or restarted since) is not resumed.
func TestRestoreSaysClaimedUnderLiveRegistration(t *testing.T) {
	cfg := restoreSite(t)
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	ms := memstore.New(clk, "/tier0/t/")
	n := &Node{cfg: cfg, me: &cfg.Nodes[1], log: slog.New(slog.DiscardHandler), st: ms.View("B"), opts: Options{Clock: clk}}
	ctx := t.Context()
	register := func() {
		t.Helper()
		if _, err := ms.View("A").Register(ctx, store.NodeInfo{Node: "A", Started: clk.Now()}, time.Hour, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	claimed := func() bool {
		t.Helper()
		alive, err := n.st.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := n.restoreEvents(ctx, alive)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if o, ok := ev.(cluster.ArrayObserved); ok && o.Array == "x" {
				if o.Serving {
					t.Fatal("x restored as serving without a serving record")
				}
				return o.Claimed
			}
		}
		t.Fatal("no ArrayObserved for x")
		return false
	}
	register()
	if _, err := ms.View("A").ClaimOwnership(ctx, "x", "A", 1); err != nil {
		t.Fatal(err)
	}
	if !claimed() {
		t.Fatal("A claimed x at epoch 1 under its live registration, restored as not claimed: the machine would take x again under epoch 2")
	}
	register() // A registers again (it fenced itself) after the claim
	if claimed() {
		t.Fatal("a claim older than A's registration restored as claimed")
	}
}
