package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/test/vm"
)

// guestLib is shell the guest's commands share: fio verify (4 KiB random
// and 1 MiB sequential writes, each read back and checked with crc32c),
// waiting for a block device, and the paths' state as "PORT CTRLSTATE ANA"
// lines.
const guestLib = `fio_verify() {  # $1 = device, $2 = size
    fio --name=rand4k --filename=$1 --size=$2 --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=0 --output-format=terse --terse-version=3 > /tmp/f1 || return 1
    fio --name=seq1m --filename=$1 --size=$2 --rw=write --bs=1M --iodepth=4 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse --terse-version=3 > /tmp/f2 || return 1
    awk -F';' '{printf "fio %s: read %s KiB/s, write %s KiB/s, errors %s, longest read %.0f ms, longest write %.0f ms\n", $3, $7, $48, $5, $39/1000, $80/1000}' /tmp/f1 /tmp/f2
}
wait_dev() { n=0; while [ ! -b $1 ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done; [ -b $1 ]; }
paths() {
    for c in /sys/class/nvme/nvme*; do
        port=$(cat $c/address | tr ',' '\n' | sed -n 's/^trsvcid=//p')
        ana=$(cat $c/nvme*c*n1/ana_state 2>/dev/null | head -1)
        echo "$port $(cat $c/state) ${ana:-none}"
    done
    ls /dev/ | grep '^nvme[0-9]*n[0-9]*$' | sed 's/^/dev /'
}
`

// pathState is what the guest's sysfs says about one controller.
type pathState struct{ ctrl, ana string }

