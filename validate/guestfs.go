package validate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"tier0/bench"
	"tier0/daemon/api"
)

// FSGuestLib is the guest shell (busybox ash) of the file system through
// a failover, shared by this check and test/cluster's
// TestXFSThroughFailover. A round (xfs_round N) is fio verify on files of
// the mounted file system (4 KiB random direct writes, each block read
// back and checked with crc32c), then four buffered files of random data
// written, synced, their md5 sums recorded, the page cache dropped and the
// files re-read from the device against the sums; check_sums re-reads
// every round's files; xfs_errors prints the kernel's XFS error lines.
const FSGuestLib = `MNT=/mnt/t0
wait_dev() { n=0; while [ ! -b $1 ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done; [ -b $1 ]; }
make_xfs() {  # $1 = device
    # mkfs.xfs refuses a file system under 300 MB unless run under the
    # variables of xfsprogs' own test suite (fstests); the demo's arrays
    # are 192 MiB.
    if [ $(( $(cat /sys/block/$(basename $1)/size) * 512 )) -lt 314572800 ]; then
        export TEST_DIR=/tmp TEST_DEV=$1 QA_CHECK_FS=1
    fi
    mkfs.xfs -f -K $1   # -K: no discard of the whole device first
}
xfs_round() {  # $1 = round number
    mkdir -p $MNT/fio $MNT/sums/$1 || return 1
    fio --name=files --directory=$MNT/fio --nrfiles=4 --filesize=256k --rw=randwrite --bs=4k --iodepth=8 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=0 --output-format=terse --terse-version=3 > /tmp/x1 || { cat /tmp/x1; return 1; }
    for i in 1 2 3 4; do dd if=/dev/urandom of=$MNT/sums/$1/f$i bs=64k count=1 2>/dev/null || return 1; done
    sync || return 1
    ( cd $MNT/sums/$1 && md5sum f1 f2 f3 f4 > ../$1.md5 ) || return 1
    sync; echo 3 > /proc/sys/vm/drop_caches
    ( cd $MNT/sums/$1 && md5sum -c ../$1.md5 > /dev/null ) || { echo "round $1: files differ from their sums when re-read from the device"; return 1; }
}
check_sums() {  # every round's files, re-read from the device
    echo 3 > /proc/sys/vm/drop_caches; n=0
    for m in $MNT/sums/*.md5; do
        [ -e "$m" ] || continue
        r=$(basename $m .md5)
        ( cd $MNT/sums/$r && md5sum -c ../$r.md5 > /dev/null ) || { echo "round $r: files differ from their sums"; return 1; }
        n=$((n+1))
    done
    echo "checksummed rounds verified: $n"
}
xfs_errors() { dmesg | grep -E 'XFS.*([Ee]rror|shut ?down|[Cc]orrupt)'; true; }
`

