// Package rdma holds tier0's NVMe over RDMA acceptance test inside the
// Linux test guest (package tier0/test/vm): the guest's soft-RoCE device
// (rdma_rxe on its NIC) carries the kernel's nvmet-rdma target, tier0's
// NVMe/RDMA host (daemon/rdma, built with -tags rdma as rdmaguest and run
// inside the guest with the guest image's rdma-core libraries), tier0's own
// RDMA listener, and the kernel's nvme-rdma host as a sanity check of the
// guest setup. See docs/RDMA.md.
package rdma

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/internal/testenv"
	"tier0/test/vm"
)

const nqn = "nqn.2026-12.io.tier0.test:rdma-nvmet"

// guestScript sets up soft-RoCE and nvmet-rdma in the guest and runs the
// checks; every check prints a PASS/FAIL line, the first failure exits.
const guestScript = `
set -u
fail() { echo "FAIL: $*"; dmesg | grep -iE 'rdma|rxe|nvme' | tail -30; exit 1; }
for f in /usr/lib/x86_64-linux-gnu/libibverbs.so.1 /usr/lib/x86_64-linux-gnu/librdmacm.so.1 /etc/libibverbs.d/rxe.driver; do
    [ -e "$f" ] || fail "guest image lacks $f: install scripts/deps.d/rdma.sh on the build machine and rebuild the image"
done
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || fail "guest image lacks the rxe provider"
command -v rdma >/dev/null || fail "guest image lacks iproute2's rdma tool"
modprobe ib_uverbs || fail ib_uverbs
modprobe rdma_ucm || fail rdma_ucm
# rdma-core present, no device yet: the precise error
/harness/rdmaguest -mode nodevice || fail "no-device message"
modprobe crc32_generic || fail "crc32_generic (rdma_rxe computes the RoCEv2 ICRC with crypto crc32)"
modprobe rdma_rxe || fail rdma_rxe
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 type rxe netdev eth0"
rdma link show
ibv_devinfo -d rxe0 | grep -E 'hca_id|state|link_layer' || fail ibv_devinfo
modprobe nvmet || fail nvmet
modprobe nvmet-rdma || fail nvmet-rdma
modprobe brd rd_nr=1 rd_size=65536 || fail brd
grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config
C=/sys/kernel/config/nvmet
NQN=` + nqn + `
mkdir $C/subsystems/$NQN
echo 1 > $C/subsystems/$NQN/attr_allow_any_host
mkdir $C/subsystems/$NQN/namespaces/1
echo /dev/ram0 > $C/subsystems/$NQN/namespaces/1/device_path
echo 1 > $C/subsystems/$NQN/namespaces/1/enable || fail "ns enable"
mkdir $C/ports/1
echo rdma > $C/ports/1/addr_trtype
echo ipv4 > $C/ports/1/addr_adrfam
echo 10.0.2.15 > $C/ports/1/addr_traddr
echo 4420 > $C/ports/1/addr_trsvcid
ln -s $C/subsystems/$NQN $C/ports/1/subsystems/$NQN || fail "nvmet rdma port"
echo "nvmet-rdma ready on 10.0.2.15:4420"
# the kernel's own host first: proves the guest's soft-RoCE + nvmet-rdma
modprobe nvme-rdma || fail nvme-rdma
nvme connect -t rdma -a 10.0.2.15 -s 4420 -n $NQN || fail "nvme connect -t rdma"
dev=
for i in $(seq 1 100); do
    for b in /sys/block/nvme*; do
        [ -e "$b" ] || continue
        [ "$(cat $b/device/subsysnqn 2>/dev/null || cat $b/device/../subsysnqn 2>/dev/null)" = $NQN ] && dev=/dev/$(basename $b)
    done
    [ -n "$dev" ] && break
    sleep 0.1
done
[ -n "$dev" ] || { ls /sys/block; fail "no nvme block device after nvme connect"; }
dd if=/dev/urandom of=/tmp/k bs=64k count=4 2>/dev/null
dd if=/tmp/k of=$dev bs=64k seek=100 oflag=direct 2>/dev/null || fail "kernel host write"
dd if=$dev of=/tmp/k2 bs=64k skip=100 count=4 iflag=direct 2>/dev/null || fail "kernel host read"
cmp /tmp/k /tmp/k2 || fail "kernel host read back different data"
echo "PASS kernel nvme-rdma host: $dev, 256 KiB written and read back"
nvme disconnect -n $NQN || fail "nvme disconnect"
# tier0's host against nvmet-rdma
/harness/rdmaguest -mode host -addr 10.0.2.15:4420 -nqn $NQN || fail "tier0 NVMe/RDMA host"
# the CLI over RDMA: tier0 fabric io --transport rdma (binary built with -tags rdma)
/harness/tier0 fabric io --transport rdma --connect 10.0.2.15:4420 --nqn $NQN --write --offset 8M --length 8M --block 1M --pattern 7 || fail "tier0 fabric io --transport rdma --write"
/harness/tier0 fabric io --transport rdma --connect 10.0.2.15:4420 --nqn $NQN --verify --offset 8M --length 8M --block 256K --pattern 7 || fail "tier0 fabric io --transport rdma --verify"
echo "PASS tier0 fabric io --transport rdma: 8 MiB written and verified"
# the target's port removed under tier0's host, then re-added
/harness/rdmaguest -mode portloss -addr 10.0.2.15:4420 -nqn $NQN -remove "rm $C/ports/1/subsystems/$NQN" -readd "ln -s $C/subsystems/$NQN $C/ports/1/subsystems/$NQN" || fail "port loss"
# tier0's own listener and the target-side RDMA READ/WRITE
/harness/rdmaguest -mode loopback -addr 10.0.2.15:4430 || fail "tier0 RDMA loopback"
echo "ALL PASS"
`

