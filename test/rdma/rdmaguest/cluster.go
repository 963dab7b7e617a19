package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// fioLoop runs fio verify back to back on $DEV until /tmp/stopfio exists
// (at least one run): 4 KiB random writes then 1 MiB sequential writes over
// the first 4 MiB, each job reading back and checking (crc32c, fatal) every
// block it wrote, i.e. every write the device acknowledged. It counts
// finished runs in /tmp/fio-runs and writes its exit status to
// /tmp/fio-bg.rc last.
const fioLoop = `
rc=0; n=0
while [ ! -e /tmp/stopfio ] || [ $n -eq 0 ]; do
    fio --name=rand4k --filename=$DEV --size=4M --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --randrepeat=0 --output-format=terse --terse-version=3 > /tmp/f1 || { rc=1; break; }
    fio --name=seq1m --filename=$DEV --size=4M --rw=write --bs=1M --iodepth=4 --ioengine=libaio --direct=1 \
        --verify=crc32c --do_verify=1 --verify_fatal=1 --output-format=terse --terse-version=3 > /tmp/f2 || { rc=1; break; }
    n=$((n+1)); echo $n > /tmp/fio-runs.tmp && mv /tmp/fio-runs.tmp /tmp/fio-runs
    awk -F';' -v n=$n '{printf "fio run %d %s: write %s KiB/s, errors %s, longest write %.0f ms\n", n, $3, $48, $5, $80/1000}' /tmp/f1 /tmp/f2
done
echo "fio verify runs: $n, rc $rc"
echo $rc > /tmp/fio-bg.rc.tmp && mv /tmp/fio-bg.rc.tmp /tmp/fio-bg.rc
`

