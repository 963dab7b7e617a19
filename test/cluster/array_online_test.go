package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/config"
	"tier0/internal/testenv"
)

// onlineSite is TestArrayOnline's four-node site: array S (home D) on A1 B1
// C1, leaving A2 B2 C2 free.
const onlineSite = "testdata/online4.yaml"

// TestArrayOnline is issue 16's multi-node proof of online pools: real
// tier0d processes and etcd, driven only by the tier0 CLI through the
// token-authenticated API.
//
//   - `tier0 array create P --members 3 --home D --no-volume` places a
//     RAID-5 pool on the free drives A2 B2 C2 (a wrong token is refused);
//     every node serves it and D assembles it, optimal; `tier0 config
//     export` writes it as a site array on those drives.
//   - `tier0 volume create vol1 --pool P`; `tier0 fabric io` writes and
//     verifies it through D's frontend.
//   - kill -9 of D: the pool fails over; the data verifies through the new
//     owner's frontend.
//   - `tier0 array delete P` is refused naming vol1; C (a member's node) is
//     killed; `--force` deletes on the live nodes: vol1 is gone, A2 and B2
//     are wiped at once, C2 keeps its superblock while C is down, and C2
//     and the name P stay taken; C comes back, never serves P, and wipes
//     C2; the record goes.
//   - D returns; `tier0 array create P` again lands on the same three
//     drives (blank again, so created afresh) with its spanning volume,
//     which is written and verified; `--force` delete wipes them all.
func TestArrayOnline(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a four-node cluster (a minute or two); not in -short")
	}
	bins := testenv.Binaries(t, "tier0d", "tier0")
	if p := os.Getenv("TIER0_TEST_TIER0D"); p != "" {
		bins[0] = p // e.g. one built with -race: every node's log is checked for races at the end
	}
	t.Setenv("TIER0_TOKEN", "online-test-token") // the tier0d processes and the CLI read it
	c, work := startSite(t, onlineSite, bins[0])
	cfg := c.Config()
	site, err := filepath.Abs(onlineSite)
	if err != nil {
		t.Fatal(err)
	}
	cli := &onlineCLI{t: t, bin: bins[1], site: site, start: time.Now()}
	nqn := cfg.SubsystemNQN("P")
	frontend := func(node string) string {
		nd, _ := cfg.Node(node)
		return fmt.Sprintf("127.0.0.1:%d", nd.Frontend.Port)
	}
	members := []string{"A2", "B2", "C2"}

	// create: the API wants the token
	if out, err := cli.run("array", "create", "P", "--members", "3", "--home", "D", "--token", "wrong"); err == nil || !strings.Contains(out, "401") {
		t.Fatalf("array create with a wrong token: %v\n%s\nwant a refusal (401)", err, out)
	}
	var oa api.OnlineArray
	cli.json(&oa, "array", "create", "P", "--members", "3", "--home", "D", "--no-volume")
	if got := slices.Sorted(slices.Values(oa.Members)); oa.Phase != "active" || !slices.Equal(got, members) || oa.Home != "D" || oa.Level != "raid5" {
		t.Fatalf("array create answered %+v, want raid5 home D on %v, active", oa, members)
	}
	cli.waitArray("P", "assembled optimal at its home D", func(a *api.Array) bool {
		return a != nil && a.Owner == "D" && a.Phase == "active" && a.State == "optimal"
	})

	// the live state exports P as a site array on the drives it holds
	export := filepath.Join(t.TempDir(), "site-now.yaml")
	cli.mustRun("config", "export", "-o", export)
	if ecfg, err := config.Load(export); err != nil {
		t.Fatalf("the exported site file: %v", err)
	} else if ea, ok := ecfg.Array("P"); !ok || !slices.Equal(ea.Members, oa.Members) || ea.Home != "D" {
		t.Fatalf("the exported site file has array P %+v (found %v), want home D on %v", ea, ok, oa.Members)
	}

	// a volume, written and verified through the owner
	var v api.Volume
	cli.json(&v, "volume", "create", "vol1", "--pool", "P", "--size", "16M")
	for deadline := time.Now().Add(time.Minute); v.State != "ready"; {
		if time.Now().After(deadline) {
			t.Fatalf("volume vol1 not ready a minute after its create: %+v", v)
		}
		time.Sleep(300 * time.Millisecond)
		cli.json(&v, "volume", "show", "vol1")
	}
	nsid := fmt.Sprint(v.NSID)
	io := func(node, op string) {
		t.Helper()
		cli.mustRun("fabric", "io", "--connect", frontend(node), "--nqn", nqn, "--nsid", nsid, op,
			"--length", "8M", "--pattern", "16", "--timeout", "90s")
	}
	io("D", "--write")
	io("D", "--verify")

	// kill -9 of the owner: the pool fails over with its volume
	if _, err := c.Kill("D"); err != nil {
		t.Fatal(err)
	}
	p := cli.waitArray("P", "taken over from D", func(a *api.Array) bool {
		return a != nil && a.Owner != "" && a.Owner != "D" && a.Phase == "active"
	})
	t.Logf("P taken over by %s", p.Owner)
	io(p.Owner, "--verify")

	// delete: refused while vol1 exists, naming it
	if out, err := cli.run("array", "delete", "P"); err == nil || !strings.Contains(out, "vol1") {
		t.Fatalf("array delete of a pool with a volume: %v\n%s\nwant a refusal naming vol1", err, out)
	}
	// a member's node down during the forced delete keeps its superblock
	if _, err := c.Kill("C"); err != nil {
		t.Fatal(err)
	}
	var del api.OnlineArray
	cli.json(&del, "array", "delete", "P", "--force")
	if del.Phase != "deleting" || !slices.Equal(del.Unwiped, []string{"C2 (node C)"}) || !slices.Contains(del.Volumes, "vol1") {
		t.Fatalf("array delete --force with C down answered %+v, want deleting, only C2 (node C) unwiped, vol1 removed", del)
	}
	if out, err := cli.run("volume", "show", "vol1"); err == nil {
		t.Fatalf("volume vol1 still shown after its pool's forced delete:\n%s", out)
	}
	for _, d := range []string{"A2", "B2"} {
		if !blankHead(t, cfg, d) {
			t.Fatalf("drive %s still holds a superblock after the delete", d)
		}
	}
	if blankHead(t, cfg, "C2") {
		t.Fatal("drive C2 was wiped while its node C was down: the test did not kill C")
	}
	if out, err := cli.run("array", "create", "Q", "--members", "3", "--home", "D"); err == nil || !strings.Contains(out, "C2 (array P being deleted)") {
		t.Fatalf("array create while C2 still holds P's superblock: %v\n%s\nwant a refusal naming C2 as not free yet", err, out)
	}
	if out, err := cli.run("array", "create", "P", "--members", "3", "--home", "D"); err == nil || !strings.Contains(out, "still being deleted") {
		t.Fatalf("array create of P while P's record waits for C: %v\n%s\nwant a refusal: the name is still being deleted", err, out)
	}
	// C returns: it never serves P and wipes C2
	before := len(nodeLog(t, work, "C"))
	if err := c.Start("C"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); !blankHead(t, cfg, "C2"); {
		if time.Now().After(deadline) {
			t.Fatal("drive C2 not wiped a minute after its node C came back")
		}
		time.Sleep(300 * time.Millisecond)
	}
	cli.waitArray("P", "gone from the cluster", func(a *api.Array) bool { return a == nil })
	after := nodeLog(t, work, "C")[before:]
	if strings.Contains(after, `msg="online array served" node=C array=P `) {
		t.Fatalf("C served the deleted array P on its return:\n%s", after)
	}
	if !strings.Contains(after, `msg="member drive wiped" node=C array=P drive=C2`) {
		t.Fatalf("C's log since its return does not say it wiped C2 for P:\n%s", after)
	}

	// D returns; the same drives take a new P, created afresh
	if err := c.Start("D"); err != nil {
		t.Fatal(err)
	}
	cli.waitArray("S", "back at its home D", func(a *api.Array) bool {
		return a != nil && a.Owner == "D" && a.Phase == "active"
	})
	cli.json(&oa, "array", "create", "P", "--members", "3", "--home", "D")
	if got := slices.Sorted(slices.Values(oa.Members)); !slices.Equal(got, members) {
		t.Fatalf("the second array create placed P on %v, want the wiped drives %v", oa.Members, members)
	}
	cli.waitArray("P", "created again and optimal at D", func(a *api.Array) bool {
		return a != nil && a.Owner == "D" && a.Phase == "active" && a.State == "optimal"
	})
	nsid = "1" // the spanning volume
	io("D", "--write")
	io("D", "--verify")
	cli.json(&del, "array", "delete", "P", "--force")
	if del.Phase != "deleted" {
		t.Fatalf("the second array delete --force answered %+v, want deleted", del)
	}
	for _, d := range members {
		if !blankHead(t, cfg, d) {
			t.Fatalf("drive %s still holds a superblock after the second delete", d)
		}
	}
	for _, nd := range cfg.Nodes {
		if log := nodeLog(t, work, nd.Name); strings.Contains(log, "WARNING: DATA RACE") {
			t.Errorf("node %s's tier0d reported a data race (TIER0_TEST_TIER0D built with -race):\n%s", nd.Name, log[strings.Index(log, "WARNING: DATA RACE"):])
		}
	}
}

