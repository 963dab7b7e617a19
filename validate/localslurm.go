package validate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"tier0/internal/localslurm"
)

// localSlurmMissing says why a local Slurm cannot run here, or "".
func localSlurmMissing() string { return localslurm.Missing() }

// localSlurm is validate's throw-away Slurm cluster on this machine
// (internal/localslurm), whose Prolog, Epilog and HealthCheckProgram are
// the real hook wrappers (slurm-plugin/scripts) running a tier0 binary
// with a hooks configuration.
type localSlurm struct {
	*localslurm.Cluster
	conf  string // slurm.conf (SLURM_CONF)
	nodes []string
}

// hookWrapper is slurm-plugin/scripts/tier0-HOOK with its TIER0= and
// CONFIG= lines set: Slurm runs hooks without PATH, so every path is
// absolute.
func hookWrapper(hook, tier0, conf string) string {
	return fmt.Sprintf(`#!/bin/sh
# tier0 Slurm %s hook (slurm-plugin/scripts/tier0-%[1]s), written by tier0 validate --local-slurm
TIER0=%s
CONFIG=%s
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
exec "$TIER0" slurm %[1]s --config "$CONFIG"
`, hook, tier0, conf)
}

// startLocalSlurm starts munged, slurmctld and a slurmd for each of nodes
// (Slurm node names) under dir, with the hooks running tier0 (a binary)
// with the hooks configuration hooksConf, and returns once every node is
// idle. On an error what it started is stopped (and it returns nil).
func startLocalSlurm(ctx context.Context, dir string, nodes []string, tier0, hooksConf string) (*localSlurm, error) {
	bin := filepath.Join(dir, "bin")
	c, err := localslurm.New(ctx, localslurm.Options{Dir: dir, Nodes: nodes, ClusterName: "tier0validate",
		Comment: "A throw-away Slurm for tier0 validate --local-slurm (127.0.0.1 only)",
		Prolog:  filepath.Join(bin, "tier0-prolog"), Epilog: filepath.Join(bin, "tier0-epilog"), HealthCheck: filepath.Join(bin, "tier0-healthcheck")})
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"prolog", "epilog", "healthcheck"} {
		if err := os.WriteFile(filepath.Join(bin, "tier0-"+h), []byte(hookWrapper(h, tier0, hooksConf)), 0o755); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.StartSlurm(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return &localSlurm{Cluster: c, conf: c.Conf, nodes: c.Nodes}, nil
}

// job submits a batch job that runs `true` on every node (sbatch -N) and
// waits until it has COMPLETED; it returns the job ID.
func (s *localSlurm) job(ctx context.Context, timeout time.Duration) (string, error) {
	return s.Job(ctx, "tier0-validate", timeout)
}

func (s *localSlurm) waitFor(ctx context.Context, what string, d time.Duration, ok func() (bool, string)) error {
	return s.WaitFor(ctx, what, d, ok)
}

func (s *localSlurm) scontrol(ctx context.Context, args ...string) (string, error) {
	return s.Scontrol(ctx, args...)
}

// stop shuts Slurm down and ends its processes; a nil localSlurm is a
// no-op.
func (s *localSlurm) stop() {
	if s != nil {
		s.Stop()
	}
}
