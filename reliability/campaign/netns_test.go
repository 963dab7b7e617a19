package campaign

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tier0/internal/testenv"
)

var netnsAddrs = map[string]string{"A": "10.77.0.1", "B": "10.77.0.2", "C": "10.77.0.3", "D": "10.77.0.4", "E": "10.77.0.5"}

const hubEnv = "TIER0_CAMPAIGN_IN_HUB"

// TestPartitionNetns cuts an owner off the network for real: every node in
// its own network namespace, the owner's link taken down until another
// node serves its array, then healed. The test sets up the namespaces and
// runs itself again inside the hub namespace, where the host side lives.
func TestPartitionNetns(t *testing.T) {
	if prefix := os.Getenv(hubEnv); prefix != "" {
		partitionInHub(t, prefix)
		return
	}
	if testing.Short() {
		t.Skip("starts a cluster of tier0d processes in network namespaces (~1 min); skipped with -short")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to create network namespaces (run as root, as make test does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Missing(t, "needs iproute2's ip command for network namespaces (apt-get install iproute2)")
	}
	bin := tier0d(t)
	prefix := fmt.Sprintf("t0c%d", os.Getpid()%100000)
	nn, err := SetupNetns(prefix, netnsAddrs)
	if err != nil {
		testenv.Missing(t, "cannot create network namespaces here: %v", err)
	}
	defer nn.Close()
	cmd := exec.Command("ip", "netns", "exec", nn.Hub, os.Args[0], "-test.run=^TestPartitionNetns$", "-test.v", "-test.timeout=4m")
	cmd.Env = append(os.Environ(), hubEnv+"="+prefix, "TIER0_CAMPAIGN_TIER0D="+bin)
	out, err := cmd.CombinedOutput()
	t.Logf("inside namespace %s:\n%s", nn.Hub, out)
	if err != nil {
		t.Fatalf("partition campaign inside the hub namespace: %v", err)
	}
}

func partitionInHub(t *testing.T, prefix string) {
	wd := keepDir(t)
	var out lockedBuilder
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, Options{
		Site: filepath.Join("testdata", "netns5.yaml"), Binary: os.Getenv("TIER0_CAMPAIGN_TIER0D"), Workdir: wd,
		Netns: NetnsFor(prefix, netnsAddrs), Faults: []string{PartitionOwner}, Seed: 3,
		RecoverBound: 90 * time.Second, RecoveryPace: 20 * time.Millisecond, Units: 512, Out: &out,
		Logger: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	t.Log("\n" + out.String())
	if err != nil {
		dumpLogs(t, wd)
		t.Fatal(err)
	}
	t.Log("\n" + res.Summary())
	if err := res.Err(); err != nil {
		dumpLogs(t, wd)
		t.Fatal(err)
	}
	in := res.Injections[0]
	if in.Failover <= 0 || !strings.Contains(in.Detail, "self-fenced true") {
		t.Fatalf("the cut-off owner did not fence itself: %+v", in)
	}
	if res.Final.Checked == 0 || res.Final.Verified != res.Final.Checked {
		t.Fatalf("verified %d of %d units", res.Final.Verified, res.Final.Checked)
	}
}
