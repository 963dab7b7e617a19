package store

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWatchPrefix: the one watch loop sends every accepted event in
// order, from the revision asked; LastOnly sends one value per watch
// response (a transaction of three puts is one), Exact leaves out the
// keys the name is a prefix of, and the channel closes when ctx ends.
func TestWatchPrefix(t *testing.T) {
	stores, _, _ := openCluster(t, 1)
	ctx := ctxT(t)
	cli := stores[0].Client()
	put := func(k, v string) int64 {
		t.Helper()
		r, err := cli.Put(ctx, k, v)
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	first := put("/w/a", "1")
	put("/w/b", "2")
	if _, err := cli.Delete(ctx, "/w/a"); err != nil {
		t.Fatal(err)
	}
	put("/w/a1", "3")
	put("/x/a", "other prefix")

	wctx, cancel := context.WithCancel(ctx)
	all := WatchPrefix(wctx, cli, "/w/", WatchOptions{Rev: first}, Puts)
	for _, want := range []KV{{"/w/a", []byte("1")}, {"/w/b", []byte("2")}, {"/w/a1", []byte("3")}} {
		got := <-all
		if got.Key != want.Key || string(got.Value) != string(want.Value) {
			t.Fatalf("watched %s=%q, want %s=%q", got.Key, got.Value, want.Key, want.Value)
		}
	}
	exact := WatchPrefix(wctx, cli, "/w/a", WatchOptions{Rev: first, Exact: true}, Puts)
	if got := <-exact; got.Key != "/w/a" {
		t.Fatalf("exact watch of /w/a saw %s first", got.Key)
	}
	last := WatchPrefix(wctx, cli, "/t/", WatchOptions{LastOnly: true, Buffer: 1}, func(ev *clientv3.Event) (int64, bool) {
		return ev.Kv.ModRevision, true
	})
	txn, err := cli.Txn(ctx).Then(clientv3.OpPut("/t/1", "x"), clientv3.OpPut("/t/2", "x"), clientv3.OpPut("/t/3", "x")).Commit()
	if err != nil {
		t.Fatal(err)
	}
	solo := put("/t/4", "x")
	if got := <-last; got != txn.Header.Revision {
		t.Fatalf("LastOnly sent revision %d for a three-put transaction at %d", got, txn.Header.Revision)
	}
	if got := <-last; got != solo {
		t.Fatalf("LastOnly sent revision %d after the transaction, want the next put's %d", got, solo)
	}
	put("/w/a1", "after exact")
	again := put("/w/a", "again")
	if got := <-exact; got.Key != "/w/a" || string(got.Value) != "again" {
		t.Fatalf("exact watch of /w/a saw %s=%q, want /w/a=\"again\" (revision %d)", got.Key, got.Value, again)
	}
	cancel()
	for range all {
	}
	for range last {
	}
}