// TestRDMAGuest: tier0's NVMe/RDMA host against Linux nvmet-rdma over
// soft-RoCE, inside the guest: the no-device error, every I/O size class
// (512 B .. 2 MiB, split at MDTS) written and read back, concurrent I/O,
// Flush, Write Zeroes; tier0's listener with a target's RDMA READ/WRITE;
// the target's port removed under I/O (a transport error, not a timeout)
// and re-added (a new association reads the data back); and the kernel's
// nvme-rdma host against the same port.
func TestRDMAGuest(t *testing.T) {
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if _, err := os.Stat(h); err != nil {
			testenv.Missing(t, "rdma-core headers missing (%s): install scripts/deps.d/rdma.sh (libibverbs-dev librdmacm-dev)", h)
		}
	}
	if _, err := os.Stat("/usr/bin/rdma"); err != nil {
		testenv.Missing(t, "iproute2's rdma tool missing (/usr/bin/rdma): the guest image copies it; install iproute2")
	}
	if why := vm.Available(); why != "" {
		testenv.Missing(t, "Linux test guest unavailable: %s", why)
	}
	root, err := vm.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for name, pkg := range map[string]string{"rdmaguest": "./test/rdma/rdmaguest", "tier0": "./cmd/tier0"} {
		bin := filepath.Join(t.TempDir(), name)
		cmd := exec.Command("go", "build", "-tags", "rdma", "-o", bin, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build -tags rdma %s: %v\n%s", pkg, err, out)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	res := vm.Run(t, vm.Options{Script: guestScript, Files: files, Timeout: 4 * time.Minute})
	var lines []string
	for _, l := range strings.Split(res.Output, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "PASS") || strings.Contains(l, "FAIL") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	t.Logf("guest ran %v:\n%s", res.Wall.Round(time.Second), strings.Join(lines, "\n"))
	if res.RC != 0 || !strings.Contains(res.Output, "ALL PASS") {
		t.Fatalf("guest script exited %d; console tail:\n%s", res.RC, tailStr(res.Output, 6000))
	}
	for _, want := range []string{"PASS no device", "PASS kernel nvme-rdma host", "PASS write+read 1048576 bytes", "PASS host", "PASS RDMA WRITE and READ", "PASS loopback", "PASS tier0 fabric io --transport rdma", "PASS port removed", "PASS port re-added"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
}

func tailStr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
