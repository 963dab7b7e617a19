package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
)

// newStatusCmd is `tier0 status`: the cluster at a glance.
func newStatusCmd(root *rootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster at a glance: coordinator, nodes, arrays, rebuild progress",
		Long: "Show the cluster as the first node that answers sees it: the coordinator,\n" +
			"every node with its state, every array with owner, epoch, state, phase and\n" +
			"members, and a progress bar for every member being resynced or rebuilt.\n" +
			"With --json: the API's /v1/status object.",
		Args: cobra.NoArgs,
	}
	o := newClusterGroup(root, cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return show(cmd, o, clusterStatus(func(s api.Status) api.Status { return s }), printStatus)
	}
	return cmd
}

func printStatus(w io.Writer, s api.Status) error {
	fmt.Fprintf(w, "cluster view from node %s at %s: coordinator %s, %s's lease %s\n\n",
		s.Node, s.Time.UTC().Format(time.RFC3339), orDash(s.Coordinator), s.Node, s.Lease)
	if err := printNodes(w, s.Nodes); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := printArrays(w, s.Arrays); err != nil {
		return err
	}
	if rb := rebuildLines(s.Arrays); len(rb) > 0 {
		fmt.Fprintln(w, "\nresync/rebuild:")
		for _, l := range rb {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if pl := problemLines(s.Arrays, s.Owners); len(pl) > 0 {
		fmt.Fprintln(w, "\nproblems:")
		for _, l := range pl {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if sl := scrubLines(s.Owners); len(sl) > 0 {
		fmt.Fprintln(w, "\nscrub:")
		for _, l := range sl {
			fmt.Fprintln(w, "  "+l)
		}
	}
	fmt.Fprintln(w, "\n"+statusSummary(s))
	return nil
}

// problemLines says why arrays are failed or offline, what the last
// refused or failed action was (the coordinator retries it with backoff),
// and what the owners' RAID engines report, e.g.
// "array a  failed: raid5 lost 2 of 3 members (B1, C1): ...".
func problemLines(arrays []api.Array, owners []api.OwnerReport) []string {
	var out []string
	for _, a := range arrays {
		if a.Reason != "" {
			out = append(out, fmt.Sprintf("array %s  %s: %s", a.Name, a.State, a.Reason))
		}
		if a.LastError != "" {
			tries := ""
			if a.Failures > 1 {
				tries = fmt.Sprintf(" (%d attempts, retried with backoff)", a.Failures)
			}
			out = append(out, fmt.Sprintf("array %s  last error%s: %s", a.Name, tries, a.LastError))
		}
	}
	for _, o := range owners {
		switch {
		case o.Failed:
			out = append(out, fmt.Sprintf("array %s  failed on its owner %s (epoch %d), not served: %s", o.Array, o.Owner, o.Epoch, orDash(o.Reason)))
		case o.Reason != "" && o.State != "optimal":
			out = append(out, fmt.Sprintf("array %s  %s on its owner %s: %s", o.Array, o.State, o.Owner, o.Reason))
		}
	}
	return out
}

// scrubLines: the current or last scrub of each array, e.g.
// "array a  last scrub 2026-11-29T17:00:00Z (owner A): 2 mismatches, 0 repaired, stripes 17 40".
func scrubLines(owners []api.OwnerReport) []string {
	var out []string
	for _, o := range owners {
		sc := o.Scrub
		if sc == nil || sc.Started.IsZero() {
			continue
		}
		if sc.Running {
			out = append(out, fmt.Sprintf("array %s  scrub running since %s (owner %s)", o.Array, sc.Started.UTC().Format(time.RFC3339), o.Owner))
			continue
		}
		l := fmt.Sprintf("array %s  last scrub %s (owner %s): %d mismatches, %d repaired", o.Array, sc.Finished.UTC().Format(time.RFC3339), o.Owner, sc.Mismatches, sc.Repaired)
		if len(sc.Stripes) > 0 {
			var st []string
			for _, n := range sc.Stripes {
				st = append(st, strconv.FormatInt(n, 10))
			}
			l += ", stripes " + strings.Join(st, " ")
		}
		if sc.Error != "" {
			l += "; stopped early: " + sc.Error
		}
		out = append(out, l)
	}
	return out
}

// rebuildLines: one line per member being brought back in sync, e.g.
// "array C  member B3 (node B)  rebuilding  [#####.....] 52%".
func rebuildLines(arrays []api.Array) []string {
	var out []string
	for _, a := range arrays {
		for _, m := range a.Members {
			if inMotion(m) {
				out = append(out, fmt.Sprintf("array %s  member %s (node %s)  %-10s  %s", a.Name, m.Drive, m.Node, m.State, rebuildBar(m.Progress)))
			}
		}
	}
	return out
}

// statusSummary: "5 nodes: 4 up, 1 down; 5 arrays: 4 degraded, 1 optimal".
func statusSummary(s api.Status) string {
	count := func(keys []string) string {
		n := map[string]int{}
		var order []string
		for _, k := range keys {
			if n[k] == 0 {
				order = append(order, k)
			}
			n[k]++
		}
		parts := make([]string, len(order))
		for i, k := range order {
			parts[i] = strconv.Itoa(n[k]) + " " + k
		}
		return strings.Join(parts, ", ")
	}
	var ns, as []string
	for _, n := range s.Nodes {
		st := string(n.State)
		if n.Draining {
			st += " (draining)"
		}
		ns = append(ns, st)
	}
	for _, a := range s.Arrays {
		as = append(as, string(a.State))
	}
	out := fmt.Sprintf("%d nodes", len(s.Nodes))
	if len(ns) > 0 {
		out += ": " + count(ns)
	}
	out += fmt.Sprintf("; %d arrays", len(s.Arrays))
	if len(as) > 0 {
		out += ": " + count(as)
	}
	return out
}

func printNodes(w io.Writer, nodes []cluster.NodeView) error {
	t := mgmtTable(w, "NODE", "DOMAIN", "STATE", "DRAINING", "DRIVES", "OWNS")
	var rows [][]any
	for _, n := range nodes {
		state := string(n.State)
		if n.Suspect {
			state += " (suspect)"
		}
		rows = append(rows, []any{n.Name, orDash(n.Domain), state, yesNo(n.Draining), orDash(strings.Join(n.Drives, " ")), orDash(strings.Join(n.Owns, " "))})
	}
	return mgmtRender(t, rows)
}

func printArrays(w io.Writer, arrays []api.Array) error {
	t := mgmtTable(w, "ARRAY", "LEVEL", "HOME", "OWNER", "EPOCH", "STATE", "PHASE", "MEMBERS")
	var rows [][]any
	for _, a := range arrays {
		rows = append(rows, []any{a.Name, a.Level, a.Home, orDash(a.Owner), a.Epoch, string(a.State), a.Phase, memberList(a)})
	}
	return mgmtRender(t, rows)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
