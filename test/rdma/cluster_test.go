package rdma

import (
	"os"
	"strings"
	"testing"
	"time"

	"tier0/test/vm"
)

// clusterScript brings up soft-RoCE in the guest and runs rdmaguest's
// cluster mode on the site guest3.yaml (testdata/guest3.yaml).
const clusterScript = guestPrelude + rxeLink + `
modprobe nvme-rdma || fail nvme-rdma
export GOMAXPROCS=1 GOGC=200
/harness/rdmaguest -mode cluster -site /harness/guest3.yaml -tier0d /harness/tier0d -tier0 /harness/tier0 -work /tmp/t0work || fail "the cluster over RDMA through the kill of its owner"
echo "ALL PASS"
`

// TestRDMAClusterFailover: a local cluster in the guest with transport
// rdma on both fabrics (testdata/guest3.yaml: three tier0d on the guest's
// soft-RoCE address, array B RAID-5 2+1 over A1, B1 and C1, owner B, a
// backend DH-HMAC-CHAP secret: every member import authenticates)
// passes the kill-the-owner failover: the Linux nvme-rdma host's
// multipath device (paths to all three frontends) runs fio verify while
// B's tier0d is killed with SIGKILL; a survivor takes B over (degraded:
// B1 went with B), fio finishes the run that spanned the kill and a whole
// run after it without an I/O error and with every block it wrote read
// back and checked; a pattern tier0's own RDMA host wrote through B
// before the kill reads back through the new owner.
func TestRDMAClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest and a three-node cluster under emulation (minutes); not in -short")
	}
	files := guestBinaries(t, map[string]string{"rdmaguest": "./test/rdma/rdmaguest", "tier0": "./cmd/tier0", "tier0d": "./cmd/tier0d"})
	site, err := os.ReadFile("testdata/guest3.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files["guest3.yaml"] = site
	res := vm.Run(t, vm.Options{Script: clusterScript, Files: files, Timeout: 13 * time.Minute, MemMB: 2048})
	t.Logf("guest ran %v:\n%s", res.Wall.Round(time.Second), passLines(res.Output))
	if res.RC != 0 || !strings.Contains(res.Output, "ALL PASS") {
		t.Fatalf("guest script exited %d; console tail:\n%s", res.RC, tailStr(res.Output, 12000))
	}
	for _, want := range []string{"PASS cluster up", "PASS Linux nvme-rdma host: one multipath device", "PASS tier0 fabric io --transport rdma: 8 MiB pattern written",
		"PASS members authenticated over RDMA", "PASS takeover", "PASS fio verify through the kill", "PASS tier0 fabric io --transport rdma: the pattern written", "PASS guest kernel: I/O held"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
}
