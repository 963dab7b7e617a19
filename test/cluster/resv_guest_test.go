package cluster

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/host"
	"tier0/daemon/nvme"
	"tier0/test/vm"
)

// guestResvReports prints the Reservation Report of namespace 1 through
// every live controller (every path), each after a "== PORT" line.
const guestResvReports = `for c in /sys/class/nvme/nvme*; do
    [ "$(cat $c/state)" = live ] || continue
    port=$(cat $c/address | tr ',' '\n' | sed -n 's/^trsvcid=//p')
    echo "== $port"
    nvme resv-report /dev/$(basename $c) -n 1 --eds 2>&1
done
`

// TestLinuxHostReservationsAcrossPaths is issue 16's acceptance for
// cluster-wide reservations: the Linux host (native multipath over all five
// frontends) registers and takes Write Exclusive through the multipath
// device; tier0's own host, a second host NQN, registers through a node
// that does not own the array; Reservation Report through every path shows
// the same registrants and holder; the owner is killed with SIGKILL; after
// the failover the report through every live path is unchanged; the two
// hosts fence each other with preempt-and-abort through different nodes'
// paths (the second host through a node that is not the owner): the
// guest's writes are refused, then, fenced in turn, the second host's on
// every path (reservation conflict on the owner, no path elsewhere).
func TestLinuxHostReservationsAcrossPaths(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest and a five-node cluster (a few minutes); not in -short")
	}
	vm.Image(t) // skips with the reason when no guest can run here
	const array = "B"
	c, _ := startCluster(t)
	cfg := c.Config()
	nqn := cfg.SubsystemNQN(array)
	ctx := context.Background()
	portOf := map[string]int{}
	for _, n := range cfg.Nodes {
		portOf[n.Name] = n.Frontend.Port
	}
	owner, _, _ := ownerOf(ctx, c, array)
	if owner == "" {
		t.Fatalf("array %s has no owner", array)
	}

	g := vm.Start(t, vm.Options{Script: "modprobe nvme-tcp || exit 10\nmodprobe nvme-core\necho ready > /harness/out/ready\n" + vm.ServeLoop,
		Timeout: 8 * time.Minute})
	if _, err := g.WaitFile("ready", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	defer func() {
		g.Stop()
		g.Wait()
	}()
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
	var conn []string
	for _, n := range cfg.Nodes {
		conn = append(conn, fmt.Sprintf("nvme connect -t tcp -a 10.0.2.2 -s %d -n %s --ctrl-loss-tmo=-1 --reconnect-delay=1 --keep-alive-tmo=5 || exit 1",
			n.Frontend.Port, nqn))
	}
	sh(strings.Join(conn, "\n")+"\nwait_dev /dev/nvme0n1", 2*time.Minute)
	// waitOptimized waits until node's path is live and optimized in sysfs.
	waitOptimized := func(node string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; {
			out := sh("paths", time.Minute)
			if regexp.MustCompile(fmt.Sprintf(`(?m)^%d live optimized$`, portOf[node])).MatchString(out) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's path (port %d) not live and optimized in the guest:\n%s", node, portOf[node], out)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	waitOptimized(owner)

	// host 1 (the guest) registers and takes Write Exclusive
	sh("nvme resv-register /dev/nvme0n1 --nrkey=0x1111 --rrega=0 && nvme resv-acquire /dev/nvme0n1 --crkey=0x1111 --rtype=1 --racqa=0", time.Minute)
	// host 2 (tier0's host) registers through a node that is not the owner
	other := "A"
	if owner == "A" {
		other = "C"
	}
	id2 := [16]byte{0x74, 0x69, 0x65, 0x72, 0x30, 0x72, 0x65, 0x73, 0x76, 2}
	dial := func(node string) (*host.Controller, *host.Namespace) {
		t.Helper()
		hc, err := host.Dial(ctx, fmt.Sprintf("127.0.0.1:%d", portOf[node]), host.Options{SubNQN: nqn,
			HostNQN: "nqn.2026-11.io.tier0.test:resv-host-2", HostID: id2, IOQueues: 1, QueueDepth: 16, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("host 2 to %s's frontend: %v", node, err)
		}
		ns, err := hc.Namespace(1)
		if err != nil {
			hc.Close()
			t.Fatal(err)
		}
		return hc, ns
	}
	hc, ns2 := dial(other)
	if err := ns2.Register(nvme.ResvRegister, 0, 0x2222, false); err != nil {
		t.Fatalf("host 2 registers through %s (not the owner %s): %v", other, owner, err)
	}
	hc.Close()

	// reports parses the per-path reports: port -> report text; all equal
	reports := func(when string, wantPaths int) string {
		t.Helper()
		out := sh(guestResvReports, 2*time.Minute)
		byPort := map[string]string{}
		var port string
		for _, line := range strings.Split(out, "\n") {
			if p, ok := strings.CutPrefix(line, "== "); ok {
				port = p
				continue
			}
			if port != "" {
				byPort[port] += line + "\n"
			}
		}
		if len(byPort) != wantPaths {
			t.Fatalf("%s: reports through %d paths, want %d:\n%s", when, len(byPort), wantPaths, out)
		}
		ports := make([]string, 0, len(byPort))
		for p := range byPort {
			byPort[p] = strings.TrimSpace(byPort[p])
			ports = append(ports, p)
		}
		sort.Strings(ports)
		first := byPort[ports[0]]
		for _, p := range ports[1:] {
			if byPort[p] != first {
				t.Fatalf("%s: Reservation Report through port %s differs from port %s:\n%s", when, p, ports[0], out)
			}
		}
		for _, want := range []string{`(?i)rtype\s*:\s*1`, `(?i)rkey\s*:\s*(0x)?1111`, `(?i)rkey\s*:\s*(0x)?2222`} {
			if !regexp.MustCompile(want).MatchString(first) {
				t.Fatalf("%s: report does not match %s:\n%s", when, want, first)
			}
		}
		return first
	}
	before := reports("before the failover", len(cfg.Nodes))
	t.Logf("Reservation Report, the same through all %d paths:\n%s", len(cfg.Nodes), before)

	killed, err := c.Kill(owner)
	if err != nil {
		t.Fatal(err)
	}
	var next string
	for deadline := time.Now().Add(time.Minute); ; {
		o, _, ph := ownerOf(ctx, c, array)
		if o != "" && o != owner && ph == "active" {
			next = o
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("array %s not taken over a minute after %s was killed: owner %q phase %q", array, owner, o, ph)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitOptimized(next)
	t.Logf("array %s on %s %v after %s was killed", array, next, time.Since(killed).Round(10*time.Millisecond), owner)
	if after := reports("after the failover", len(cfg.Nodes)-1); after != before {
		t.Fatalf("Reservation Report changed through the failover:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// host 2 fences the guest through a node that is not the owner; the
	// guest's writes (through the owner) are refused
	via := "A"
	for _, n := range []string{"A", "C", "D", "E", "B"} {
		if n != owner && n != next {
			via = n
			break
		}
	}
	hc, ns2 = dial(via)
	if err := ns2.Acquire(nvme.ResvPreemptAndAbort, nvme.ResvWriteExclusive, 0x2222, 0x1111); err != nil {
		t.Fatalf("host 2 preempts and aborts the guest through %s (the owner is %s): %v", via, next, err)
	}
	hc.Close()
	if out, rc, err := g.Exec("dd if=/dev/zero of=/dev/nvme0n1 bs=4k count=1 oflag=direct 2>&1", time.Minute); err != nil || rc == 0 {
		t.Fatalf("the fenced guest wrote (rc %d, err %v):\n%s", rc, err, out)
	}
	// the guest registers again and fences host 2 back through the owner;
	// host 2's writes are refused on every path
	sh("nvme resv-register /dev/nvme0n1 --nrkey=0x1111 --rrega=0 && nvme resv-acquire /dev/nvme0n1 --crkey=0x1111 --prkey=0x2222 --rtype=1 --racqa=2", time.Minute)
	sh("dd if=/dev/zero of=/dev/nvme0n1 bs=4k count=1 oflag=direct", time.Minute)
	for _, n := range cfg.Nodes {
		if n.Name == owner {
			continue
		}
		hc, ns := dial(n.Name)
		_, err := ns.WriteAt(make([]byte, ns.BlockSize()), 0)
		hc.Close()
		switch {
		case n.Name == next && !errors.Is(err, blockdev.ErrFenced):
			t.Errorf("fenced host 2 writes through the new owner %s: %v, want a reservation conflict", n.Name, err)
		case n.Name != next && err == nil:
			t.Errorf("fenced host 2 wrote through %s (not the owner)", n.Name)
		}
	}
	out := sh(guestResvReports, 2*time.Minute)
	if regexp.MustCompile(`(?i)rkey\s*:\s*(0x)?2222`).MatchString(out) {
		t.Errorf("host 2's registration still reported after the preempt:\n%s", out)
	}
	sh("nvme disconnect -n "+nqn, time.Minute)
}
