package fabric

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/daemon/target"
	"tier0/test/vm"
)

const tier0NQN = "nqn.2026-11.io.tier0.test:array-a"

// node is one tier0 target in the test process, serving tier0NQN on
// 127.0.0.1 (the guest reaches it at 10.0.2.2).
type node struct {
	t    *target.Target
	port int
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("TIER0_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return nil
}

// startNode serves dev as namespace 1 of tier0NQN with the given ANA state
// and controller ID range base.
func startNode(t testing.TB, dev blockdev.Device, cntlBase uint16, state nvme.ANAState) *node {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.New(target.Config{CntlIDBase: cntlBase, CntlIDCount: 100, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	go tg.Serve(l)
	t.Cleanup(func() { tg.Close() })
	if err := tg.AddSubsystem(target.SubsystemConfig{NQN: tier0NQN, AllowAnyHost: true, ANAStates: map[uint32]nvme.ANAState{1: state}}); err != nil {
		t.Fatal(err)
	}
	if err := tg.AddNamespace(tier0NQN, target.NamespaceConfig{NSID: 1, Device: dev, ANAGroup: 1,
		NGUID: [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 0xAA, 1}, UUID: [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 0xBB, 1}}); err != nil {
		t.Fatal(err)
	}
	return &node{t: tg, port: l.Addr().(*net.TCPAddr).Port}
}

// fioVerify writes the device with a verify pattern and reads it back:
// 4 KiB random writes, then 1 MiB sequential writes, each verified.
const fioVerify = `fio_verify() {  # $1 = device, $2 = size
    fio --name=rand4k --filename=$1 --size=$2 --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=0 --output-format=terse --terse-version=3 > /tmp/f1 || return 1
    fio --name=seq1m --filename=$1 --size=$2 --rw=write --bs=1M --iodepth=4 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse --terse-version=3 > /tmp/f2 || return 1
    awk -F';' '{print "fio " $3 ": read " $7 " KiB/s, write " $48 " KiB/s, errors " $5}' /tmp/f1 /tmp/f2
}
wait_dev() { n=0; while [ ! -b $1 ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done; [ -b $1 ]; }
`

// linuxHostVsTier0Target drives the Linux kernel's NVMe/TCP host
// (nvme-cli, native multipath) against two tier0 targets serving one
// subsystem: discovery; connect and fio verify with digests off and on; one
// multipath device over both targets with ANA states in sysfs; ANA flips
// during a fio verify run; reservations from nvme-cli, and a preempted Linux
// host getting reservation conflicts.
func linuxHostVsTier0Target(t *testing.T, g *vm.Guest) {
	mem := blockdev.NewMem(64<<20, 512)
	a := startNode(t, mem, 1, nvme.ANAOptimized)
	b := startNode(t, mem, 101, nvme.ANAInaccessible)
	sh := func(cmd string) string {
		t.Helper()
		out, rc, err := g.Exec(fioVerify+cmd, 4*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if rc != 0 {
			t.Fatalf("guest: %s\nexit %d:\n%s", cmd, rc, out)
		}
		return out
	}
	conn := func(port int, extra string) string {
		return fmt.Sprintf("nvme connect -t tcp -a 10.0.2.2 -s %d -n %s %s", port, tier0NQN, extra)
	}

	t.Run("discover", func(t *testing.T) {
		out := sh(fmt.Sprintf("nvme discover -t tcp -a 10.0.2.2 -s %d", a.port))
		if !strings.Contains(out, tier0NQN) {
			t.Fatalf("nvme discover does not list %s:\n%s", tier0NQN, out)
		}
	})

	for _, dg := range []struct{ name, flags string }{{"plain", ""}, {"digests", "-g -G"}} {
		t.Run("fio-"+dg.name, func(t *testing.T) {
			out := sh(conn(a.port, dg.flags) + " && wait_dev /dev/nvme0n1 && fio_verify /dev/nvme0n1 4M; rc=$?; nvme disconnect -n " + tier0NQN + "; exit $rc")
			t.Logf("%s", out)
		})
	}

	t.Run("multipath-ana", func(t *testing.T) {
		sh(conn(a.port, "") + " && " + conn(b.port, "") + " && wait_dev /dev/nvme0n1")
		states := func() map[string]string {
			out := sh(`for p in /sys/class/nvme/nvme*/nvme*c*n1; do echo "$(cat $p/device/address 2>/dev/null | tr ',' ' ' | sed 's/.*trsvcid=\([0-9]*\).*/\1/') $(cat $p/ana_state)"; done; ls /dev/nvme*`)
			m := map[string]string{}
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 2 && !strings.HasPrefix(f[0], "/dev") {
					m[f[0]] = f[1]
				}
			}
			if strings.Contains(out, "/dev/nvme1n1") {
				t.Errorf("two block devices: the kernel did not merge the paths into one multipath device:\n%s", out)
			}
			return m
		}
		waitStates := func(wantA, wantB string) {
			t.Helper()
			var m map[string]string
			for i := 0; i < 40; i++ {
				m = states()
				if m[fmt.Sprint(a.port)] == wantA && m[fmt.Sprint(b.port)] == wantB {
					return
				}
				time.Sleep(250 * time.Millisecond)
			}
			t.Fatalf("ana_state in sysfs: %v, want port %d %s and port %d %s", m, a.port, wantA, b.port, wantB)
		}
		waitStates("optimized", "inaccessible")
		// fio verify in the background while the optimized side flips
		// (a background job, so that the guest keeps serving Exec meanwhile)
		// fio verify runs repeat until the flips are over, so that they
		// cover every flip however fast the guest is
		g.Signal("cmd/bgfio.sh", []byte(fioVerify+`( rc=0; n=0; while [ ! -e /harness/stopfio ] || [ $n -eq 0 ]; do
    fio_verify /dev/nvme0n1 4M || { rc=1; break; }; n=$((n+1)); done
  echo "fio verify runs: $n"; echo $rc > /harness/out/fio-bg.rc.tmp && mv /harness/out/fio-bg.rc.tmp /harness/out/fio-bg.rc ) > /harness/out/fio-bg.log 2>&1 &
`))
		time.Sleep(2 * time.Second)
		for i := 0; i < 2; i++ {
			if _, err := os.Stat(g.Dir() + "/out/fio-bg.rc"); err == nil {
				b, _ := os.ReadFile(g.Dir() + "/out/fio-bg.log")
				t.Fatalf("background fio ended before flip round %d:\n%s", i+1, b)
			}
			a.t.SetANAState(tier0NQN, 1, nvme.ANAInaccessible)
			b.t.SetANAState(tier0NQN, 1, nvme.ANAOptimized)
			waitStates("inaccessible", "optimized")
			time.Sleep(time.Second)
			b.t.SetANAState(tier0NQN, 1, nvme.ANAInaccessible)
			a.t.SetANAState(tier0NQN, 1, nvme.ANAOptimized)
			waitStates("optimized", "inaccessible")
			time.Sleep(time.Second)
		}
		g.Signal("stopfio", []byte("stop\n"))
		rc, err := g.WaitFile("fio-bg.rc", 4*time.Minute)
		logb, _ := os.ReadFile(g.Dir() + "/out/fio-bg.log")
		if err != nil || strings.TrimSpace(string(rc)) != "0" {
			t.Fatalf("fio verify during ANA flips: rc %q err %v:\n%s", rc, err, logb)
		}
		t.Logf("fio during ANA flips: %s", logb)
	})

	t.Run("reservations", func(t *testing.T) {
		// the guest (host 1) registers and takes Write Exclusive
		sh("nvme resv-register /dev/nvme0n1 --nrkey=0x1111 --rrega=0 && nvme resv-acquire /dev/nvme0n1 --crkey=0x1111 --rtype=1 --racqa=0")
		out := sh("nvme resv-report /dev/nvme0n1 --eds")
		if !regexp.MustCompile(`(?i)rkey\s*:\s*(0x)?1111`).MatchString(out) {
			t.Errorf("resv-report does not show key 0x1111:\n%s", out)
		}
		sh("dd if=/dev/zero of=/dev/nvme0n1 bs=4k count=1 oflag=direct")
		// tier0's host (host 2) preempts and aborts the guest
		c, err := host.Dial(context.Background(), fmt.Sprintf("127.0.0.1:%d", a.port),
			host.Options{SubNQN: tier0NQN, HostID: [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 2}, IOQueues: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ns, err := c.Namespace(1)
		if err != nil {
			t.Fatal(err)
		}
		if err := ns.Register(nvme.ResvRegister, 0, 0x2222, false); err != nil {
			t.Fatal(err)
		}
		if err := ns.Acquire(nvme.ResvPreemptAndAbort, nvme.ResvWriteExclusive, 0x2222, 0x1111); err != nil {
			t.Fatal(err)
		}
		out, rc, err := g.Exec("dd if=/dev/zero of=/dev/nvme0n1 bs=4k count=1 oflag=direct 2>&1; echo dd-rc=$?; dmesg | tail -5", time.Minute)
		if err != nil || rc != 0 {
			t.Fatalf("guest exec: %v rc %d", err, rc)
		}
		if strings.Contains(out, "dd-rc=0") {
			t.Fatalf("the preempted Linux host could still write:\n%s", out)
		}
		t.Logf("preempted Linux host write: %s", out)
		out = sh("nvme resv-report /dev/nvme0n1 --eds")
		if !regexp.MustCompile(`(?i)rkey\s*:\s*(0x)?2222`).MatchString(out) || regexp.MustCompile(`(?i)rkey\s*:\s*(0x)?1111`).MatchString(out) {
			t.Errorf("resv-report after the preempt should show only key 0x2222:\n%s", out)
		}
		writeVerify(t, ns, 0, 4096, 30)
		sh("nvme disconnect -n " + tier0NQN)
	})
}
