//go:build !(rdma && linux && cgo)

package rdma

import (
	"context"
	"errors"
	"testing"
)

// TestNotBuilt: without the rdma tag every entry point says how to get
// RDMA support.
func TestNotBuilt(t *testing.T) {
	if _, err := Dial(context.Background(), "10.0.0.1:4420", PrivateData{}, Config{}); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Dial: %v, want ErrNotBuilt", err)
	}
	if _, err := Listen("0.0.0.0:4420"); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Listen: %v, want ErrNotBuilt", err)
	}
	_, err := Connect(context.Background(), "10.0.0.1:4420", Options{SubNQN: "nqn.x"})
	if !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Connect: %v, want ErrNotBuilt", err)
	}
	const want = "tier0 was built without RDMA support (build with -tags rdma and rdma-core's libibverbs-dev/librdmacm-dev)"
	if ErrNotBuilt.Error() != want {
		t.Errorf("message %q, want %q", ErrNotBuilt, want)
	}
}