// TestLinuxHostFailover connects the Linux kernel's NVMe/TCP host (native
// multipath) to array B's namespace on all five nodes' frontends, runs fio
// verify in a loop on the multipath device, kills node B's tier0d (B's
// owner) with SIGKILL, and checks that the kernel held the I/O while no
// path was usable, that the survivor which took B over shows as the
// optimized path in sysfs, and — after B is restarted and B failed back
// home with the guest still connected — that fio never saw an I/O error
// and every block verified.
func TestLinuxHostFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest and a five-node cluster (a few minutes); not in -short")
	}
	vm.Image(t) // skips with the reason when no guest can run here
	const array, victim = "B", "B"
	c, _ := startCluster(t)
	cfg := c.Config()
	nqn := cfg.SubsystemNQN(array)
	portNode := map[string]string{}
	for _, n := range cfg.Nodes {
		portNode[fmt.Sprint(n.Frontend.Port)] = n.Name
	}

	g := vm.Start(t, vm.Options{Script: "modprobe nvme-tcp || exit 10\nmodprobe nvme-core\necho ready > /harness/out/ready\n" + vm.ServeLoop,
		Timeout: 8 * time.Minute})
	if _, err := g.WaitFile("ready", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	sh := func(cmd string, timeout time.Duration) string {
		t.Helper()
		out, rc, err := g.Exec(guestLib+cmd, timeout)
		if err != nil {
			t.Fatal(err)
		}
		if rc != 0 {
			t.Fatalf("guest: %s\nexit %d:\n%s", cmd, rc, out)
		}
		return out
	}
	// paths maps node name to its path's state and fails on a second block
	// device (paths not merged into one multipath device).
	paths := func() (map[string]pathState, string) {
		out := sh("paths", time.Minute)
		m := map[string]pathState{}
		var devs []string
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "dev":
				devs = append(devs, f[1])
			case len(f) == 3:
				m[portNode[f[0]]] = pathState{ctrl: f[1], ana: f[2]}
			}
		}
		if len(devs) != 1 {
			t.Fatalf("guest block devices %v: want one multipath device for %s over 5 paths:\n%s", devs, nqn, out)
		}
		return m, out
	}
	// waitPaths waits until optimal's path is live and optimized and every
	// other live node's path is live and inaccessible (down: a node whose
	// path is expected not live).
	waitPaths := func(optimal, down string, timeout time.Duration) map[string]pathState {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			m, out := paths()
			ok := len(m) == len(cfg.Nodes)
			for _, n := range cfg.Nodes {
				p := m[n.Name]
				switch {
				case n.Name == down:
					ok = ok && p.ctrl != "live"
				case n.Name == optimal:
					ok = ok && p.ctrl == "live" && p.ana == "optimized"
				default:
					ok = ok && p.ctrl == "live" && p.ana == "inaccessible"
				}
			}
			if ok {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("guest paths after %v: %v\nwant %s live+optimized, %q not live, the others live+inaccessible; sysfs:\n%s",
					timeout, m, optimal, down, out)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	// One multipath device over all five frontends.
	var conn []string
	for _, n := range cfg.Nodes {
		// ctrl-loss-tmo=-1: the kernel never gives the dead node's
		// controller up (it keeps reconnecting), and its I/O goes to the
		// multipath requeue list, not to an error.
		conn = append(conn, fmt.Sprintf("nvme connect -t tcp -a 10.0.2.2 -s %d -n %s --ctrl-loss-tmo=-1 --reconnect-delay=1 --keep-alive-tmo=5 || exit 1",
			n.Frontend.Port, nqn))
	}
	sh(strings.Join(conn, "\n")+"\nwait_dev /dev/nvme0n1", 2*time.Minute)
	m := waitPaths(victim, "", time.Minute)
	t.Logf("connected: one multipath device, paths %v", m)

	// fio verify runs back to back in the background (the guest keeps
	// serving Exec meanwhile) until told to stop, so that the loop spans
	// the kill, the takeover, the restart and the failback.
	bg := guestLib + `( rc=0; n=0; while [ ! -e /harness/stopfio ] || [ $n -eq 0 ]; do
    fio_verify /dev/nvme0n1 8M || { rc=1; break; }; n=$((n+1)); echo $n > /harness/out/fio-runs; done
  echo "fio verify runs: $n"; echo $rc > /harness/out/fio-bg.rc.tmp && mv /harness/out/fio-bg.rc.tmp /harness/out/fio-bg.rc ) > /harness/out/fio-bg.log 2>&1 &
`
	if err := g.Signal("cmd/bgfio.sh", []byte(bg)); err != nil {
		t.Fatal(err)
	}
	fioAlive := func(when string) {
		t.Helper()
		if _, err := os.Stat(filepath.Join(g.Dir(), "out", "fio-bg.rc")); err == nil {
			b, _ := os.ReadFile(filepath.Join(g.Dir(), "out", "fio-bg.log"))
			t.Fatalf("background fio ended %s:\n%s\nguest dmesg:\n%s", when, b, sh("dmesg | tail -40", time.Minute))
		}
	}
	time.Sleep(4 * time.Second)
	fioAlive("before the kill")

	ctx := context.Background()
	killed, err := c.Kill(victim)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s's tier0d (owner of array %s) with SIGKILL", victim, array)
	var owner string
	for deadline := time.Now().Add(time.Minute); ; {
		o, st, ph := ownerOf(ctx, c, array)
		if o != "" && o != victim && ph == "active" {
			owner = o
			t.Logf("array %s active on %s (%s) %v after the kill", array, o, st, time.Since(killed).Round(10*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("array %s not taken over a minute after %s was killed: owner %q state %q phase %q", array, victim, o, st, ph)
		}
		time.Sleep(200 * time.Millisecond)
	}
	m = waitPaths(owner, victim, time.Minute)
	t.Logf("guest paths after the failover (%v after the kill): %v", time.Since(killed).Round(10*time.Millisecond), m)
	fioAlive("during the failover")
	runsAtTakeover := "0"
	if b, err := os.ReadFile(filepath.Join(g.Dir(), "out", "fio-runs")); err == nil {
		runsAtTakeover = strings.TrimSpace(string(b))
	}

	// Restart the victim: B fails back home (policy auto) with the guest
	// connected and fio still running.
	if err := c.Start(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitOptimal(ctx, 2*time.Minute); err != nil {
		t.Fatalf("after restarting %s: %v", victim, err)
	}
	m = waitPaths(victim, "", time.Minute)
	t.Logf("guest paths after %s's restart and failback: %v", victim, m)
	fioAlive("during the failback")

	if err := g.Signal("stopfio", []byte("stop\n")); err != nil {
		t.Fatal(err)
	}
	rc, err := g.WaitFile("fio-bg.rc", 4*time.Minute)
	logb, _ := os.ReadFile(filepath.Join(g.Dir(), "out", "fio-bg.log"))
	dmesg := sh("dmesg | grep -i nvme | tail -60", time.Minute)
	if err != nil || strings.TrimSpace(string(rc)) != "0" {
		t.Fatalf("fio verify through the failover: rc %q err %v:\n%s\nguest dmesg:\n%s", rc, err, logb, dmesg)
	}
	t.Logf("fio through failover and failback (fio verify runs completed before the takeover: %s):\n%s", runsAtTakeover, logb)
	t.Logf("guest dmesg (nvme):\n%s", dmesg)
	// grep -c counts; without a match it prints 0 and exits 1
	held := strings.TrimSpace(sh("dmesg | grep -c 'no usable path - requeuing I/O'; true", time.Minute))
	ioErrs := strings.TrimSpace(sh("dmesg | grep -c 'I/O error, dev nvme0n1,'; true", time.Minute))
	t.Logf("guest kernel: %s 'no usable path - requeuing I/O' lines (rate-limited), %s I/O errors on the multipath device", held, ioErrs)
	if held == "0" {
		t.Errorf("the guest kernel never held I/O for want of a usable path: fio was not running when %s was killed, so the test proved nothing:\n%s", victim, dmesg)
	}
	if ioErrs != "0" {
		t.Errorf("the kernel reported %s I/O errors on the multipath device:\n%s", ioErrs, dmesg)
	}
	sh("nvme disconnect -n "+nqn, time.Minute)
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	if res := g.Wait(); res.RC != 0 {
		t.Fatalf("guest exited %d", res.RC)
	}
}
