package node

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/config"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/rdma"
)

func rdmaSite(t *testing.T, fabric string) *config.Config {
	t.Helper()
	cfg := restoreSite(t)
	switch fabric {
	case "backend":
		cfg.Fabrics.Backend.Transport = config.TransportRDMA
	case "frontend":
		cfg.Fabrics.Frontend.Transport = config.TransportRDMA
	}
	return cfg
}

// TestRDMATransportNeedsTheTag: a site with transport rdma starts only in
// a binary built with -tags rdma; without it New refuses, naming the
// fabric, the tag and the packages, before anything is opened.
func TestRDMATransportNeedsTheTag(t *testing.T) {
	for _, fabric := range []string{"backend", "frontend"} {
		_, err := New(Options{Config: rdmaSite(t, fabric), Name: "A"})
		if rdma.Built {
			if err != nil {
				t.Errorf("%s rdma in a binary with RDMA: %v", fabric, err)
			}
			continue
		}
		for _, want := range []string{"fabrics." + fabric + ".transport is rdma", "-tags rdma", "libibverbs-dev", "transport: tcp"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s rdma without the tag: error %v, want it to say %q", fabric, err, want)
			}
		}
	}
	if _, err := New(Options{Config: restoreSite(t), Name: "A"}); err != nil {
		t.Errorf("tcp site: %v", err)
	}
}

// TestRDMAMemberErrorsForRAID: the RAID layer's Unreachable (a member
// that is missing, resynced when it returns, not failed) covers a lost
// RDMA queue as it covers a lost TCP connection; an NVMe status from the
// drive, or a fence, over RDMA is not unreachable.
func TestRDMAMemberErrorsForRAID(t *testing.T) {
	cfg := rdmaSite(t, "backend")
	n := &Node{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	p := n.raidPolicy(&served{n: n, cfg: &cfg.Arrays[0]})
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("rdma: write: queue 1: %w: %w: DISCONNECTED", rdma.ErrQueueLost, blockdev.ErrIO), true},
		{fmt.Errorf("rdma: read: queue 1: %w", &rdma.StatusError{Opcode: nvme.CmdRead, Status: nvme.StatusANAInaccessible}), true},
		{fmt.Errorf("rdma: read: queue 1: %w", &rdma.StatusError{Opcode: nvme.CmdRead, Status: nvme.StatusInternal}), false},
		{fmt.Errorf("rdma: write: queue 1: %w", &rdma.StatusError{Opcode: nvme.CmdWrite, Status: nvme.StatusReservationConflict}), false},
		{fmt.Errorf("tcp: %w", &host.StatusError{Op: "read", Status: nvme.StatusANAInaccessible}), true},
	} {
		if got := p.Unreachable(tc.err); got != tc.want {
			t.Errorf("Unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
