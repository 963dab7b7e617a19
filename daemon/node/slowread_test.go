package node

import (
	"bytes"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"tier0/daemon/blockdev"
	"tier0/daemon/config"
	"tier0/daemon/raid"
)

// policySite is the smallest site file that parses, with the policies given.
func policySite(t testing.TB, policies string) *config.Config {
	t.Helper()
	site := fmt.Sprintf(`cluster: t
workdir: %s
nodes:
  - {name: A, address: 127.0.0.1, backend: {port: 14420}, frontend: {port: 14421}, api: {port: 14422}}
control_plane:
  etcd: {peers: [A]}
policies: %s
`, t.TempDir(), policies)
	cfg, err := config.Parse("site.yaml", []byte(site))
	if err != nil {
		t.Fatalf("site config: %v", err)
	}
	return cfg
}

// TestRaidPolicyReadsAroundAHungMember: with the daemon's raid policy, a
// RAID-5 member that stops answering reads (its node died without closing
// its connections) costs a read the slow-read deadline, not the member
// I/O timeout: every read returns, with the right data, while the member
// still holds its requests (issue 15: no array stalls on one member).
// member_io_timeout is an hour here, so a read that waited for it would
// trip the test's hang bound.
func TestRaidPolicyReadsAroundAHungMember(t *testing.T) {
	cfg := policySite(t, "{member_io_timeout: 1h}")
	if got := cfg.Policies.MemberSlowRead.D(); got != config.DefaultMemberSlowRead {
		t.Fatalf("member_slow_read default %v, want %v", got, config.DefaultMemberSlowRead)
	}
	n := &Node{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	pol := n.raidPolicy(&served{n: n, cfg: &config.Array{Name: "x"}})
	pol.Listener = nil
	const chunk, members = 16 << 10, 4
	devs := make([]blockdev.Device, members)
	hung := blockdev.NewFault(blockdev.NewMem(4<<20, 512))
	for i := range devs {
		devs[i] = blockdev.NewMem(4<<20, 512)
	}
	devs[2] = hung
	a, err := raid.Create(devs, raid.Config{Level: raid.RAID5, ChunkSize: chunk, AssumeClean: true, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	data := make([]byte, 4*(members-1)*chunk) // four stripes
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	if _, err := a.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	hung.AddRule(blockdev.Rule{Op: blockdev.OpRead, Action: blockdev.Delay, Delay: time.Hour})
	defer hung.ClearRules()
	for off := 0; off < len(data); off += 4096 {
		done := make(chan error, 1)
		got := make([]byte, 4096)
		go func() { _, err := a.ReadAt(got, int64(off)); done <- err }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("read at %d with member 2 hung: %v", off, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("read at %d waits for the hung member (policy SlowRead %v, IOTimeout %v): reads are not routed around a member that stopped answering", off, pol.SlowRead, pol.IOTimeout)
		}
		if !bytes.Equal(got, data[off:off+4096]) {
			t.Fatalf("read at %d with member 2 hung returned other data", off)
		}
	}
	if hung.Fired() == 0 {
		t.Fatal("no read reached the hung member: the test proves nothing")
	}
}
