package main

import (
	"strings"
	"testing"

	"tier0/daemon/rdma"
)

// TestFabricIOTransportRDMA: fabric io --transport rdma reaches the NVMe/RDMA
// host: without the rdma build tag it says how to build one; with it on a
// machine without an RDMA device it names what is missing. (test/rdma runs
// the same host against Linux nvmet-rdma in the guest.) An unknown
// transport is refused with the valid values.
func TestFabricIOTransportRDMA(t *testing.T) {
	_, stderr, code := runCLI(t, nil, "fabric", "io", "--transport", "rdma", "--connect", "10.0.0.1:4420", "--nqn", "nqn.x", "--read", "--timeout", "5s")
	want := rdma.ErrNotBuilt.Error()
	if rdma.Built {
		want = "no RDMA device"
	}
	if code != 1 || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, stderr %q; want exit 1 and %q", code, stderr, want)
	}
	_, stderr, code = runCLI(t, nil, "fabric", "io", "--transport", "ib", "--connect", "10.0.0.1:4420", "--nqn", "nqn.x", "--read")
	if code != 1 || !strings.Contains(stderr, `--transport "ib"`) || !strings.Contains(stderr, "tcp or rdma") {
		t.Fatalf("exit %d, stderr %q; want exit 1 naming the value and tcp or rdma", code, stderr)
	}
}
