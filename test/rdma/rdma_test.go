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

// guestPrelude is the start of every guest script here: fail (print
// the reason and the kernel's RDMA/NVMe messages, exit 1) and the checks
// that the image carries rdma-core, then the verbs modules.
const guestPrelude = `
set -u
fail() { echo "FAIL: $*"; dmesg | grep -iE 'rdma|rxe|nvme' | tail -30; exit 1; }
for f in /usr/lib/x86_64-linux-gnu/libibverbs.so.1 /usr/lib/x86_64-linux-gnu/librdmacm.so.1 /etc/libibverbs.d/rxe.driver; do
    [ -e "$f" ] || fail "guest image lacks $f: install scripts/deps.d/rdma.sh on the build machine and rebuild the image"
done
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || fail "guest image lacks the rxe provider"
command -v rdma >/dev/null || fail "guest image lacks iproute2's rdma tool"
modprobe ib_uverbs || fail ib_uverbs
modprobe rdma_ucm || fail rdma_ucm
`

// rxeLink loads soft-RoCE and adds its device rxe0 on the guest's NIC
// (10.0.2.15).
const rxeLink = `
modprobe crc32_generic || fail "crc32_generic (rdma_rxe computes the RoCEv2 ICRC with crypto crc32)"
modprobe rdma_rxe || fail rdma_rxe
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 type rxe netdev eth0"
rdma link show
ibv_devinfo -d rxe0 | grep -E 'hca_id|state|link_layer' || fail ibv_devinfo
`