// fsGuestScript is the guest's /harness/run.sh for the check: connect to
// the array's namespace on every frontend (the host's 127.0.0.1 is
// 10.0.2.2), XFS on the multipath device, rounds until /harness/stopxfs,
// then the checks. It reports through /harness/out: mounted, rounds (the
// rounds completed), why (a failure's reason, one line) and result
// ("KEY VALUE" lines); its exit status is 0 when every check passed.
func fsGuestScript(nqn string, ports []int) string {
	var ps []string
	for _, p := range ports {
		ps = append(ps, strconv.Itoa(p))
	}
	return FSGuestLib + fmt.Sprintf(`out=/harness/out
fail() { echo "$2" > $out/why.tmp && mv $out/why.tmp $out/why; exit $1; }
modprobe nvme-tcp || fail 10 "modprobe nvme-tcp failed in the guest"
command -v mkfs.xfs > /dev/null && command -v xfs_repair > /dev/null && modprobe xfs || fail 11 "%[3]s (install xfsprogs: make deps; then remove build/vm/img-* so that test/vm/build-initramfs.sh builds the image again with them)"
for p in %[1]s; do
    nvme connect -t tcp -a 10.0.2.2 -s $p -n %[2]s --ctrl-loss-tmo=-1 --reconnect-delay=1 --keep-alive-tmo=5 > /dev/null 2>&1 || fail 12 "nvme connect to 10.0.2.2:$p failed"
done
wait_dev /dev/nvme0n1 || fail 12 "no multipath block device /dev/nvme0n1 after connecting"
make_xfs /dev/nvme0n1 > $out/mkfs.log 2>&1 || fail 13 "mkfs.xfs failed: $(tail -2 $out/mkfs.log | tr '\n' ' ')"
mkdir -p $MNT && mount -t xfs /dev/nvme0n1 $MNT || fail 13 "mount -t xfs failed: $(dmesg | tail -3 | tr '\n' ' ')"
echo mounted > $out/mounted.tmp && mv $out/mounted.tmp $out/mounted
n=0
while [ ! -e /harness/stopxfs ] || [ $n -eq 0 ]; do
    n=$((n+1)); xfs_round $n > $out/round.log 2>&1 || fail 20 "round $n of the file workload failed: $(tail -3 $out/round.log | tr '\n' ' ')"
    echo $n > $out/rounds.tmp && mv $out/rounds.tmp $out/rounds
done
grep -q " $MNT xfs " /proc/mounts && ls $MNT/sums > /dev/null && touch $MNT/alive || fail 21 "XFS no longer mounted or usable after the failover"
xe=$(xfs_errors | tail -3 | tr '\n' ' ')
[ -z "$xe" ] || fail 22 "XFS logged errors: $xe"
sums=$(check_sums) || fail 23 "after the failover: $sums"
held=$(dmesg | grep -c 'no usable path - requeuing I/O')
ioerr=$(dmesg | grep -c 'I/O error, dev nvme0n1,')
[ "$ioerr" = 0 ] || fail 24 "the guest kernel reported $ioerr I/O errors on the multipath device"
umount $MNT || fail 25 "umount failed"
xfs_repair -n /dev/nvme0n1 > $out/repair.log 2>&1 || fail 26 "xfs_repair -n found problems: $(grep -v '^ *- \|^Phase' $out/repair.log | tail -3 | tr '\n' ' ')"
mount -t xfs /dev/nvme0n1 $MNT && again=$(check_sums) && umount $MNT || fail 27 "mounted again: $again"
nvme disconnect -n %[2]s > /dev/null 2>&1
printf 'rounds %%s\nheld %%s\nsums %%s\n' "$n" "$held" "${sums##*: }" > $out/result
exit 0
`, strings.Join(ps, " "), nqn, noXFSWhy)
}

// noXFSWhy begins the guest's reason when its image lacks XFS.
const noXFSWhy = "the guest image has no XFS tools or module"

// repoRoot is the tier0 source tree above the working directory, whose
// test/vm boots the guest ("" when not run from it).
func repoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module tier0")) {
			if _, err := os.Stat(filepath.Join(dir, "test", "vm", "run-vm.sh")); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// guestImage returns test/vm's guest image (build/vm/img-KEY, KEY from its
