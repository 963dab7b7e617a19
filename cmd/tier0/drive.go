package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/api"
	"tier0/daemon/cluster"
)

// newDriveCmd is `tier0 drive list|fail|replace`.
func newDriveCmd(root *rootOptions) *cobra.Command {
	drv := &cobra.Command{
		Use:   "drive",
		Short: "List drives and their array membership; fail or replace a drive",
	}
	o := newClusterGroup(root, drv)
	drv.AddCommand(newDriveListCmd(o), newDriveFailCmd(o), newDriveReplaceCmd(o))
	return drv
}

func newDriveListCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List every drive: node, node state, the arrays it is a member of and its state there",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(cmd, o, clusterStatus(driveRows), printDriveRows)
		},
	}
}

// driveRow is one drive's membership in one array (a drive in no array
// has one row with an empty Array and state "unused").
type driveRow struct {
	Drive     string `json:"drive"`
	Node      string `json:"node"`
	NodeState string `json:"node_state"`
	Array     string `json:"array,omitempty"`
	State     string `json:"state"`              // the member's state, or unused
	Progress  *int   `json:"progress,omitempty"` // resync/rebuild percent while one runs
}

func driveRows(s api.Status) []driveRow {
	rows := []driveRow{}
	for _, n := range s.Nodes {
		for _, d := range n.Drives {
			found := false
			for _, a := range s.Arrays {
				for _, m := range a.Members {
					if m.Drive != d {
						continue
					}
					found = true
					r := driveRow{Drive: d, Node: n.Name, NodeState: string(n.State), Array: a.Name, State: string(m.State)}
					if inMotion(m) {
						p := m.Progress
						r.Progress = &p
					}
					rows = append(rows, r)
				}
			}
			if !found {
				rows = append(rows, driveRow{Drive: d, Node: n.Name, NodeState: string(n.State), State: "unused"})
			}
		}
	}
	return rows
}

func printDriveRows(w io.Writer, rows []driveRow) error {
	t := mgmtTable(w, "DRIVE", "NODE", "NODE STATE", "ARRAY", "STATE", "PROGRESS")
	var out [][]any
	for _, r := range rows {
		prog := "-"
		if r.Progress != nil {
			prog = rebuildBar(*r.Progress)
		}
		out = append(out, []any{r.Drive, r.Node, r.NodeState, orDash(r.Array), r.State, prog})
	}
	return mgmtRender(t, out)
}

// driveResult is the JSON answer of drive fail and replace.
type driveResult struct {
	Drive  string   `json:"drive"`
	Action string   `json:"action"` // fail, replace
	Result string   `json:"result"` // accepted
	Arrays []string `json:"arrays"` // arrays the drive is a member of
}

// arraysOf lists the arrays drive is a member of, and whether any node
// has the drive at all.
func arraysOf(s api.Status, drive string) (arrays []api.Array, known bool) {
	for _, n := range s.Nodes {
		known = known || slices.Contains(n.Drives, drive)
	}
	for _, a := range s.Arrays {
		if slices.ContainsFunc(a.Members, func(m cluster.MemberView) bool { return m.Drive == drive }) {
			arrays = append(arrays, a)
		}
	}
	return arrays, known
}

// failWouldLose names the arrays that failing drive would make unreadable:
// those already missing as many members as their level has parity.
func failWouldLose(arrays []api.Array, drive string) []string {
	var out []string
	for _, a := range arrays {
		lvl, err := cluster.ParseLevel(a.Level)
		if err != nil {
			continue // not a level the failover machine runs (the site validation refuses raid0/raid1)
		}
		down := 0
		for _, m := range a.Members {
			if m.Drive != drive && m.State != cluster.MemberOK {
				down++
			}
		}
		if down >= lvl.Parity() {
			out = append(out, fmt.Sprintf("%s (%s, %d other member(s) not in sync: %s)", a.Name, a.Level, down, memberList(a)))
		}
	}
	return out
}

