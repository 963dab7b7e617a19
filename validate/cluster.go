package validate

import (
	"log/slog"
	"path/filepath"
	"time"

	"tier0/daemon/config"
	"tier0/internal/localcluster"
)

// ErrPortBusy: a port the local cluster needs is taken by another program
// (localcluster.ErrPortBusy).
var ErrPortBusy = localcluster.ErrPortBusy

// localCluster runs one tier0d process per node of the site on this
// machine, as children of this process (internal/localcluster): logs in
// WORK/logs, the PID file in WORK, `--log-level info`. It is the
// nodeControl of a --local run.
type localCluster struct{ *localcluster.Procs }

func newLocalCluster(cfg *config.Config, bin, site, work string, log *slog.Logger) *localCluster {
	return &localCluster{localcluster.New(localcluster.Options{
		Binary: bin, Site: site, Workdir: work, LogDir: filepath.Join(work, "logs"),
		Args: []string{"--log-level", "info"}, PIDFile: filepath.Join(work, localcluster.PIDFile), Logger: log,
	})}
}

func (lc *localCluster) kill(node string) (time.Time, error) { return lc.Kill(node) }
func (lc *localCluster) start(node string) error             { return lc.Start(node) }

// absIn is p made absolute (as it is if that fails).
func absIn(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