// build script and init as package tier0/test/vm computes it), building it
// when missing, or why no guest can run here.
func guestImage(root string) (string, string) {
	if os.Geteuid() != 0 {
		return "", "the Linux guest needs root (its image build uses dpkg -x and depmod)"
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "", "qemu-system-x86_64 not found: install the packages in scripts/deps.d/vm.sh (make deps)"
	}
	if root == "" {
		return "", "not run from the tier0 source tree, whose test/vm boots the Linux guest (make demo runs from it)"
	}
	src := filepath.Join(root, "test", "vm")
	h := sha256.New()
	for _, f := range []string{"build-initramfs.sh", "init"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Sprintf("reading the guest build script: %v", err)
		}
		h.Write(b)
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	base := filepath.Join(root, "build", "vm")
	dir := filepath.Join(base, "img-"+key)
	if _, err := os.Stat(filepath.Join(dir, "ok")); err == nil {
		return dir, ""
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err.Error()
	}
	lock, err := os.OpenFile(filepath.Join(base, "build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err.Error()
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err.Error()
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(filepath.Join(dir, "ok")); err == nil {
		return dir, ""
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	cmd := exec.Command("bash", filepath.Join(src, "build-initramfs.sh"), tmp)
	cmd.Env = append(os.Environ(), "WORK="+filepath.Join(base, "work-"+key))
	out, err := cmd.CombinedOutput()
	os.RemoveAll(filepath.Join(base, "work-"+key, "rootfs"))
	if err != nil {
		return "", fmt.Sprintf("building the guest image with test/vm/build-initramfs.sh failed (%v): %s", err, oneLine(string(out[max(0, len(out)-400):]), 400))
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o644); err != nil {
		return "", err.Error()
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", err.Error()
	}
	return dir, ""
}

// fsGuest is a running guest of the check.
type fsGuest struct {
	share string
	cmd   *exec.Cmd
	done  chan struct{}
	err   error
}

func (g *fsGuest) file(name string) string {
	b, _ := os.ReadFile(filepath.Join(g.share, "out", name))
	return strings.TrimSpace(string(b))
}

func (g *fsGuest) exited() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

func (g *fsGuest) kill() {
	if !g.exited() {
		_ = syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL)
		<-g.done
	}
}

// waitGuest polls until cond holds, the guest exits, ctx ends or timeout
// passes.
func (r *runner) waitGuest(g *fsGuest, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if g.exited() {
			why := g.file("why")
			if why == "" {
				why = "the guest exited (console: " + filepath.Join(g.share, "out", "qemu-console.log") + ")"
			}
			return errors.New(why)
		}
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %v", what, timeout)
		}
		sleepCtx(r.ctx, 250*time.Millisecond)
	}
	return nil
}

