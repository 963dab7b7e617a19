//go:build rdma && linux && cgo

package rdma

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestNoDevice: built with RDMA support on a machine without an RDMA
// device, connecting and listening fail with ErrNoDevice and a message
// that names what is missing and how to add a soft-RoCE device. (On a
// machine with a device, test/rdma's guest test covers the same check
// before it adds its link.)
func TestNoDevice(t *testing.T) {
	if ents, _ := os.ReadDir("/sys/class/infiniband"); len(ents) > 0 {
		t.Skipf("not applicable: this machine has RDMA devices (%d in /sys/class/infiniband): the no-device check runs in test/rdma's guest instead", len(ents))
	}
	_, err := Connect(context.Background(), "10.0.0.1:4420", Options{SubNQN: "nqn.x"})
	if !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Connect: %v, want ErrNoDevice", err)
	}
	for _, w := range []string{"ibv_get_device_list", "rdma link add rxe0 type rxe netdev eth0"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if _, err := Listen("0.0.0.0:0"); !errors.Is(err, ErrNoDevice) {
		t.Errorf("Listen: %v, want ErrNoDevice", err)
	}
	t.Logf("%v", err)
}
