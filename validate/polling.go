package validate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"tier0/bench"
	"tier0/daemon/api"
)

// startCluster starts every node and waits for the cluster.
func (r *runner) startCluster() error {
	for _, n := range r.cfg.Nodes {
		if err := r.lc.start(n.Name); err != nil {
			r.check(CheckClusterUp, bench.Fail, err.Error())
			return err
		}
	}
	return r.clusterUp()
}

// healthy is the condition "every array active and optimal on its home".
func (r *runner) healthy(st api.Status) (bool, string) {
	if len(st.Arrays) != len(r.arrays) {
		return false, fmt.Sprintf("%d of %d arrays known", len(st.Arrays), len(r.arrays))
	}
	var wrong []string
	for _, a := range st.Arrays {
		if a.Phase != "active" || a.State != "optimal" || a.Owner != a.Home {
			wrong = append(wrong, fmt.Sprintf("%s: %s/%s on %q (home %s)", a.Name, a.State, a.Phase, a.Owner, a.Home))
		}
	}
	if len(wrong) > 0 {
		return false, "arrays not active and optimal on their home: " + strings.Join(wrong, "; ")
	}
	return true, ""
}

func (r *runner) clusterUp() error {
	t0 := time.Now()
	st, err := r.waitFor(r.t.boot, r.healthy)
	if err != nil {
		err = fmt.Errorf("cluster not up after %s: %w", r.t.boot, err)
		r.check(CheckClusterUp, bench.Fail, err.Error())
		return err
	}
	r.check(CheckClusterUp, bench.Pass, fmt.Sprintf("%d nodes, %d arrays active and optimal on their home nodes after %.1f s (coordinator %s)", len(st.Nodes), len(st.Arrays), time.Since(t0).Seconds(), st.Coordinator))
	return nil
}

// status asks the first node that answers.
func (r *runner) status() (api.Status, error) {
	var errs []error
	for _, n := range r.cfg.Nodes {
		if r.down[n.Name] {
			continue
		}
		ctx, cancel := context.WithTimeout(r.ctx, 3*time.Second)
		st, err := r.clients[n.Name].Status(ctx)
		cancel()
		if err == nil {
			return st, nil
		}
		errs = append(errs, fmt.Errorf("node %s: %w", n.Name, err))
	}
	return api.Status{}, errors.Join(errs...)
}

// waitFor polls the cluster status until cond holds, the timeout passes
// (the error says what was still wrong) or ctx ends.
func (r *runner) waitFor(timeout time.Duration, cond func(api.Status) (bool, string)) (api.Status, error) {
	deadline := time.Now().Add(timeout)
	why := "no answer yet"
	for {
		st, err := r.status()
		if err == nil {
			ok, w := cond(st)
			if ok {
				return st, nil
			}
			why = w
		} else {
			why = oneLine(err.Error(), 300)
		}
		if r.lc != nil {
			if ex := r.lc.Exited(); len(ex) > 0 {
				var unexpected []string
				for _, e := range ex {
					if !r.down[strings.Fields(e)[0]] {
						unexpected = append(unexpected, e)
					}
				}
				if len(unexpected) > 0 {
					return st, fmt.Errorf("tier0d exited: %s (see %s); last state: %s", strings.Join(unexpected, ", "), r.lc.LogDir(), why)
				}
			}
		}
		if time.Now().After(deadline) {
			return st, errors.New(why)
		}
		select {
		case <-r.ctx.Done():
			return st, r.ctx.Err()
		case <-time.After(r.t.pollEvery):
		}
	}
}