func arrayNames(arrays []api.Array) []string {
	out := make([]string, len(arrays))
	for i, a := range arrays {
		out[i] = a.Name
	}
	return out
}

// driveFailOptions are the flags of drive fail.
type driveFailOptions struct {
	cluster *clusterOptions
	force   bool
}

func (o *driveFailOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.force, "force", false, "fail the drive even if an array becomes unreadable")
}

func newDriveFailCmd(co *clusterOptions) *cobra.Command {
	o := &driveFailOptions{cluster: co}
	cmd := &cobra.Command{
		Use:   "fail DRIVE",
		Short: "Mark a drive failed: its arrays run degraded until it is replaced",
		Long: "Mark DRIVE failed in every array it is a member of (for a drive that\n" +
			"misbehaves, or before pulling it). Refused when that would leave an array\n" +
			"with more members out of sync than its parity, unless --force.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			drive := args[0]
			c, arrays, err := driveArrays(cmd.Context(), o.cluster, drive)
			if err != nil {
				return err
			}
			if lose := failWouldLose(arrays, drive); len(lose) > 0 && !o.force {
				return fmt.Errorf("refusing to fail drive %s: array(s) %s would become unreadable; wait for their resync/rebuild (tier0 status), or give --force if the drive is dead anyway",
					drive, strings.Join(lose, "; "))
			}
			return mutateDrive(cmd, o.cluster, c, drive, "fail", arrays)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func newDriveReplaceCmd(o *clusterOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "replace DRIVE",
		Short: "Report that a failed drive was replaced: its arrays rebuild onto it",
		Long: "Tell the cluster that DRIVE (failed) has been physically replaced by a new\n" +
			"drive at the same place (same path, by-id or serial in the site\n" +
			"configuration, restart that node's tier0d if the path changed): every\n" +
			"array it is a member of rebuilds onto it. Watch with `tier0 status`.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, arrays, err := driveArrays(cmd.Context(), o, args[0])
			if err != nil {
				return err
			}
			return mutateDrive(cmd, o, c, args[0], "replace", arrays)
		},
	}
}

// driveArrays connects and lists the arrays drive is a member of; a drive
// that no node has is an error.
func driveArrays(ctx context.Context, o *clusterOptions, drive string) (*clusterConn, []api.Array, error) {
	c, err := o.connect()
	if err != nil {
		return nil, nil, err
	}
	s, err := c.status(ctx)
	if err != nil {
		return nil, nil, err
	}
	arrays, known := arraysOf(s, drive)
	if !known {
		return nil, nil, fmt.Errorf("drive %q is on no node of the cluster (%w); see `tier0 drive list`", drive, api.ErrNotFound)
	}
	return c, arrays, nil
}

func mutateDrive(cmd *cobra.Command, o *clusterOptions, c *clusterConn, drive, action string, arrays []api.Array) error {
	ctx := cmd.Context()
	err := c.call(ctx, func(cl *api.Client) error {
		if action == "fail" {
			return cl.FailDrive(ctx, drive)
		}
		return cl.ReplaceDrive(ctx, drive)
	})
	if errors.Is(err, api.ErrNotFound) {
		return fmt.Errorf("%w; see `tier0 drive list`", err)
	}
	if err != nil {
		return err
	}
	res := driveResult{Drive: drive, Action: action, Result: "accepted", Arrays: arrayNames(arrays)}
	if o.root.json {
		return mgmtJSON(cmd.OutOrStdout(), res)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "%s of drive %s accepted; arrays with it: %s\n", action, drive, orDash(strings.Join(res.Arrays, ", ")))
	if action == "fail" {
		fmt.Fprintln(w, "they run degraded until it is replaced: swap the drive, then `tier0 drive replace "+drive+"`")
	} else {
		fmt.Fprintln(w, "they rebuild onto it; watch the progress with `tier0 status`")
	}
	return nil
}
