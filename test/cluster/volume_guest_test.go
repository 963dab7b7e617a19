package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"tier0/daemon/api"
	"tier0/test/vm"
)

// TestLinuxHostVolume is issue 16's acceptance for volumes: on a running
// local cluster, array B's implicit volume is released and a volume carved
// from it; the Linux guest, connected to all five frontends, sees the new
// namespace on every path; fio verify passes on it; after kill -9 of B's
// owner the volume fails over with its pool and data written before reads
// back the same; `resize` grows it as the host sees (blockdev
// --getsize64); `delete` is refused while the guest holds a registration
// and succeeds with --force, and the namespace goes from the guest.
func TestLinuxHostVolume(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a guest and a five-node cluster (a few minutes); not in -short")
	}
	vm.Image(t) // skips with the reason when no guest can run here
	const array = "B"
	c, _ := startCluster(t)
	cfg := c.Config()
	nqn := cfg.SubsystemNQN(array)
	ctx := context.Background()
	clients := map[string]*api.Client{}
	for _, n := range cfg.Nodes {
		// the local site has no token: its APIs on loopback take changes
		clients[n.Name] = api.NewClient("http://"+n.AdvertiseAddr(n.API), "", nil)
	}
	owner, _, _ := ownerOf(ctx, c, array)
	if owner == "" {
		t.Fatalf("array %s has no owner", array)
	}
	// any live node other than the owner answers the API
	other := "A"
	if owner == "A" {
		other = "C"
	}
	cl := clients[other]
	waitVolume := func(name string, ok func(api.Volume, error) bool, what string) api.Volume {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; {
			v, err := cl.Volume(ctx, name)
			if ok(v, err) {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("volume %s not %s within a minute: %+v %v", name, what, v, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// carve the pool
	if _, err := cl.DeleteVolume(ctx, array, false); !errors.Is(err, api.ErrConflict) {
		t.Fatalf("deleting the implicit volume without --force: %v, want a conflict", err)
	}
	if _, err := cl.DeleteVolume(ctx, array, true); err != nil {
		t.Fatal(err)
	}
	waitVolume(array, func(_ api.Volume, err error) bool { return errors.Is(err, api.ErrNotFound) }, "removed from every node")

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
	sh(strings.Join(conn, "\n"), 2*time.Minute)

	// create: every path shows the namespace
	const size = 32 << 20
	v, err := cl.CreateVolume(ctx, "vol1", array, size)
	if err != nil {
		t.Fatal(err)
	}
	v = waitVolume("vol1", func(v api.Volume, err error) bool { return err == nil && v.State == "ready" }, "ready")
	rescan := `for c in /sys/class/nvme/nvme*; do nvme ns-rescan /dev/$(basename $c) 2>/dev/null; done
n=0; while [ $(ls -d /sys/class/nvme/nvme*/nvme*c*n1 2>/dev/null | wc -l) -lt 5 ] && [ $n -lt 300 ]; do sleep 0.2; n=$((n+1)); done
ls -d /sys/class/nvme/nvme*/nvme*c*n1 | wc -l
wait_dev /dev/nvme0n1 && blockdev --getsize64 /dev/nvme0n1`
	out := sh(rescan, 2*time.Minute)
	if f := strings.Fields(out); len(f) < 2 || f[len(f)-2] != "5" || f[len(f)-1] != strconv.Itoa(size) {
		t.Fatalf("after create the guest shows (paths, bytes) %q, want 5 paths and %d bytes", out, size)
	}
	t.Logf("volume vol1 (NSID %d, NGUID %s) on all 5 paths", v.NSID, v.NGUID)
	t.Log(sh("fio_verify /dev/nvme0n1 16M", 3*time.Minute))
	sum := sh("dd if=/dev/urandom of=/tmp/p bs=1M count=4 2>/dev/null && dd if=/tmp/p of=/dev/nvme0n1 bs=1M seek=20 oflag=direct 2>/dev/null && md5sum < /tmp/p", time.Minute)

	// fail over with the pool
	if _, err := c.Kill(owner); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		o, _, ph := ownerOf(ctx, c, array)
		if o != "" && o != owner && ph == "active" {
			t.Logf("array %s (and vol1) taken over by %s", array, o)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("array %s not taken over a minute after %s was killed: owner %q phase %q", array, owner, o, ph)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := sh("dd if=/dev/nvme0n1 bs=1M skip=20 count=4 iflag=direct 2>/dev/null | md5sum", 2*time.Minute); got != sum {
		t.Fatalf("vol1's data after the failover: md5 %q, want %q", got, sum)
	}

	// resize: the host sees the new size
	if _, err := cl.ResizeVolume(ctx, "vol1", size+16<<20); err != nil {
		t.Fatal(err)
	}
	waitVolume("vol1", func(v api.Volume, err error) bool { return err == nil && v.State == "ready" && v.Size == size+16<<20 }, "grown")
	grown := sh(fmt.Sprintf(`n=0; while [ "$(blockdev --getsize64 /dev/nvme0n1)" != %d ] && [ $n -lt 150 ]; do sleep 0.2; n=$((n+1)); done
blockdev --getsize64 /dev/nvme0n1`, size+16<<20), time.Minute)
	if strings.TrimSpace(grown) != strconv.Itoa(size+16<<20) {
		t.Fatalf("after resize the guest sees %s bytes, want %d", grown, size+16<<20)
	}

	// delete: refused while reserved, done with --force
	sh("nvme resv-register /dev/nvme0n1 --nrkey=0x5151 --rrega=0", time.Minute)
	_, err = cl.DeleteVolume(ctx, "vol1", false)
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "reservation registrant") {
		t.Fatalf("delete of a reserved volume without --force: %v, want a conflict naming the registrant", err)
	}
	if _, err := cl.DeleteVolume(ctx, "vol1", true); err != nil {
		t.Fatal(err)
	}
	// Every live path drops the namespace. (The multipath device itself
	// stays while the path to the killed node, reconnecting for ever with
	// --ctrl-loss-tmo=-1, still holds it: Linux's doing, not tier0's.)
	sh(`livens() { for c in /sys/class/nvme/nvme*; do [ "$(cat $c/state)" = live ] && ls -d $c/nvme*c*n1 2>/dev/null; done; }
for c in /sys/class/nvme/nvme*; do [ "$(cat $c/state)" = live ] && nvme ns-rescan /dev/$(basename $c) 2>/dev/null; done
n=0; while [ -n "$(livens)" ] && [ $n -lt 300 ]; do sleep 0.2; n=$((n+1)); done
[ -z "$(livens)" ] || { echo "live paths still holding the deleted namespace:"; livens; paths; exit 1; }`, 2*time.Minute)
	sh("nvme disconnect -n "+nqn, time.Minute)
}