// guestScript sets up soft-RoCE and nvmet-rdma in the guest and runs the
// checks; every check prints a PASS/FAIL line, the first failure exits.
const guestScript = guestPrelude + `
# rdma-core present, no device yet: the precise error
/harness/rdmaguest -mode nodevice || fail "no-device message"
` + rxeLink + `
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
        # the namespace's node and capacity come after its sysfs entry
        [ "$(cat $b/device/subsysnqn 2>/dev/null || cat $b/device/../subsysnqn 2>/dev/null)" = $NQN ] &&
            [ -b /dev/$(basename $b) ] && [ "$(cat $b/size 2>/dev/null || echo 0)" -gt 0 ] && dev=/dev/$(basename $b)
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
# One retry of a run whose association could not be set up: nvmet-rdma
# releases the last association's queues asynchronously, and under TCG a
# connect right after it was seen refused ("nvmet_rdma: failed to connect
# queue 1") with the reject lost on soft-RoCE (CI, "no RDMA CM event");
# a host retries a connect, as Linux's does after reconnect_delay. I/O
# errors are never retried.
t0io() {
    /harness/tier0 fabric io --transport rdma --connect 10.0.2.15:4420 --nqn $NQN "$@" > /tmp/t0io.log 2>&1 && { cat /tmp/t0io.log; return 0; }
    cat /tmp/t0io.log
    grep -q "connecting to 10.0.2.15:4420" /tmp/t0io.log || return 1
    echo "RETRY tier0 fabric io $*: its association could not be set up; again in 2 s"
    sleep 2
    /harness/tier0 fabric io --transport rdma --connect 10.0.2.15:4420 --nqn $NQN "$@"
}
t0io --write --offset 8M --length 8M --block 1M --pattern 7 || fail "tier0 fabric io --transport rdma --write"
t0io --verify --offset 8M --length 8M --block 256K --pattern 7 || fail "tier0 fabric io --transport rdma --verify"
echo "PASS tier0 fabric io --transport rdma: 8 MiB written and verified"
# the target's port removed under tier0's host, then re-added
/harness/rdmaguest -mode portloss -addr 10.0.2.15:4420 -nqn $NQN -remove "rm $C/ports/1/subsystems/$NQN" -readd "ln -s $C/subsystems/$NQN $C/ports/1/subsystems/$NQN" || fail "port loss"
# daemon/host over NVMe/RDMA: keep-alive, then the port removed and re-added: it reconnects by itself
/harness/rdmaguest -mode reconnect -addr 10.0.2.15:4420 -nqn $NQN -remove "rm $C/ports/1/subsystems/$NQN" -readd "ln -s $C/subsystems/$NQN $C/ports/1/subsystems/$NQN" || fail "host reconnect over RDMA"
# DH-HMAC-CHAP over NVMe/RDMA: daemon/host against tier0's target (the guest kernel's nvmet has no auth)
/harness/rdmaguest -mode auth -addr 10.0.2.15:4424 -nqn nqn.2026-12.io.tier0.test:rdma-auth || fail "DH-HMAC-CHAP over RDMA"
# tier0's own listener and the target-side RDMA READ/WRITE
/harness/rdmaguest -mode loopback -addr 10.0.2.15:4430 || fail "tier0 RDMA loopback"
# tier0's NVMe/RDMA target, Linux's nvme-rdma host
find_dev() {  # $1 = NQN: the one block device of that subsystem
    dev=
    for i in $(seq 1 100); do
        for b in /sys/block/nvme*; do
            [ -e "$b" ] || continue
            # not a path's hidden device (nvme0c0n1, which cannot be
            # opened) that shows up before the multipath head (nvme0n1)
            case $(basename $b) in nvme*c*n*) continue ;; esac
            [ "$(cat $b/device/subsysnqn 2>/dev/null || cat $b/device/../subsysnqn 2>/dev/null)" = $1 ] && dev=/dev/$(basename $b)
        done
        [ -n "$dev" ] && return 0
        sleep 0.1
    done
    return 1
}
fio_verify() {  # $1 = device, $2 = size
    fio --name=rand4k --filename=$1 --size=$2 --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=0 --output-format=terse --terse-version=3 > /tmp/f1 || return 1
    fio --name=seq1m --filename=$1 --size=$2 --rw=write --bs=1M --iodepth=4 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse --terse-version=3 > /tmp/f2 || return 1
    awk -F';' '{print "fio " $3 ": read " $7 " KiB/s, write " $48 " KiB/s, errors " $5}' /tmp/f1 /tmp/f2
}
wait_file() { n=0; while [ ! -e $1 ] && [ $n -lt 200 ]; do sleep 0.1; n=$((n+1)); done; [ -e $1 ]; }
T0NQN=nqn.2026-12.io.tier0.test:rdma-target
/harness/tier0 fabric serve --transport rdma --listen 10.0.2.15:4421 --nqn $T0NQN --ns mem:64M > /tmp/serve.log 2>&1 &
SERVE=$!
n=0; until grep -q serving /tmp/serve.log 2>/dev/null || [ $n -ge 600 ]; do sleep 0.1; n=$((n+1)); done
grep -q "serving $T0NQN on 10.0.2.15:4421 over NVMe/RDMA" /tmp/serve.log || { cat /tmp/serve.log; ps; fail "tier0 fabric serve --transport rdma (waited $n tenths of a second)"; }
echo "tier0 fabric serve --transport rdma up after $n tenths of a second"
nvme discover -t rdma -a 10.0.2.15 -s 4421 > /tmp/disc 2>&1 || { cat /tmp/disc /tmp/serve.log; fail "nvme discover -t rdma against tier0"; }
grep -q "trtype: *rdma" /tmp/disc && grep -q "subnqn: *$T0NQN" /tmp/disc && grep -q "traddr: *10.0.2.15" /tmp/disc || { cat /tmp/disc; fail "tier0's discovery log over RDMA"; }
echo "PASS tier0 target: nvme discover -t rdma lists $T0NQN, trtype rdma, traddr 10.0.2.15"
nvme connect -t rdma -a 10.0.2.15 -s 4421 -n $T0NQN || { cat /tmp/serve.log; fail "nvme connect -t rdma to tier0"; }
find_dev $T0NQN || { ls /sys/block; cat /tmp/serve.log; fail "no block device after nvme connect -t rdma to tier0"; }
fio_verify $dev 8M || { cat /tmp/f1 /tmp/f2 /tmp/serve.log; fail "fio verify over tier0's NVMe/RDMA target"; }
echo "PASS tier0 target: fio verify 4 KiB random and 1 MiB sequential over nvme-rdma ($dev)"
dmesg | grep -E "nvme|rdma|rxe" | grep -v requeuing | tail -n 15
grep -E "level=(WARN|ERROR)" /tmp/serve.log | head -n 10
nvme disconnect -n $T0NQN || fail "nvme disconnect from tier0"
kill $SERVE; wait $SERVE
# two tier0 RDMA targets of one subsystem: one multipath device, ANA flips under fio
MPNQN=nqn.2026-12.io.tier0.test:rdma-multipath
/harness/rdmaguest -mode targets -addr 10.0.2.15:4422,10.0.2.15:4423 -nqn $MPNQN -ready /tmp/mp.ready > /tmp/mp.log 2>&1 &
MP=$!
wait_file /tmp/mp.ready || { cat /tmp/mp.log; fail "rdmaguest -mode targets"; }
nvme connect -t rdma -a 10.0.2.15 -s 4422 -n $MPNQN && nvme connect -t rdma -a 10.0.2.15 -s 4423 -n $MPNQN || { cat /tmp/mp.log; fail "nvme connect to both tier0 RDMA targets"; }
find_dev $MPNQN || fail "no block device for $MPNQN"
ndev=$(for b in /sys/block/nvme*n*; do case $(basename $b) in nvme*c*n*) continue;; esac; cat $b/device/subsysnqn 2>/dev/null || cat $b/device/../subsysnqn 2>/dev/null; done | grep -c "^$MPNQN$")
[ "$ndev" = 1 ] || { ls /sys/block; fail "$ndev block devices for $MPNQN: the kernel did not merge the two RDMA paths into one multipath device"; }
ana() { for p in /sys/class/nvme/nvme*/nvme*c*n1; do grep -q "trsvcid=$1" $(dirname $p)/address 2>/dev/null && cat $p/ana_state; done; }
wait_ana() { n=0; while { [ "$(ana 4422)" != $1 ] || [ "$(ana 4423)" != $2 ]; } && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
    [ "$(ana 4422)" = $1 ] && [ "$(ana 4423)" = $2 ] || fail "ana_state 4422 $(ana 4422) 4423 $(ana 4423), want $1 $2"; }
wait_ana optimized inaccessible
echo "PASS tier0 targets: one multipath device $dev over two RDMA paths (optimized, inaccessible)"
( rc=0; n=0; while [ ! -e /tmp/stopfio ] || [ $n -eq 0 ]; do fio_verify $dev 4M > /dev/null || { rc=1; break; }; n=$((n+1)); done
  echo "runs $n"; echo $rc > /tmp/fio-bg.rc ) > /tmp/fio-bg.log 2>&1 &
sleep 1
for i in 1 2; do
    kill -USR1 $MP; wait_ana inaccessible optimized; sleep 1
    kill -USR1 $MP; wait_ana optimized inaccessible; sleep 1
done
touch /tmp/stopfio
wait_file /tmp/fio-bg.rc
n=0; while [ ! -s /tmp/fio-bg.rc ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done
[ "$(cat /tmp/fio-bg.rc)" = 0 ] || { cat /tmp/fio-bg.log /tmp/f1 /tmp/f2 /tmp/mp.log; dmesg | tail -20; fail "fio verify during ANA flips over tier0's RDMA targets"; }
echo "PASS tier0 targets: fio verify during 4 ANA flips, no I/O error ($(cat /tmp/fio-bg.log))"
nvme disconnect -n $MPNQN
kill $MP; wait $MP
echo "ALL PASS"
`

