package store

import (
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tier0/daemon/clock"
)

// table is what the store's desired-state tables (Volumes, DesiredArrays,
// Reservations) share: the client's KV and Watcher, the cluster's key
// prefix (ending in "/") and the clock that stamps their records.
type table struct {
	kv     clientv3.KV
	w      clientv3.Watcher
	prefix string
	clk    clock.Clock
}

// newTable works on cli's keys under prefix (e.g. "/tier0/<cluster>/"); a
// nil clk is the wall clock.
func newTable(cli *clientv3.Client, prefix string, clk clock.Clock) table {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return table{kv: cli.KV, w: cli.Watcher, prefix: prefix, clk: clock.Or(clk)}
}
