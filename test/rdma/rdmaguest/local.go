package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"tier0/daemon/api"
	"tier0/daemon/config"
	"tier0/internal/localcluster"
)

// guestCluster is the site's tier0d processes, one per node, run by
// internal/localcluster as children of this program in the guest's fresh
// work directory (nothing of an earlier run to clean: the guest boots
// empty), and the cluster view through a node's management API.
type guestCluster struct {
	cfg *config.Config
	*localcluster.Procs
}

// startGuestCluster loads site with TIER0_WORK=work, starts every node's
// tier0d (its output in work/logs/NODE.log) and waits until every array
// is active and optimal on its home node.
func startGuestCluster(ctx context.Context, site, tier0d, work string, timeout time.Duration) (*guestCluster, error) {
	if err := os.Setenv("TIER0_WORK", work); err != nil {
		return nil, err
	}
	cfg, err := config.Load(site)
	if err != nil {
		return nil, err
	}
	c := &guestCluster{cfg: cfg, Procs: localcluster.New(localcluster.Options{
		Binary: tier0d, Site: site, Workdir: work, LogDir: filepath.Join(work, "logs"), Args: []string{"--log-level", "info"},
	})}
	for _, n := range cfg.Nodes {
		if err := c.Start(n.Name); err != nil {
			c.Stop()
			return nil, err
		}
	}
	deadline := time.Now().Add(timeout)
	why := "no status yet"
	for time.Now().Before(deadline) {
		st, err := c.Status(ctx)
		if err == nil {
			if why = notOptimal(cfg, st); why == "" {
				return c, nil
			}
		} else {
			why = err.Error()
		}
		time.Sleep(500 * time.Millisecond)
	}
	c.Stop()
	return nil, fmt.Errorf("cluster not optimal %v after its start: %s", timeout, why)
}

// notOptimal says why st is not every array active and optimal on its
// home node ("" when it is).
func notOptimal(cfg *config.Config, st api.Status) string {
	if len(st.Arrays) != len(cfg.Arrays) {
		return fmt.Sprintf("%d of %d arrays known", len(st.Arrays), len(cfg.Arrays))
	}
	for _, a := range st.Arrays {
		ca, _ := cfg.Array(a.Name)
		if a.Phase != "active" || a.State != "optimal" || ca == nil || a.Owner != ca.Home {
			return fmt.Sprintf("array %s: %s/%s on %q", a.Name, a.State, a.Phase, a.Owner)
		}
	}
	return ""
}

// Config is the loaded site.
func (c *guestCluster) Config() *config.Config { return c.cfg }

// Stop stops every tier0d: SIGTERM, SIGKILL after 10 s.
func (c *guestCluster) Stop() { c.Procs.Stop(10 * time.Second) }

// Status asks the nodes' APIs in turn for the cluster view.
func (c *guestCluster) Status(ctx context.Context) (api.Status, error) {
	var last error
	for _, n := range c.cfg.Nodes {
		cl := api.NewClient("http://"+n.AdvertiseAddr(n.API), "", nil)
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cl.Status(sctx)
		cancel()
		if err == nil {
			return st, nil
		}
		last = err
	}
	return api.Status{}, fmt.Errorf("no node answered: %w", last)
}
