package api_test

import (
	"reflect"
	"testing"

	"tier0/daemon/api"
	"tier0/daemon/store"
)

// TestEventIsDefinedOnce: the event log's entry is one type: the store
// writes it, the API serves it and the CLI reads it as the same Go type
// (cluster.LogEntry), so a field added to one cannot be missing from the
// other.
func TestEventIsDefinedOnce(t *testing.T) {
	a, s := reflect.TypeFor[api.Event](), reflect.TypeFor[store.Event]()
	if a != s {
		t.Errorf("api.Event is %v and store.Event is %v: want one type (both aliases of cluster.LogEntry)", a, s)
	}
}
