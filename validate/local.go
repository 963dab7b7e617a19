package validate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"tier0/bench"
	"tier0/daemon/api"
	"tier0/daemon/config"
	"tier0/internal/localcluster"
)

// LocalCluster is a whole site run on this machine, one tier0d process per
// node, for other packages' end-to-end tests (Slurm, the Linux guest,
// benches). It is the same machinery `tier0 validate --local` uses.
type LocalCluster struct {
	lc  *localCluster
	cfg *config.Config
}

// StartLocalCluster checks that the site's ports are free, clears the work
// files of an earlier run, starts every node's tier0d (binary tier0d) and
// returns once every array is active and optimal on its home node, or
// fails after timeout (the processes are then stopped).
func StartLocalCluster(ctx context.Context, site, tier0d, work string, timeout time.Duration, log *slog.Logger) (*LocalCluster, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	absSite, err := filepath.Abs(site)
	if err != nil {
		return nil, err
	}
	work, err = filepath.Abs(work)
	if err != nil {
		return nil, err
	}
	cfg, err := loadSite(absSite, work)
	if err != nil {
		return nil, err
	}
	if err := localcluster.CheckPorts(cfg); err != nil {
		return nil, err
	}
	if err := localcluster.CleanWork(cfg, work); err != nil {
		return nil, err
	}
	c := &LocalCluster{lc: newLocalCluster(cfg, tier0d, absSite, work, log), cfg: cfg}
	for _, n := range cfg.Nodes {
		if err := c.lc.start(n.Name); err != nil {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WaitOptimal(ctx, timeout); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Config is the loaded site configuration (work directory expanded).
func (c *LocalCluster) Config() *config.Config { return c.cfg }

// Kill sends SIGKILL to node's tier0d and returns when it is reaped, with
// the time of the kill.
func (c *LocalCluster) Kill(node string) (time.Time, error) { return c.lc.kill(node) }

// Start (re)starts node's tier0d with the same command line.
func (c *LocalCluster) Start(node string) error { return c.lc.start(node) }

// Stop stops every tier0d (SIGTERM, then SIGKILL after 10 s).
func (c *LocalCluster) Stop() { c.lc.Stop(10 * time.Second) }

// Status asks the nodes' APIs in turn for the cluster view.
func (c *LocalCluster) Status(ctx context.Context) (api.Status, error) {
	var last error
	for _, n := range c.cfg.Nodes {
		cl := api.NewClient("http://"+n.AdvertiseAddr(n.API), "", nil)
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := cl.Status(sctx)
		cancel()
		if err == nil {
			return st, nil
		}
		last = err
	}
	return api.Status{}, fmt.Errorf("no node answered: %w", last)
}

// WaitOptimal waits until every array is active and optimal on its home
// node.
func (c *LocalCluster) WaitOptimal(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	why := "no status yet"
	for time.Now().Before(deadline) {
		if st, err := c.Status(ctx); err == nil {
			ok, w := optimalAtHome(c.cfg, st)
			if ok {
				return nil
			}
			why = w
		} else {
			why = err.Error()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
	return fmt.Errorf("cluster not optimal after %v: %s", timeout, why)
}

func optimalAtHome(cfg *config.Config, st api.Status) (bool, string) {
	if len(st.Arrays) != len(cfg.Arrays) {
		return false, fmt.Sprintf("%d of %d arrays known", len(st.Arrays), len(cfg.Arrays))
	}
	for _, a := range st.Arrays {
		home := ""
		if ca, ok := cfg.Array(a.Name); ok {
			home = ca.Home
		}
		if a.Phase != "active" || a.State != "optimal" || a.Owner != home {
			return false, fmt.Sprintf("array %s: %s/%s on %q (home %s)", a.Name, a.State, a.Phase, a.Owner, home)
		}
	}
	return true, ""
}

// loadSite loads a site whose work directory is work (TIER0_WORK is set
// for the config's ${TIER0_WORK} references and for the children).
func loadSite(site, work string) (*config.Config, error) {
	if err := os.Setenv("TIER0_WORK", work); err != nil {
		return nil, err
	}
	return config.Load(site)
}

// FSThroughFailover runs, on c, the "file system through failover" check
// of `tier0 validate --local` (XFS in a Linux guest on the multipath
// device of victim's home array, a verified file workload through the
// kill -9 of victim's tier0d, its restart and the failback, then
// xfs_repair -n) and returns the check as validate records it. victim
// is restarted before it returns unless the check failed first.
func (c *LocalCluster) FSThroughFailover(ctx context.Context, victim string, out io.Writer) bench.Check {
	if out == nil {
		out = io.Discard
	}
	r := &runner{o: Options{Local: true, Out: out}, t: timingsFor(false), cfg: c.cfg, ctx: ctx, lc: c.lc, ctl: c.lc, victim: victim,
		down: map[string]bool{}, clients: map[string]*api.Client{}, log: slog.New(slog.DiscardHandler),
		res: bench.NewResults("fs-through-failover", c.cfg.Cluster, time.Now(), bench.Environment{})}
	for _, n := range c.cfg.Nodes {
		r.clients[n.Name] = api.NewClient("http://"+n.AdvertiseAddr(n.API), "", &httpClient)
	}
	r.fsFailover()
	return r.res.Checks[0]
}