// fsFailover is the seed's file-system claim on this cluster: in a Linux
// guest (QEMU, test/vm), XFS on the kernel's multipath device of the
// victim's home array over every frontend, a verified file workload
// running while the victim's tier0d is killed with SIGKILL, the array
// taken over, the victim restarted and the array failed back home; then
// the file system must still be mounted with no XFS or I/O error, every
// file must verify, and after umount xfs_repair -n must find nothing to
// repair.
func (r *runner) fsFailover() {
	switch {
	case !r.o.Local:
		r.check(CheckFS, bench.NotRun, "needs --local: it makes a file system on one array")
		return
	case r.o.Short:
		r.check(CheckFS, bench.NotRun, "--short leaves it out: it boots a Linux guest and kills a node again (a few minutes)")
		return
	}
	array := ""
	for _, a := range r.cfg.Arrays {
		if a.Home == r.victim {
			array = a.Name
			break
		}
	}
	if array == "" {
		r.check(CheckFS, bench.NotRun, fmt.Sprintf("no array has node %s, the node killed, as its home", r.victim))
		return
	}
	img, why := guestImage(repoRoot())
	if why != "" {
		r.check(CheckFS, bench.NotRun, "no Linux guest: "+why)
		return
	}
	share, err := os.MkdirTemp("", "tier0-validate-guest-")
	if err != nil {
		r.check(CheckFS, bench.Fail, err.Error())
		return
	}
	defer os.RemoveAll(share)
	var ports []int
	for _, n := range r.cfg.Nodes {
		ports = append(ports, n.Frontend.Port)
	}
	if err = os.MkdirAll(filepath.Join(share, "out"), 0o755); err == nil {
		err = os.WriteFile(filepath.Join(share, "run.sh"), []byte(fsGuestScript(r.cfg.SubsystemNQN(array), ports)), 0o755)
	}
	if err != nil {
		r.check(CheckFS, bench.Fail, err.Error())
		return
	}
	// One guest at a time on this machine, as package tier0/test/vm
	// runs them (its lock file), so that guest tests and this check do
	// not overload a small machine together.
	if lock, err := os.OpenFile(filepath.Join(repoRoot(), "build", "vm", "run.lock"), os.O_CREATE|os.O_RDWR, 0o644); err == nil {
		defer lock.Close()
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX) == nil {
			defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		}
	}
	fmt.Fprintf(r.o.Out, "file system through failover: booting a Linux guest for XFS on array %s\n", array)
	g := &fsGuest{share: share, done: make(chan struct{})}
	g.cmd = exec.Command("bash", filepath.Join(repoRoot(), "test", "vm", "run-vm.sh"), share)
	g.cmd.Env = append(os.Environ(), "IMG="+img, "TIMEOUT=900", "MEM=1024", "SMP=2")
	g.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := g.cmd.Start(); err != nil {
		r.check(CheckFS, bench.Fail, fmt.Sprintf("starting test/vm/run-vm.sh: %v", err))
		return
	}
	go func() { g.err = g.cmd.Wait(); close(g.done) }()
	defer g.kill()
	fail := func(step string, err error) {
		r.check(CheckFS, bench.Fail, fmt.Sprintf("XFS on array %s: %s: %v", array, step, err))
	}
	rounds := func() int { n, _ := strconv.Atoi(g.file("rounds")); return n }
	if err := r.waitGuest(g, 5*time.Minute, "XFS mounted in the guest", func() bool { return g.file("mounted") != "" && rounds() >= 1 }); err != nil {
		if strings.HasPrefix(err.Error(), noXFSWhy) {
			r.check(CheckFS, bench.NotRun, "no XFS in the Linux guest: "+err.Error())
			return
		}
		fail("before the kill", err)
		return
	}
	before := rounds()
	killed, err := r.ctl.kill(r.victim)
	if err != nil {
		fail("killing "+r.victim, err)
		return
	}
	r.down[r.victim] = true
	var owner string
	if _, err := r.waitFor(r.t.failover, func(st api.Status) (bool, string) {
		for _, a := range st.Arrays {
			if a.Name == array && a.Owner != "" && a.Owner != r.victim && a.Phase == "active" {
				owner = a.Owner
				return true, ""
			}
		}
		return false, fmt.Sprintf("array %s not taken over yet", array)
	}); err != nil {
		fail("takeover", err)
		return
	}
	moved := time.Since(killed)
	// A whole round on the new owner alone.
	atTakeover := rounds()
	if err := r.waitGuest(g, 3*time.Minute, "file rounds after the takeover", func() bool { return rounds() >= atTakeover+2 }); err != nil {
		fail("after the takeover", err)
		return
	}
	if err := r.ctl.start(r.victim); err != nil {
		fail("restarting "+r.victim, err)
		return
	}
	delete(r.down, r.victim)
	if _, err := r.waitFor(r.t.resync+r.t.failover, func(st api.Status) (bool, string) { return optimalAtHome(r.cfg, st) }); err != nil {
		fail("restart, resync and failback", err)
		return
	}
	atHome := rounds()
	if err := r.waitGuest(g, 3*time.Minute, "a file round after the failback", func() bool { return rounds() >= atHome+1 }); err != nil {
		fail("after the failback", err)
		return
	}
	if err := os.WriteFile(filepath.Join(share, "stopxfs"), []byte("stop\n"), 0o644); err != nil {
		fail("stopping the workload", err)
		return
	}
	if err := r.waitGuest(g, 5*time.Minute, "the guest's checks", func() bool { return g.file("result") != "" }); err != nil {
		fail("after the failover", err)
		return
	}
	res := map[string]string{}
	for _, l := range strings.Split(g.file("result"), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			res[k] = v
		}
	}
	if res["held"] == "0" {
		r.check(CheckFS, bench.Fail, fmt.Sprintf("XFS on array %s: the guest kernel never held I/O for want of a path: the file system was idle when %s was killed, so nothing was proved", array, r.victim))
		return
	}
	r.check(CheckFS, bench.Pass, fmt.Sprintf("XFS on array %s's multipath device (%d paths) in a Linux guest: %s rounds of verified file I/O (fio crc32c, md5-summed files) through kill -9 of %s (%d rounds before), takeover by %s %.1f s after the kill, restart and failback; still mounted, no XFS or I/O error, %s rounds of files verified, xfs_repair -n clean, files intact after a remount",
		array, len(ports), res["rounds"], r.victim, before, owner, moved.Seconds(), res["sums"]))
}