// clusterFailover is the kill-the-owner failover of the site's array B
// over NVMe/RDMA on both fabrics, all inside this guest: the site's tier0d
// processes (guestCluster), Linux's nvme-rdma host connected to every
// node's frontend (one native multipath device, ANA), tier0's own RDMA host (tier0 fabric io)
// writing a known pattern through the owner, and fio verify running while
// the owner's tier0d is killed with SIGKILL. It passes when a survivor
// took the array over, fio finished the runs that spanned the kill and one
// after it without an I/O error and with every block verified, the
// pattern reads back through the new owner, and the guest kernel held I/O
// while no path was usable (the kill really landed under I/O).
func clusterFailover(site, tier0d, tier0, work string) error {
	const array, victim = "B", "B"
	ctx := context.Background()
	t0 := time.Now()
	c, err := startGuestCluster(ctx, site, tier0d, work, 5*time.Minute)
	if err != nil {
		nodeLogs(work, 40)
		return fmt.Errorf("starting the cluster of %s: %w", site, err)
	}
	defer c.Stop()
	fmt.Printf("PASS cluster up: %d tier0d, array %s active and optimal on %s, %v after the start\n",
		len(c.Config().Nodes), array, victim, time.Since(t0).Round(time.Second))
	if c.Config().Fabrics.Backend.DHCHAPSecret != "" {
		// the backend targets require DH-HMAC-CHAP: every member import
		// (daemon/host over rdma.Transport) authenticated to come up
		n := 0
		files, _ := filepath.Glob(filepath.Join(work, "logs", "*.log"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			n += strings.Count(string(b), "msg=\"host authenticated\"")
		}
		if n == 0 {
			nodeLogs(work, 40)
			return errors.New("fabrics.backend.dhchap_secret is set, but no backend target logged a host authenticated")
		}
		fmt.Printf("PASS members authenticated over RDMA: %d DH-HMAC-CHAP authentications in the nodes' logs\n", n)
	}
	if err := failover(ctx, c, array, victim, tier0); err != nil {
		st, serr := c.Status(ctx)
		fmt.Printf("cluster status: %+v (err %v)\n", st.Arrays, serr)
		out, _ := sh("dmesg | grep -iE 'nvme|rdma|rxe' | tail -40; cat /tmp/fio-bg.log 2>/dev/null")
		fmt.Print(out)
		nodeLogs(work, 30)
		return err
	}
	return nil
}

func failover(ctx context.Context, c *guestCluster, array, victim, tier0 string) error {
	cfg := c.Config()
	nqn := cfg.SubsystemNQN(array)
	port := map[string]int{}
	for _, n := range cfg.Nodes {
		port[n.Name] = n.Frontend.Port
		// ctrl-loss-tmo=-1: the kernel never gives the dead node's
		// controller up, and I/O without a usable path is requeued, not
		// failed; keep-alive 30 s: an emulated keep-alive can be late.
		if out, err := sh(fmt.Sprintf("nvme connect -t rdma -a 10.0.2.15 -s %d -n %s --nr-io-queues=1 --queue-size=32 --ctrl-loss-tmo=-1 --reconnect-delay=2 --keep-alive-tmo=30",
			n.Frontend.Port, nqn)); err != nil {
			return fmt.Errorf("nvme connect -t rdma to node %s's frontend (port %d): %v\n%s", n.Name, n.Frontend.Port, err, out)
		}
	}
	dev, err := waitPaths(nqn, port[victim], 2*time.Minute)
	if err != nil {
		return err
	}
	fmt.Printf("PASS Linux nvme-rdma host: one multipath device %s over %d RDMA paths, %s's optimized\n", dev, len(cfg.Nodes), victim)

	// tier0's own NVMe/RDMA host writes a known pattern through the owner
	// (16-24 MiB, beside fio's first 8 MiB): acknowledged before the kill,
	// read back through the new owner after it.
	pattern := func(op string, node string) error {
		out, err := run(tier0, "fabric", "io", "--transport", "rdma", "--connect", fmt.Sprintf("10.0.2.15:%d", port[node]), "--nqn", nqn,
			op, "--offset", "16M", "--length", "8M", "--block", "256K", "--pattern", "18")
		if err != nil {
			return fmt.Errorf("tier0 fabric io --transport rdma %s through node %s: %v\n%s", op, node, err, out)
		}
		return nil
	}
	if err := pattern("--write", victim); err != nil {
		return err
	}
	fmt.Printf("PASS tier0 fabric io --transport rdma: 8 MiB pattern written through owner %s\n", victim)

	bg := exec.Command("sh", "-c", fioLoop)
	bg.Env = append(os.Environ(), "DEV="+dev)
	logf, err := os.Create("/tmp/fio-bg.log")
	if err != nil {
		return err
	}
	defer logf.Close()
	bg.Stdout, bg.Stderr = logf, logf
	if err := bg.Start(); err != nil {
		return err
	}
	defer func() { _ = os.WriteFile("/tmp/stopfio", []byte("stop\n"), 0o644); _ = bg.Wait() }()
	// One whole fio run first (the cluster serves verified I/O), then the
	// kill lands in the next one.
	if err := waitRuns(1, 5*time.Minute); err != nil {
		return err
	}
	killed, err := c.Kill(victim)
	if err != nil {
		return err
	}
	atKill := fioRuns()
	fmt.Printf("killed %s's tier0d (owner of array %s) with SIGKILL during fio run %d\n", victim, array, atKill+1)
	owner := ""
	for deadline := time.Now().Add(3 * time.Minute); owner == ""; {
		if st, err := c.Status(ctx); err == nil {
			for _, a := range st.Arrays {
				if a.Name == array && a.Owner != "" && a.Owner != victim && a.Phase == "active" {
					owner = a.Owner
					fmt.Printf("PASS takeover: array %s active on %s (%s, epoch %d) %v after the kill\n", array, a.Owner, a.State, a.Epoch, time.Since(killed).Round(100*time.Millisecond))
				}
			}
		}
		if owner == "" && time.Now().After(deadline) {
			return fmt.Errorf("array %s not taken over 3 minutes after %s was killed", array, victim)
		}
		if owner == "" {
			time.Sleep(time.Second)
		}
	}
	if _, err := waitPaths(nqn, port[owner], 2*time.Minute); err != nil {
		return fmt.Errorf("after the takeover by %s: %w", owner, err)
	}
	fmt.Printf("PASS Linux nvme-rdma host: %s's path optimized %v after the kill\n", owner, time.Since(killed).Round(100*time.Millisecond))
	// The run that spanned the kill, and one whole run on the new owner.
	if err := waitRuns(atKill+2, 5*time.Minute); err != nil {
		return err
	}
	_ = os.WriteFile("/tmp/stopfio", []byte("stop\n"), 0o644)
	if err := bg.Wait(); err != nil {
		return fmt.Errorf("fio loop: %v", err)
	}
	if rc, _ := os.ReadFile("/tmp/fio-bg.rc"); strings.TrimSpace(string(rc)) != "0" {
		return errors.New("fio verify failed through the failover (log above)")
	}
	log, _ := os.ReadFile("/tmp/fio-bg.log")
	fmt.Print(string(log))
	fmt.Printf("PASS fio verify through the kill of %s: %d runs, every block written read back and checked, no I/O error\n", victim, fioRuns())
	if err := pattern("--verify", owner); err != nil {
		return err
	}
	fmt.Printf("PASS tier0 fabric io --transport rdma: the pattern written through %s verified through %s\n", victim, owner)
	held, _ := sh("dmesg | grep -c 'no usable path - requeuing I/O'; true")
	ioErrs, _ := sh(fmt.Sprintf("dmesg | grep -c 'I/O error, dev %s,'; true", filepath.Base(dev)))
	held, ioErrs = strings.TrimSpace(held), strings.TrimSpace(ioErrs)
	if held == "0" {
		return fmt.Errorf("the guest kernel never held I/O for want of a usable path: fio was not writing when %s was killed", victim)
	}
	if ioErrs != "0" {
		return fmt.Errorf("the guest kernel logged %s I/O errors on %s", ioErrs, dev)
	}
	fmt.Printf("PASS guest kernel: I/O held without a usable path (%s rate-limited lines), no I/O error on %s\n", held, dev)
	sh("nvme disconnect -n " + nqn)
	return nil
}

// waitPaths waits until nqn has exactly one block device (the multipath
// head) and the path through frontend port optimal is live and optimized,
// and returns the device.
func waitPaths(nqn string, optimal int, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		var devs []string
		blocks, _ := filepath.Glob("/sys/block/nvme*n*")
		for _, b := range blocks {
			if strings.Contains(strings.TrimPrefix(filepath.Base(b), "nvme"), "c") {
				continue // a path's hidden device (nvme0c0n1)
			}
			if readTrim(filepath.Join(b, "device", "subsysnqn")) == nqn || readTrim(filepath.Join(b, "device", "..", "subsysnqn")) == nqn {
				devs = append(devs, "/dev/"+filepath.Base(b))
			}
		}
		ok := false
		var states []string
		ctrls, _ := filepath.Glob("/sys/class/nvme/nvme*")
		sort.Strings(ctrls)
		for _, c := range ctrls {
			addr := readTrim(filepath.Join(c, "address"))
			ns, _ := filepath.Glob(filepath.Join(c, "nvme*c*n1"))
			ana := "none"
			if len(ns) > 0 {
				ana = readTrim(filepath.Join(ns[0], "ana_state"))
			}
			st := readTrim(filepath.Join(c, "state"))
			states = append(states, fmt.Sprintf("%s %s %s", addr, st, ana))
			if strings.Contains(addr, "trsvcid="+strconv.Itoa(optimal)) && st == "live" && ana == "optimized" {
				ok = true
			}
		}
		last = fmt.Sprintf("devices %v, paths %v", devs, states)
		if len(devs) == 1 && ok {
			return devs[0], nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("want one multipath device for %s with port %d live and optimized after %v: %s", nqn, optimal, timeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitRuns waits until fio finished n runs; it fails when fio stopped.
func waitRuns(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for fioRuns() < n {
		if _, err := os.Stat("/tmp/fio-bg.rc"); err == nil {
			log, _ := os.ReadFile("/tmp/fio-bg.log")
			f1, _ := os.ReadFile("/tmp/f1")
			f2, _ := os.ReadFile("/tmp/f2")
			return fmt.Errorf("fio verify stopped after %d runs (want %d):\n%s\n%s\n%s", fioRuns(), n, log, f1, f2)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fio finished %d runs in %v, want %d", fioRuns(), timeout, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	return nil
}

func fioRuns() int {
	n, _ := strconv.Atoi(readTrim("/tmp/fio-runs"))
	return n
}

func readTrim(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// sh runs a shell command, printing nothing; its output is returned.
func sh(cmd string) (string, error) { return run("sh", "-c", cmd) }

// nodeLogs prints the last n lines of every node's log.
func nodeLogs(work string, n int) {
	files, _ := filepath.Glob(filepath.Join(work, "logs", "*.log"))
	sort.Strings(files)
	for _, f := range files {
		b, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		fmt.Printf("--- %s (last %d lines)\n%s\n", filepath.Base(f), len(lines), strings.Join(lines, "\n"))
	}
}