// TestRDMAGuest: tier0's NVMe/RDMA host against Linux nvmet-rdma over
// soft-RoCE, inside the guest: the no-device error, every I/O size class
// (512 B .. 2 MiB, split at MDTS) written and read back, concurrent I/O,
// Flush, Write Zeroes; tier0's listener with a target's RDMA READ/WRITE;
// the target's port removed under I/O (a transport error, not a timeout)
// and re-added (a new association reads the data back); daemon/host over
// rdma.Transport kept up by its keep-alive, then reconnecting by itself
// when the port returns; DH-HMAC-CHAP over RDMA between daemon/host and
// tier0's target; and the kernel's
// nvme-rdma host against the same port.
func TestRDMAGuest(t *testing.T) {
	files := guestBinaries(t, map[string]string{"rdmaguest": "./test/rdma/rdmaguest", "tier0": "./cmd/tier0"})
	res := vm.Run(t, vm.Options{Script: guestScript, Files: files, Timeout: 7 * time.Minute})
	t.Logf("guest ran %v:\n%s", res.Wall.Round(time.Second), passLines(res.Output))
	if res.RC != 0 || !strings.Contains(res.Output, "ALL PASS") {
		t.Fatalf("guest script exited %d; console tail:\n%s", res.RC, tailStr(res.Output, 6000))
	}
	for _, want := range []string{"PASS no device", "PASS kernel nvme-rdma host", "PASS write+read 1048576 bytes", "PASS host", "PASS RDMA WRITE and READ", "PASS loopback", "PASS tier0 fabric io --transport rdma", "PASS port removed", "PASS port re-added", "PASS host keep-alive over RDMA", "PASS host writes to nvmet-rdma in the capsule", "PASS host reconnected by itself over RDMA", "PASS DH-HMAC-CHAP over RDMA: a wrong host secret", "PASS DH-HMAC-CHAP over RDMA: bidirectional", "PASS DH-HMAC-CHAP over RDMA: the host reconnected",
		"PASS tier0 target: nvme discover", "PASS tier0 target: fio verify", "PASS tier0 targets: one multipath device", "PASS tier0 targets: fio verify during 4 ANA flips"} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
}

// guestBinaries checks what a guest run over soft-RoCE needs (skipping,
// or failing in CI, where it is missing) and builds the named packages
// with -tags rdma for the guest, as files for vm.Options.Files.
func guestBinaries(t *testing.T, pkgs map[string]string) map[string][]byte {
	t.Helper()
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
	for name, pkg := range pkgs {
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
	return files
}

// passLines are the PASS and FAIL lines of a guest's output.
func passLines(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "PASS") || strings.Contains(l, "FAIL") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n")
}

func tailStr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