// TestArrayOnlineEmptySite is docs/OPERATIONS.md's provisioning from an
// empty cluster, up to the host: a site file with no arrays starts
// healthy; `tier0 array create a --members 3 --no-volume` (home: the
// default) assembles optimal; `tier0 volume create scratch --pool a`
// becomes ready and is written and verified through the owner's frontend.
func TestArrayOnlineEmptySite(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a four-node cluster; not in -short")
	}
	bins := testenv.Binaries(t, "tier0d", "tier0")
	t.Setenv("TIER0_TOKEN", "empty-test-token")
	const empty = "testdata/empty4.yaml"
	c, _ := startSite(t, empty, bins[0])
	site, err := filepath.Abs(empty)
	if err != nil {
		t.Fatal(err)
	}
	cli := &onlineCLI{t: t, bin: bins[1], site: site, start: time.Now()}
	var arrays []api.Array
	cli.json(&arrays, "array", "list")
	if len(arrays) != 0 {
		t.Fatalf("the empty site's cluster lists arrays %+v, want none", arrays)
	}
	var oa api.OnlineArray
	cli.json(&oa, "array", "create", "a", "--members", "3", "--no-volume")
	if oa.Phase != "active" || len(oa.Members) != 3 || oa.Home == "" {
		t.Fatalf("array create answered %+v, want 3 members, a home, active", oa)
	}
	a := cli.waitArray("a", "optimal at its home", func(a *api.Array) bool {
		return a != nil && a.Owner == oa.Home && a.Phase == "active" && a.State == "optimal"
	})
	var v api.Volume
	cli.json(&v, "volume", "create", "scratch", "--pool", "a", "--size", "16M")
	for deadline := time.Now().Add(time.Minute); v.State != "ready"; {
		if time.Now().After(deadline) {
			t.Fatalf("volume scratch not ready a minute after its create: %+v", v)
		}
		time.Sleep(300 * time.Millisecond)
		cli.json(&v, "volume", "show", "scratch")
	}
	nd, _ := c.Config().Node(a.Owner)
	for _, op := range []string{"--write", "--verify"} {
		cli.mustRun("fabric", "io", "--connect", fmt.Sprintf("127.0.0.1:%d", nd.Frontend.Port), "--nqn", v.SubNQN,
			"--nsid", fmt.Sprint(v.NSID), op, "--length", "16M", "--pattern", "3", "--timeout", "90s")
	}
}

// onlineCLI runs the tier0 CLI against the test's site.
type onlineCLI struct {
	t     *testing.T
	bin   string
	site  string
	start time.Time // the cluster is up: logged commands say how long after
}

// run runs tier0 with args and --site (management verbs) and returns its
// combined output.
func (c *onlineCLI) run(args ...string) (string, error) {
	c.t.Helper()
	if args[0] == "array" || args[0] == "volume" || args[0] == "config" {
		args = append(args, "--site", c.site)
	}
	cmd := exec.Command(c.bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	c.t.Logf("[%4.1fs] $ tier0 %s\n%s", time.Since(c.start).Seconds(), strings.Join(args, " "), strings.TrimSpace(out.String()))
	return out.String(), err
}

func (c *onlineCLI) mustRun(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("tier0 %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// json runs tier0 --json args and decodes its output into v.
func (c *onlineCLI) json(v any, args ...string) {
	c.t.Helper()
	cmd := exec.Command(c.bin, append(append([]string{"--json"}, args...), "--site", c.site)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	c.t.Logf("[%4.1fs] $ tier0 --json %s\n%s%s", time.Since(c.start).Seconds(), strings.Join(args, " "), strings.TrimSpace(out.String()), strings.TrimSpace(errOut.String()))
	if err != nil {
		c.t.Fatalf("tier0 --json %s: %v", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal(out.Bytes(), v); err != nil {
		c.t.Fatalf("tier0 --json %s: %v in %q", strings.Join(args, " "), err, out.String())
	}
}

// waitArray polls `tier0 array list` until ok holds for array name (nil:
// not listed), up to a minute and a half.
func (c *onlineCLI) waitArray(name, what string, ok func(*api.Array) bool) *api.Array {
	c.t.Helper()
	var last string
	for deadline := time.Now().Add(90 * time.Second); ; {
		cmd := exec.Command(c.bin, "--json", "array", "list", "--site", c.site)
		var out bytes.Buffer
		cmd.Stdout = &out
		var arrays []api.Array
		if err := cmd.Run(); err == nil && json.Unmarshal(out.Bytes(), &arrays) == nil {
			var a *api.Array
			for i := range arrays {
				if arrays[i].Name == name {
					a = &arrays[i]
				}
			}
			if ok(a) {
				return a
			}
			if a != nil {
				last = fmt.Sprintf("%s/%s on %q (%s)", a.State, a.Phase, a.Owner, a.Reason)
			} else {
				last = "not listed"
			}
		} else {
			last = fmt.Sprintf("array list: %v", err)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("array %s not %s within 90 s: last %s", name, what, last)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// blankHead reports whether drive d's file has only zeroes in its first
// 8 KiB: the two RAID superblock slots.
func blankHead(t *testing.T, cfg *config.Config, d string) bool {
	t.Helper()
	_, drv, ok := cfg.Drive(d)
	if !ok {
		t.Fatalf("drive %s is not in the site", d)
	}
	f, err := os.Open(drv.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 8192)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte{0}) == len(b)
}

// nodeLog is node's tier0d log so far.
func nodeLog(t *testing.T, work, node string) string {
	b, err := os.ReadFile(filepath.Join(work, "logs", node+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
